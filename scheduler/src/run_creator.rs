//! Creates runs in groups. Every new run (a cron fire, an API trigger, a backfill slot) is handed
//! to one task; the runs that arrive while a group is being written form the next group, which is
//! one transaction (`Store::create_runs`): one commit, one fsync on a durable store, instead of
//! one per run. A lone trigger still goes out at once; a burst shares the cost.

use std::sync::Arc;

use ax_store::{NewRun, RunRecord, Store, StoreError};
use tokio::sync::{mpsc, oneshot};

/// Runs per transaction at most.
const MAX_GROUP: usize = 128;

type Created = Result<(RunRecord, bool), StoreError>;

struct Request {
    run: NewRun,
    reply: oneshot::Sender<Created>,
}

/// The handle through which a node creates runs.
#[derive(Clone)]
pub struct RunCreator {
    store: Arc<dyn Store>,
    requests: mpsc::Sender<Request>,
}

impl RunCreator {
    /// Starts the task that writes the groups; it ends when the last handle is dropped.
    pub fn start(store: Arc<dyn Store>) -> RunCreator {
        let (requests, inbox) = mpsc::channel(4 * MAX_GROUP);
        tokio::spawn(write_groups(store.clone(), inbox));
        RunCreator { store, requests }
    }

    /// Creates `run` as `Store::create_run` does: returns the run and whether it is new (a run
    /// with the same dedup or idempotency key is returned as it is).
    pub async fn create(&self, run: NewRun) -> Created {
        let (reply, answer) = oneshot::channel();
        let request = Request {
            run: run.clone(),
            reply,
        };
        if self.requests.send(request).await.is_ok()
            && let Ok(created) = answer.await
        {
            return created;
        }
        // The group task is gone (the node is stopping): create the run alone.
        self.store.create_run(&run).await
    }
}

async fn write_groups(store: Arc<dyn Store>, mut inbox: mpsc::Receiver<Request>) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    while inbox.recv_many(&mut group, MAX_GROUP).await > 0 {
        let runs: Vec<NewRun> = group.iter().map(|request| request.run.clone()).collect();
        match store.create_runs(&runs).await {
            Ok(created) => {
                for (request, created) in group.drain(..).zip(created) {
                    let _ = request.reply.send(Ok(created));
                }
            }
            Err(error) if group.len() == 1 => {
                if let Some(request) = group.pop() {
                    let _ = request.reply.send(Err(error));
                }
            }
            // One bad run (its workflow version deleted meanwhile, say) must not fail the others:
            // each is tried alone, for its own answer.
            Err(error) => {
                tracing::debug!(%error, runs = group.len(), "creating a group of runs failed; creating them one by one");
                for request in group.drain(..) {
                    let created = store.create_run(&request.run).await;
                    let _ = request.reply.send(created);
                }
            }
        }
    }
}
