//! How a node stops, in order, in one place. Each step's reason:
//!
//! 1. **The server stops accepting, and the loops that decide stop** (dispatcher, cron,
//!    backstop, spread, retention, deadlines, sub-workflows, the auth failures' and worker refusals' flushers, the TLS
//!    reloader): nothing new is started once the node is going.
//! 2. **Worker streams end**: their senders are dropped, so the server, which waits for open
//!    streams, can stop; workers reconnect to another node.
//! 3. **The server stops** (open requests finish), within [`SERVER_GRACE`]; past it the node
//!    drains anyway.
//! 4. **The queues drain into the store**: reports, log lines, spans, new runs, audit rows,
//!    workers' rows, each written before its task ends, so nothing a worker was acknowledged
//!    is lost; the services' own tasks (streams, log followers) end. Alerts raised meanwhile
//!    still go out, within [`ALERTS_GRACE`].
//! 5. **The lease is given up last**: until then no other node takes this node's id, so no one
//!    judges its workers while its reports are still being stored.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::alerts::Alerter;
use crate::connections::Connections;
use crate::registry::Registry;

/// How long the server may take to stop before the queues drain anyway.
pub const SERVER_GRACE: Duration = Duration::from_secs(10);
/// How long alerts raised while the queues drain may take to go out.
pub const ALERTS_GRACE: Duration = Duration::from_secs(5);

/// What stops, in order: the tokens each part of the node runs until, and what the steps wait
/// for.
pub struct Shutdown {
    /// Step 1: the server and the loops that decide run until it.
    pub serving: CancellationToken,
    /// Step 4: the queues (and the services' tasks) run until it, then drain.
    pub draining: CancellationToken,
    /// Step 5: the lease is renewed until it.
    pub lease: CancellationToken,
    /// Every task of the node but the lease's.
    pub tasks: TaskTracker,
    /// The lease's task: it outlives the others (step 5).
    pub lease_task: tokio::task::JoinHandle<()>,
    pub registry: Arc<Registry>,
    pub connections: Connections,
    pub alerter: Alerter,
}

impl Shutdown {
    /// Stops the node, step by step (see the module doc).
    pub async fn run(self) {
        self.serving.cancel();
        self.registry.disconnect_all();
        if tokio::time::timeout(SERVER_GRACE, self.connections.closed())
            .await
            .is_err()
        {
            tracing::warn!("the gRPC server did not stop within 10 s; draining anyway");
        }
        self.draining.cancel();
        self.tasks.close();
        let (alerts, ()) = tokio::join!(self.alerter.shutdown(ALERTS_GRACE), self.tasks.wait());
        if alerts.failed > 0 {
            tracing::warn!(failed = alerts.failed, "some alerts could not be delivered");
        }
        self.lease.cancel();
        if let Err(err) = self.lease_task.await {
            tracing::warn!(error = %err, "the lease task ended abnormally");
        }
    }
}
