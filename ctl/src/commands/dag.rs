//! `axctl dag WORKFLOW [-o ascii|dot|mermaid|json|yaml] [--run RUN] [--version N]`

use std::io::IsTerminal;

use anyhow::Context;
use ax_core::render::{self, Graph, NodeState};
use ax_proto::v1 as pb;

use crate::client::Ctx;
use crate::output::{self, Output};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The workflow whose task graph to print.
    pub workflow: String,
    /// Colour the tasks by their state in this run.
    #[arg(long = "run", value_name = "RUN_ID")]
    pub run: Option<i64>,
    /// A version other than the latest (or the run's).
    #[arg(long)]
    pub version: Option<u32>,
}

pub async fn run(ctx: &Ctx, args: Args) -> anyhow::Result<()> {
    let mut client = ctx.connect().await?;
    let request = pb::GetDagRequest {
        workflow: args.workflow,
        version: args.version.unwrap_or(0),
        run_id: args.run.unwrap_or(0),
        ..Default::default()
    };
    let dag = client
        .get_dag(request)
        .await
        .map_err(|status| ctx.status(status))?
        .into_inner();
    let mut graph = graph(&dag)?;
    // Colours only for a person at a terminal who did not ask for none (https://no-color.org).
    let color = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let text = match ctx.output {
        Output::Table | Output::Ascii => {
            // The tree's colours are axctl's own escape sequences, so it goes out as it is,
            // its names (the callers') escaped beforehand.
            if !output::raw() {
                graph.workflow = output::escape(&graph.workflow).into_owned();
                for node in &mut graph.nodes {
                    node.task = output::escape(&node.task).into_owned();
                }
            }
            return output::write_stdout_as_is(&render::ascii(&graph, color));
        }
        Output::Dot => render::dot(&graph),
        Output::Mermaid => render::mermaid(&graph),
        Output::Json => render::json(&graph),
        Output::Yaml => {
            let value: serde_json::Value =
                serde_json::from_str(&render::json(&graph)).context("cannot encode the graph")?;
            output::to_yaml(&value)?
        }
    };
    output::write_stdout(&text)
}

/// The API's graph back in the renderer's terms.
pub fn graph(dag: &pb::Dag) -> anyhow::Result<Graph> {
    let tasks: Vec<(String, Vec<String>)> = dag
        .nodes
        .iter()
        .map(|node| (node.task.clone(), node.upstream.clone()))
        .collect();
    let mut graph = Graph::from_upstreams(&dag.workflow, dag.version, &tasks);
    graph.run_id = (dag.run_id > 0).then_some(dag.run_id);
    for (node, message) in graph.nodes.iter_mut().zip(&dag.nodes) {
        if !message.state.is_empty() {
            node.state = Some(NodeState::parse_label(&message.state).with_context(|| {
                format!(
                    "the server sent an unknown state {:?} for task {}",
                    message.state, message.task
                )
            })?);
        }
        node.instance_id = (message.instance_id > 0).then_some(message.instance_id);
    }
    Ok(graph)
}
