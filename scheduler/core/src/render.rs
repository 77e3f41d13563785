//! A workflow's task graph, optionally with each task's state in one run, rendered for people
//! and programs: an ASCII tree for the terminal, Graphviz `dot`, a mermaid `flowchart TD`, and
//! JSON. Pure: the caller gathers the tasks, edges and states; the web UI gets the same graph
//! over the API (`GetDag`).
//!
//! The ASCII tree prints every task once. A task reached again (a fan-in: several upstreams)
//! is printed as `name (see above)` at its later places, so a diamond reads as a tree and a
//! wide fan-in costs one line per edge, never a copy of its subtree.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::dag::topological_positions;
use crate::spec::{Handler, TaskSpec};
use crate::state::InstanceState;
use crate::trigger_rule::TriggerRule;

/// A task's state in a run, as the graph shows it (see [`crate::task_status`]).
pub use crate::task_status::TaskStatus as NodeState;

/// A fill colour for dot and mermaid: green done, red failed, blue on a worker, yellow waiting,
/// grey cancelled or never to run, white not yet created (or pending a rerun).
fn fill(state: NodeState) -> &'static str {
    match state {
        NodeState::Instance(InstanceState::Success) => "#b7e4b7",
        NodeState::Instance(InstanceState::Failed) => "#f4a6a6",
        NodeState::Instance(InstanceState::Timeout) => "#f7c08a",
        NodeState::Instance(InstanceState::Running) => "#a8d1f7",
        NodeState::Instance(InstanceState::Dispatched) => "#cfe3f7",
        NodeState::Instance(InstanceState::Waiting) => "#fff3b0",
        NodeState::Instance(InstanceState::Cancelled) => "#d9d9d9",
        NodeState::Instance(InstanceState::Skipped) => "#eeeeee",
        NodeState::Instance(InstanceState::UpstreamFailed) => "#e8c8c8",
        NodeState::Pending | NodeState::Instance(InstanceState::Pending) => "#ffffff",
    }
}

/// An ANSI SGR colour for the terminal tree.
fn ansi(state: NodeState) -> &'static str {
    match state {
        NodeState::Instance(InstanceState::Success) => "32",
        NodeState::Instance(InstanceState::Failed) => "31",
        NodeState::Instance(InstanceState::Timeout) => "31",
        NodeState::Instance(InstanceState::Running) => "34",
        NodeState::Instance(InstanceState::Dispatched) => "36",
        NodeState::Instance(InstanceState::Waiting) => "33",
        NodeState::Instance(InstanceState::Cancelled) => "90",
        NodeState::Instance(InstanceState::Skipped) => "90",
        NodeState::Instance(InstanceState::UpstreamFailed) => "35",
        NodeState::Pending | NodeState::Instance(InstanceState::Pending) => "2",
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphNode {
    pub task: String,
    /// Set when the graph shows a run.
    pub state: Option<NodeState>,
    /// The task's instance in the run, when it has one.
    pub instance_id: Option<i64>,
    /// Judges the state of a task without an instance.
    pub rule: TriggerRule,
    /// The handler list the task belongs to; `None` for a task of the graph.
    pub handler: Option<Handler>,
}

/// Tasks and their edges. `edges` are (upstream, downstream) indexes into `nodes`, listed by
/// downstream task in file order, then in the order the task names its upstreams.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Graph {
    pub workflow: String,
    pub version: u32,
    /// The run whose states the nodes carry.
    pub run_id: Option<i64>,
    pub nodes: Vec<GraphNode>,
    pub edges: Vec<(usize, usize)>,
}

/// One task's instance in a run, as [`Graph::apply_run`] needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInstance {
    pub task: String,
    pub instance_id: i64,
    pub state: InstanceState,
    /// Set on a shard of a `sharded_broadcast` task (its parent instance): a shard never
    /// stands for its task, the parent does.
    pub shard_of: Option<i64>,
}

impl Graph {
    /// The graph of a validated workflow's tasks. An upstream that names no task is skipped
    /// (validation refuses it before a spec is stored).
    pub fn from_tasks(workflow: &str, version: u32, tasks: &[TaskSpec]) -> Graph {
        let nodes: Vec<(String, Vec<String>)> = tasks
            .iter()
            .map(|task| (task.name.clone(), task.upstream.clone()))
            .collect();
        let mut graph = Graph::from_upstreams(workflow, version, &nodes);
        for (node, task) in graph.nodes.iter_mut().zip(tasks) {
            node.rule = task.trigger_rule;
            node.handler = task.handler;
        }
        graph
    }

    /// The graph of tasks given with their upstream names, in file order.
    pub fn from_upstreams(workflow: &str, version: u32, tasks: &[(String, Vec<String>)]) -> Graph {
        let index: HashMap<&str, usize> = tasks
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.as_str(), i))
            .collect();
        let mut edges = Vec::new();
        for (d, (_, upstream)) in tasks.iter().enumerate() {
            for up in upstream {
                if let Some(&u) = index.get(up.as_str()) {
                    edges.push((u, d));
                }
            }
        }
        Graph {
            workflow: workflow.to_string(),
            version,
            run_id: None,
            nodes: tasks
                .iter()
                .map(|(name, _)| GraphNode {
                    task: name.clone(),
                    state: None,
                    instance_id: None,
                    rule: TriggerRule::default(),
                    handler: None,
                })
                .collect(),
            edges,
        }
    }

    /// Gives every node its state in run `run_id`: its instance's (the latest one when a task
    /// has several; shards are skipped, the parent stands for a sharded task), else what its rule already decides
    /// (`task_status::without_instance`), else `Pending`. Instances of tasks the graph does not have are ignored.
    pub fn apply_run(&mut self, run_id: i64, instances: &[RunInstance]) {
        self.run_id = Some(run_id);
        let index: HashMap<&str, usize> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| (node.task.as_str(), i))
            .collect();
        let mut found: Vec<Option<(i64, InstanceState)>> = vec![None; self.nodes.len()];
        for instance in instances.iter().filter(|i| i.shard_of.is_none()) {
            if let Some(&i) = index.get(instance.task.as_str())
                && found[i].is_none_or(|(id, _)| id < instance.instance_id)
            {
                found[i] = Some((instance.instance_id, instance.state));
            }
        }
        let upstream = self.upstream_lists();
        for i in self.topological_order(&upstream) {
            // A PENDING instance (waiting to rerun) shows like a task without one.
            let own = found[i]
                .map(|(_, state)| state)
                .filter(|state| *state != InstanceState::Pending);
            let state = match own {
                Some(state) => NodeState::Instance(state),
                None => crate::task_status::without_instance(
                    self.nodes[i].rule,
                    upstream[i].iter().filter_map(|&u| self.nodes[u].state),
                ),
            };
            self.nodes[i].state = Some(state);
            self.nodes[i].instance_id = found[i].map(|(id, _)| id);
        }
    }

    fn upstream_lists(&self) -> Vec<Vec<usize>> {
        let mut lists = vec![Vec::new(); self.nodes.len()];
        for &(u, d) in &self.edges {
            lists[d].push(u);
        }
        lists
    }

    /// Downstream indexes per node, in file order of the downstream task.
    fn downstream_lists(&self) -> Vec<Vec<usize>> {
        let mut lists = vec![Vec::new(); self.nodes.len()];
        for &(u, d) in &self.edges {
            lists[u].push(d);
        }
        for list in &mut lists {
            list.sort_unstable();
            list.dedup();
        }
        lists
    }

    /// Node indexes with every task after its upstreams: the [`crate::dag::Dag`]'s order (file
    /// order for a graph that is not a DAG, which no validated spec makes).
    fn topological_order(&self, upstream: &[Vec<usize>]) -> Vec<usize> {
        let tasks: Vec<TaskSpec> = self
            .nodes
            .iter()
            .zip(upstream)
            .map(|(node, ups)| {
                // An upstream listed twice (which a spec refuses) is one edge for the order.
                let mut ups = ups.clone();
                ups.sort_unstable();
                ups.dedup();
                TaskSpec {
                    name: node.task.clone(),
                    upstream: ups.iter().map(|&u| self.nodes[u].task.clone()).collect(),
                    ..TaskSpec::default()
                }
            })
            .collect();
        topological_positions(&tasks)
    }
}

/// Indentation stops growing past this depth, so a long chain of tasks prints in linear space.
const MAX_INDENT_DEPTH: usize = 40;

/// The terminal tree: each root (file order) with its downstream tasks below it. With `color`,
/// states are ANSI-coloured (callers pass it only when stdout is a terminal).
pub fn ascii(graph: &Graph, color: bool) -> String {
    let downstream = graph.downstream_lists();
    let has_upstream = {
        let mut has = vec![false; graph.nodes.len()];
        for &(_, d) in &graph.edges {
            has[d] = true;
        }
        has
    };
    let mut out = String::new();
    let mut printed = vec![false; graph.nodes.len()];
    // Roots first; then anything a cycle kept unreachable (never in a validated graph).
    let starts = (0..graph.nodes.len())
        .filter(|&i| !has_upstream[i])
        .chain(0..graph.nodes.len());
    for start in starts {
        if printed[start] {
            continue;
        }
        // (node, this line's prefix, its children's prefix, depth): an explicit stack, so a
        // deep chain cannot overflow the call stack.
        let mut stack: Vec<(usize, String, String, usize)> =
            vec![(start, String::new(), String::new(), 0)];
        while let Some((i, line_prefix, child_prefix, depth)) = stack.pop() {
            out.push_str(&line_prefix);
            push_label(&mut out, &graph.nodes[i], color);
            if printed[i] {
                out.push_str(" (see above)\n");
                continue;
            }
            printed[i] = true;
            out.push('\n');
            let children = &downstream[i];
            for (k, &child) in children.iter().enumerate().rev() {
                let last = k + 1 == children.len();
                let line = format!("{child_prefix}{}", if last { "└─ " } else { "├─ " });
                let below = if depth + 1 >= MAX_INDENT_DEPTH {
                    child_prefix.clone()
                } else {
                    format!("{child_prefix}{}", if last { "   " } else { "│  " })
                };
                stack.push((child, line, below, depth + 1));
            }
        }
    }
    out
}

fn push_label(out: &mut String, node: &GraphNode, color: bool) {
    out.push_str(&node.task);
    if let Some(state) = node.state {
        if color {
            let _ = write!(out, " [\x1b[{}m{}\x1b[0m]", ansi(state), state.label());
        } else {
            let _ = write!(out, " [{}]", state.label());
        }
    }
}

fn dot_quote(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\n' => quoted.push_str("\\n"),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

/// Graphviz: `dot -Tsvg`. With states, nodes are filled by state and labelled `task\nSTATE`.
pub fn dot(graph: &Graph) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "digraph {} {{", dot_quote(&graph.workflow));
    out.push_str("  rankdir=TB;\n");
    out.push_str("  node [shape=box, style=\"rounded\", fontname=\"Helvetica\"];\n");
    for node in &graph.nodes {
        match node.state {
            Some(state) => {
                let label = format!("{}\n{}", node.task, state.label());
                let _ = writeln!(
                    out,
                    "  {} [label={}, style=\"rounded,filled\", fillcolor=\"{}\"];",
                    dot_quote(&node.task),
                    dot_quote(&label),
                    fill(state)
                );
            }
            None => {
                let _ = writeln!(out, "  {};", dot_quote(&node.task));
            }
        }
    }
    for &(u, d) in &graph.edges {
        let _ = writeln!(
            out,
            "  {} -> {};",
            dot_quote(&graph.nodes[u].task),
            dot_quote(&graph.nodes[d].task)
        );
    }
    out.push_str("}\n");
    out
}

fn mermaid_class(state: NodeState) -> String {
    state.label().to_ascii_lowercase()
}

/// Mermaid `flowchart TD`. Node ids are `n0`, `n1`, … (task names may contain `.` and `-`); the
/// task name is the label. With states, one `classDef` per state present.
pub fn mermaid(graph: &Graph) -> String {
    let mut out = String::from("flowchart TD\n");
    for (i, node) in graph.nodes.iter().enumerate() {
        let label = match node.state {
            Some(state) => format!("{}<br/>{}", node.task, state.label()),
            None => node.task.clone(),
        };
        let _ = writeln!(out, "  n{i}[\"{}\"]", label.replace('"', "#quot;"));
    }
    for &(u, d) in &graph.edges {
        let _ = writeln!(out, "  n{u} --> n{d}");
    }
    let mut states: Vec<NodeState> = Vec::new();
    for state in graph.nodes.iter().filter_map(|node| node.state) {
        if !states.contains(&state) {
            states.push(state);
        }
    }
    for state in &states {
        let _ = writeln!(
            out,
            "  classDef {} fill:{},stroke:#333,color:#000",
            mermaid_class(*state),
            fill(*state)
        );
    }
    for state in &states {
        let members: Vec<String> = graph
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.state == Some(*state))
            .map(|(i, _)| format!("n{i}"))
            .collect();
        let _ = writeln!(
            out,
            "  class {} {}",
            members.join(","),
            mermaid_class(*state)
        );
    }
    out
}

#[derive(Serialize)]
struct JsonGraph<'a> {
    workflow: &'a str,
    version: u32,
    run_id: Option<i64>,
    nodes: Vec<JsonNode<'a>>,
    edges: Vec<JsonEdge<'a>>,
}

#[derive(Serialize)]
struct JsonNode<'a> {
    task: &'a str,
    state: Option<&'static str>,
    instance_id: Option<i64>,
    upstream: Vec<&'a str>,
}

#[derive(Serialize)]
struct JsonEdge<'a> {
    from: &'a str,
    to: &'a str,
}

/// JSON: `{workflow, version, run_id, nodes: [{task, state, instance_id, upstream}], edges:
/// [{from, to}]}`; `state`, `instance_id` and `run_id` are null without a run. One node or edge
/// per line, so a diff of two exports reads well.
pub fn json(graph: &Graph) -> String {
    let upstream = graph.upstream_lists();
    let value = JsonGraph {
        workflow: &graph.workflow,
        version: graph.version,
        run_id: graph.run_id,
        nodes: graph
            .nodes
            .iter()
            .zip(&upstream)
            .map(|(node, ups)| JsonNode {
                task: &node.task,
                state: node.state.map(NodeState::label),
                instance_id: node.instance_id,
                upstream: ups.iter().map(|&u| graph.nodes[u].task.as_str()).collect(),
            })
            .collect(),
        edges: graph
            .edges
            .iter()
            .map(|&(u, d)| JsonEdge {
                from: &graph.nodes[u].task,
                to: &graph.nodes[d].task,
            })
            .collect(),
    };
    let mut out = Vec::new();
    let mut serializer = serde_json::Serializer::with_formatter(&mut out, LineFormatter::default());
    value
        .serialize(&mut serializer)
        .expect("a graph of strings and integers always encodes");
    out.push(b'\n');
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// A standalone SVG drawing of the whole graph at `layout`'s places: boxes named by task (and
/// state, with a run), edges as curves from a box's right side to the next box's left side.
/// Every name is XML-escaped.
pub fn svg(graph: &Graph, layout: &crate::layout::Layout) -> String {
    use crate::layout::{NODE_HEIGHT, NODE_WIDTH};
    let margin = 16.0;
    let (width, height) = (layout.width + 2.0 * margin, layout.height + 2.0 * margin);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" \
         viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"Helvetica, Arial, sans-serif\" \
         font-size=\"13\">"
    );
    let _ = writeln!(out, "<title>{}</title>", xml_escape(&graph.workflow));
    let _ = writeln!(
        out,
        "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>"
    );
    let _ = writeln!(
        out,
        "<g transform=\"translate({margin},{margin})\" fill=\"none\" stroke=\"#8a8f98\">"
    );
    for &(u, d) in &graph.edges {
        let (Some(from), Some(to)) = (layout.nodes.get(u), layout.nodes.get(d)) else {
            continue;
        };
        let (x1, y1) = (from.x + NODE_WIDTH / 2.0, from.y);
        let (x2, y2) = (to.x - NODE_WIDTH / 2.0, to.y);
        let bend = (x2 - x1).abs() / 2.0;
        let _ = writeln!(
            out,
            "<path d=\"M{x1:.1},{y1:.1} C{:.1},{y1:.1} {:.1},{y2:.1} {x2:.1},{y2:.1}\"/>",
            x1 + bend,
            x2 - bend
        );
    }
    out.push_str("</g>\n");
    let _ = writeln!(out, "<g transform=\"translate({margin},{margin})\">");
    for (node, place) in graph.nodes.iter().zip(&layout.nodes) {
        let fill_colour = node.state.map(fill).unwrap_or("#ffffff");
        let (x, y) = (place.x - NODE_WIDTH / 2.0, place.y - NODE_HEIGHT / 2.0);
        let _ = writeln!(
            out,
            "<g><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{NODE_WIDTH}\" height=\"{NODE_HEIGHT}\" \
             rx=\"6\" fill=\"{fill_colour}\" stroke=\"#333333\"/>"
        );
        let name = xml_escape(&node.task);
        match node.state {
            Some(state) => {
                let _ = writeln!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\">{name}</text><text x=\"{:.1}\" y=\"{:.1}\" \
                     font-size=\"11\">{}</text></g>",
                    x + 10.0,
                    y + 18.0,
                    x + 10.0,
                    y + 34.0,
                    state.label()
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "<text x=\"{:.1}\" y=\"{:.1}\">{name}</text></g>",
                    x + 10.0,
                    y + 27.0
                );
            }
        }
    }
    out.push_str("</g>\n</svg>\n");
    out
}

fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // XML 1.0 has no way to write most control characters.
            c if (c as u32) < 0x20 && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// The layout of [`json`]: the graph object and its two lists one entry a line, indented by
/// two spaces a level; each node and edge on its line as `{"key": value, ...}`. Control
/// characters are escaped as `\uXXXX` except `\n`, `\r` and `\t`.
#[derive(Default)]
struct LineFormatter {
    /// Open objects and arrays.
    depth: usize,
    /// Whether the innermost open container has an entry.
    has_value: bool,
}

impl LineFormatter {
    /// Containers at these depths put each entry on its own line.
    const LINE_DEPTH: usize = 2;

    fn begin<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        open: &[u8],
    ) -> std::io::Result<()> {
        self.depth += 1;
        self.has_value = false;
        writer.write_all(open)
    }

    fn end<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        close: &[u8],
    ) -> std::io::Result<()> {
        let lines = self.depth <= Self::LINE_DEPTH;
        self.depth -= 1;
        if lines && self.has_value {
            writer.write_all(b"\n")?;
            writer.write_all(&b"  ".repeat(self.depth))?;
        }
        writer.write_all(close)
    }

    fn entry<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if self.depth <= Self::LINE_DEPTH {
            writer.write_all(if first { b"\n" } else { b",\n" })?;
            writer.write_all(&b"  ".repeat(self.depth))
        } else if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }
}

impl serde_json::ser::Formatter for LineFormatter {
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.begin(writer, b"[")
    }

    fn end_array<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.end(writer, b"]")
    }

    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.entry(writer, first)
    }

    fn end_array_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn begin_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.begin(writer, b"{")
    }

    fn end_object<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        self.end(writer, b"}")
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.entry(writer, first)
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        writer.write_all(b": ")
    }

    fn end_object_value<W: ?Sized + std::io::Write>(&mut self, _: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }

    fn write_char_escape<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        char_escape: serde_json::ser::CharEscape,
    ) -> std::io::Result<()> {
        use serde_json::ser::CharEscape;
        match char_escape {
            CharEscape::Backspace => writer.write_all(b"\\u0008"),
            CharEscape::FormFeed => writer.write_all(b"\\u000c"),
            other => serde_json::ser::CompactFormatter.write_char_escape(writer, other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_svg_draws_every_task_and_edge_and_escapes_names() {
        let mut graph = Graph::from_upstreams(
            "<b>wf</b>",
            1,
            &[task("a&b", &[]), task("<script>", &["a&b"])],
        );
        graph.apply_run(
            1,
            &[RunInstance {
                task: "a&b".into(),
                instance_id: 1,
                state: InstanceState::Failed,
                shard_of: None,
            }],
        );
        let layout = crate::layout::layout(graph.nodes.len(), &graph.edges).unwrap();
        let svg = svg(&graph, &layout);
        assert!(
            svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""),
            "{svg}"
        );
        assert_eq!(svg.matches("<rect x=").count(), 2);
        assert_eq!(svg.matches("<path ").count(), 1);
        assert!(svg.contains(">a&amp;b</text>") && svg.contains(">&lt;script&gt;</text>"));
        assert!(svg.contains("<title>&lt;b&gt;wf&lt;/b&gt;</title>"));
        assert!(svg.contains(">FAILED</text>") && svg.contains(">UPSTREAM_FAILED</text>"));
        assert!(!svg.contains("<script>") && !svg.contains("<b>"));
    }

    fn task(name: &str, upstream: &[&str]) -> (String, Vec<String>) {
        (
            name.to_string(),
            upstream.iter().map(|s| s.to_string()).collect(),
        )
    }

    /// extract → {clean, audit} → load, and a lone `report` after `load`.
    fn diamond() -> Graph {
        Graph::from_upstreams(
            "etl",
            3,
            &[
                task("extract", &[]),
                task("clean", &["extract"]),
                task("audit", &["extract"]),
                task("load", &["clean", "audit"]),
                task("report", &["load"]),
            ],
        )
    }

    /// Two roots; `a` fans out to three tasks, `b` feeds the last of them.
    fn fan_out() -> Graph {
        Graph::from_upstreams(
            "fan",
            1,
            &[
                task("a", &[]),
                task("b", &[]),
                task("x1", &["a"]),
                task("x2", &["a"]),
                task("x3", &["a", "b"]),
            ],
        )
    }

    fn run_diamond() -> Graph {
        let mut graph = diamond();
        let instance = |task: &str, id, state| RunInstance {
            task: task.into(),
            instance_id: id,
            state,
            shard_of: None,
        };
        graph.apply_run(
            7,
            &[
                instance("extract", 1, InstanceState::Success),
                instance("clean", 2, InstanceState::Running),
                instance("audit", 3, InstanceState::Failed),
            ],
        );
        graph
    }

    fn golden(name: &str, actual: &str) {
        let path = format!("{}/tests/golden/{name}", env!("CARGO_MANIFEST_DIR"));
        if std::env::var_os("AX_BLESS").is_some() {
            std::fs::create_dir_all(format!("{}/tests/golden", env!("CARGO_MANIFEST_DIR")))
                .unwrap();
            std::fs::write(&path, actual).unwrap();
            return;
        }
        let expected = std::fs::read_to_string(&path)
            .unwrap_or_else(|err| panic!("{path}: {err} (run with AX_BLESS=1 to create it)"));
        assert_eq!(actual, expected, "{path} differs (AX_BLESS=1 rewrites it)");
    }

    #[test]
    fn ascii_prints_a_fan_in_once_and_refers_to_it_after() {
        assert_eq!(
            ascii(&diamond(), false),
            "extract\n├─ clean\n│  └─ load\n│     └─ report\n└─ audit\n   └─ load (see above)\n"
        );
    }

    #[test]
    fn states_follow_the_run_and_upstream_failures_propagate() {
        let graph = run_diamond();
        let states: Vec<&str> = graph
            .nodes
            .iter()
            .map(|node| node.state.unwrap().label())
            .collect();
        assert_eq!(
            states,
            [
                "SUCCESS",
                "RUNNING",
                "FAILED",
                "UPSTREAM_FAILED",
                "UPSTREAM_FAILED"
            ]
        );
        assert_eq!(graph.nodes[1].instance_id, Some(2));
        assert_eq!(graph.nodes[3].instance_id, None);

        let mut pending = diamond();
        pending.apply_run(
            8,
            &[RunInstance {
                task: "extract".into(),
                instance_id: 9,
                state: InstanceState::Running,
                shard_of: None,
            }],
        );
        assert_eq!(pending.nodes[4].state, Some(NodeState::Pending));
    }

    #[test]
    fn the_latest_instance_of_a_task_wins() {
        let mut graph = Graph::from_upstreams("one", 1, &[task("t", &[])]);
        let instance = |id, state| RunInstance {
            task: "t".into(),
            instance_id: id,
            state,
            shard_of: None,
        };
        graph.apply_run(
            1,
            &[
                instance(5, InstanceState::Success),
                instance(4, InstanceState::Failed),
            ],
        );
        assert_eq!(
            graph.nodes[0].state,
            Some(NodeState::Instance(InstanceState::Success))
        );
    }

    #[test]
    fn a_sharded_task_shows_its_parent_never_a_shard() {
        let mut graph = Graph::from_upstreams("one", 1, &[task("t", &[]), task("after", &["t"])]);
        let instance = |id, state, shard_of| RunInstance {
            task: "t".into(),
            instance_id: id,
            state,
            shard_of,
        };
        graph.apply_run(
            1,
            &[
                instance(5, InstanceState::Failed, None),
                instance(6, InstanceState::Success, Some(5)),
                instance(7, InstanceState::Failed, Some(5)),
            ],
        );
        assert_eq!(
            graph.nodes[0].state,
            Some(NodeState::Instance(InstanceState::Failed))
        );
        assert_eq!(graph.nodes[0].instance_id, Some(5));
        assert_eq!(
            graph.nodes[1].state,
            Some(NodeState::Instance(InstanceState::UpstreamFailed))
        );
    }

    #[test]
    fn ascii_colours_states_only_when_asked() {
        let coloured = ascii(&run_diamond(), true);
        assert!(
            coloured.starts_with("extract [\x1b[32mSUCCESS\x1b[0m]\n"),
            "{coloured}"
        );
        assert!(!ascii(&run_diamond(), false).contains('\x1b'));
    }

    #[test]
    fn node_states_round_trip_their_names() {
        // A PENDING instance shows as the task status PENDING.
        for state in InstanceState::ALL
            .into_iter()
            .filter(|state| *state != InstanceState::Pending)
            .map(NodeState::Instance)
            .chain([NodeState::Pending])
        {
            assert_eq!(NodeState::parse_label(state.label()), Some(state));
        }
        assert_eq!(NodeState::parse_label("BOGUS"), None);
    }

    #[test]
    fn golden_files_for_every_format() {
        let cases = [
            ("diamond", diamond()),
            ("diamond_run", run_diamond()),
            ("fan_out", fan_out()),
        ];
        for (name, graph) in &cases {
            golden(&format!("{name}.txt"), &ascii(graph, false));
            golden(&format!("{name}.dot"), &dot(graph));
            golden(&format!("{name}.mmd"), &mermaid(graph));
            golden(&format!("{name}.json"), &json(graph));
        }
    }

    #[test]
    fn json_is_valid_and_carries_nodes_edges_and_states() {
        let value: serde_json::Value = serde_json::from_str(&json(&run_diamond())).unwrap();
        assert_eq!(value["run_id"], 7);
        assert_eq!(value["nodes"][3]["task"], "load");
        assert_eq!(value["nodes"][3]["state"], "UPSTREAM_FAILED");
        assert_eq!(
            value["nodes"][3]["upstream"],
            serde_json::json!(["clean", "audit"])
        );
        assert_eq!(value["edges"].as_array().unwrap().len(), 5);
        let empty: serde_json::Value =
            serde_json::from_str(&json(&Graph::from_upstreams("e", 1, &[]))).unwrap();
        assert_eq!(empty["nodes"], serde_json::json!([]));
        let odd = Graph::from_upstreams("q\"\\\n", 1, &[task("t", &[])]);
        let value: serde_json::Value = serde_json::from_str(&json(&odd)).unwrap();
        assert_eq!(value["workflow"], "q\"\\\n");
    }

    /// 10,000 tasks: a root, 9,998 in parallel, a fan-in; and a 10,000-task chain. The bound is
    /// generous (it catches quadratic blow-ups, not regressions of a few percent).
    #[test]
    fn ten_thousand_tasks_render_quickly() {
        let mut wide = vec![task("root", &[])];
        let middle: Vec<String> = (0..9_998).map(|i| format!("t{i}")).collect();
        for name in &middle {
            wide.push(task(name, &["root"]));
        }
        let refs: Vec<&str> = middle.iter().map(String::as_str).collect();
        wide.push(task("sink", &refs));
        let mut chain = vec![task("c0", &[])];
        for i in 1..10_000 {
            chain.push(task(&format!("c{i}"), &[&format!("c{}", i - 1)]));
        }
        for tasks in [wide, chain] {
            let started = std::time::Instant::now();
            let mut graph = Graph::from_upstreams("big", 1, &tasks);
            graph.apply_run(1, &[]);
            let outputs = [
                ascii(&graph, true),
                dot(&graph),
                mermaid(&graph),
                json(&graph),
            ];
            let elapsed = started.elapsed();
            assert!(
                elapsed < std::time::Duration::from_secs(3),
                "rendering 10,000 tasks took {elapsed:?}"
            );
            assert!(outputs.iter().all(|text| text.len() < 50 << 20));
            // One line per root and one per edge: a fan-in's later places are one line each.
            assert_eq!(outputs[0].lines().count(), 1 + graph.edges.len());
        }
    }
}
