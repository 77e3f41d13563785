//! The node's progress counter: bumped whenever runs, instances or logs change here, so that
//! followers (`axctl logs -f`, the web UI's live views) look again at once instead of polling.

use std::sync::Arc;

use tokio::sync::watch;

/// Bumps and watches the node's progress; clones share one counter.
#[derive(Clone)]
pub struct Progress(Arc<watch::Sender<u64>>);

impl Default for Progress {
    fn default() -> Self {
        Progress(Arc::new(watch::channel(0).0))
    }
}

impl Progress {
    pub fn new() -> Progress {
        Progress::default()
    }

    /// Something changed: followers look again.
    pub fn bump(&self) {
        self.0.send_modify(|generation| *generation += 1);
    }

    /// Changes with every bump.
    pub fn watch(&self) -> watch::Receiver<u64> {
        self.0.subscribe()
    }
}
