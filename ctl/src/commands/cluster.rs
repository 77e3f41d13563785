//! `axctl cluster`: the scheduler nodes sharing the store, judged on the store's clock.

use ax_proto::v1::{ListNodesRequest, ListNodesResponse};

use crate::client::Ctx;
use crate::output::{self, Table, time};
use crate::view::NodeView;

#[derive(Debug, clap::Args)]
pub struct Args {}

pub async fn run(ctx: &Ctx, _args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let list = client
        .list_nodes(ListNodesRequest {})
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    let views: Vec<NodeView> = list
        .nodes
        .iter()
        .map(|node| NodeView::new(node, list.store_now_ms))
        .collect();
    output::emit(ctx.output, &views, || nodes_table(&list))
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
            node.version.clone(),
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
