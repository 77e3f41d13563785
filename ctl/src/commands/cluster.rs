//! `axctl cluster`: the scheduler nodes sharing the store, judged on the store's clock, the
//! workers on each and every node's and worker's release, and the store's schema release: what
//! an operator reads through a rolling upgrade.

use ax_proto::v1::{ListNodesRequest, ListNodesResponse, ListWorkersRequest, WorkerInfo};

use crate::client::Ctx;
use crate::output::{self, Table, ago, or_dash, time, version_or_unknown};
use crate::view::{NodeView, worker_state};

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(ctx: &Ctx, _args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let list = client
        .list_nodes(ListNodesRequest {})
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    let workers = client
        .list_workers(ListWorkersRequest {})
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner()
        .workers;
    let views: Vec<NodeView> = list
        .nodes
        .iter()
        .map(|node| NodeView::new(node, &list, &workers))
        .collect();
    output::emit(ctx.output, &views, || {
        format!(
            "{}\n{}\n{}\n",
            nodes_table(&list),
            workers_table(&workers),
            schema_line(&list)
        )
    })
}

fn nodes_table(list: &ListNodesResponse) -> String {
    let mut table = Table::new(&[
        "NODE",
        "STATE",
        "ADDRESS",
        "VERSION",
        "STARTED",
        "LEASE",
        "CLOCK OFFSET",
        "WORKERS",
        "POOLS",
    ]);
    let now = list.store_now_ms;
    for node in &list.nodes {
        let lease = if node.live {
            format!(
                "renewed {} ago",
                ax_core::humane_duration(now - node.renewed_at_ms)
            )
        } else {
            format!(
                "expired {} ago",
                ax_core::humane_duration(now - node.expires_at_ms)
            )
        };
        table.row(vec![
            node.node_id.clone(),
            if node.live { "LIVE" } else { "GONE" }.to_string(),
            node.address.clone(),
            version_or_unknown(&node.version),
            time(node.started_at_ms),
            lease,
            format!("{:+} ms", node.clock_offset_ms),
            node.workers.to_string(),
            if node.pools.is_empty() {
                "-".into()
            } else {
                node.pools.clone()
            },
        ]);
    }
    table.render()
}

fn workers_table(workers: &[WorkerInfo]) -> String {
    let mut table = Table::new(&["WORKER", "STATE", "NODE", "VERSION", "RUNNING", "HEARTBEAT"]);
    for w in workers {
        table.row(vec![
            w.id.clone(),
            worker_state(w.state),
            or_dash(&w.scheduler_node),
            version_or_unknown(&w.version),
            format!("{}/{}", w.running, w.capacity),
            ago(w.last_heartbeat_ms),
        ]);
    }
    table.render()
}

/// The store's schema: which release migrated it and which may still run on it.
fn schema_line(list: &ListNodesResponse) -> String {
    if list.schema_release.is_empty() {
        return "store schema: unknown (migrated by ax 0.1.0, or this node is older than 0.2.0)"
            .into();
    }
    format!(
        "store schema: ax {} (migration {}); nodes of ax {} or later may run on it",
        list.schema_release, list.schema_migration, list.schema_oldest_release
    )
}
