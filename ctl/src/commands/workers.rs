//! `axctl workers`

use ax_proto::v1::{ListWorkersRequest, WorkerInfo};

use crate::client::Ctx;
use crate::output::{self, Table, ago, or_dash, time, version_or_unknown};
use crate::view::{WorkerView, worker_state};

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(ctx: &Ctx, _args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let list = client
        .list_workers(ListWorkersRequest {})
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    let views: Vec<WorkerView> = list.workers.iter().map(WorkerView::from).collect();
    output::emit(ctx.output, &views, || workers_table(&list.workers))
}

fn workers_table(workers: &[WorkerInfo]) -> String {
    let mut table = Table::new(&[
        "ID",
        "STATE",
        "HOST",
        "VERSION",
        "RUNNING",
        "LABELS",
        "STARTED",
        "HEARTBEAT",
        "NODE",
    ]);
    for w in workers {
        let mut labels: Vec<String> = w.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        labels.sort();
        table.row(vec![
            w.id.clone(),
            worker_state(w.state),
            or_dash(&w.hostname),
            version_or_unknown(&w.version),
            format!("{}/{}", w.running, w.capacity),
            or_dash(&labels.join(",")),
            time(w.started_at_ms),
            ago(w.last_heartbeat_ms),
            or_dash(&w.scheduler_node),
        ]);
    }
    table.render()
}
