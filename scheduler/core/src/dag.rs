//! The task graph of one workflow: edges, readiness and cycle detection.
//!
//! Edges point from an upstream task to its downstream task: `a → b` means `b` lists `a` in its
//! `upstream` and runs only after `a` succeeded. Every algorithm here is iterative (no recursion
//! over the graph), so a 10,000-task chain cannot overflow the stack, and every lookup goes through
//! a name index, so asking for the downstream of one task costs the same whatever the graph's size.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};

use crate::spec::{Handler, TaskSpec};
use crate::trigger_rule::TriggerRule;

/// Why a list of tasks is not a valid DAG. Indexes are positions in the task list (file order),
/// so the spec parser can point at the line of the offending task or upstream entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DagError {
    #[error("duplicate task name \"{name}\" (task {index}, first defined as task {first_index})")]
    DuplicateTask {
        name: String,
        index: usize,
        first_index: usize,
    },
    #[error("task \"{task}\" has unknown upstream \"{upstream}\"")]
    UnknownUpstream {
        task: String,
        upstream: String,
        index: usize,
        upstream_index: usize,
    },
    #[error("cycle: {task} → {task} (task \"{task}\" depends on itself)")]
    SelfDependency {
        task: String,
        index: usize,
        upstream_index: usize,
    },
    /// The same upstream listed twice by one task; refused because it is always a typo and it
    /// would count the edge twice in readiness counters.
    #[error("task \"{task}\" lists upstream \"{upstream}\" more than once")]
    DuplicateUpstream {
        task: String,
        upstream: String,
        index: usize,
        upstream_index: usize,
        first_upstream_index: usize,
    },
    /// `path` starts and ends with the same task, e.g. `[a, b, c, a]`.
    #[error("cycle: {}", path.join(" → "))]
    Cycle { path: Vec<String> },
}

/// A validated, acyclic task graph. Names, upstream and downstream lists keep file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dag {
    names: Vec<String>,
    index: HashMap<String, usize>,
    upstream: Vec<Vec<String>>,
    downstream: Vec<Vec<String>>,
    downstream_idx: Vec<Vec<usize>>,
    rules: Vec<TriggerRule>,
    handlers: Vec<Option<Handler>>,
}

impl Dag {
    /// Builds the graph from tasks in file order, refusing duplicate names, unknown or repeated
    /// upstreams, self dependencies and cycles (reported in that order of precedence).
    pub fn new(tasks: &[TaskSpec]) -> Result<Dag, DagError> {
        let mut index = HashMap::with_capacity(tasks.len());
        for (i, task) in tasks.iter().enumerate() {
            if let Some(&first_index) = index.get(task.name.as_str()) {
                return Err(DagError::DuplicateTask {
                    name: task.name.clone(),
                    index: i,
                    first_index,
                });
            }
            index.insert(task.name.clone(), i);
        }

        let mut downstream: Vec<Vec<String>> = vec![Vec::new(); tasks.len()];
        let mut downstream_idx: Vec<Vec<usize>> = vec![Vec::new(); tasks.len()];
        for (i, task) in tasks.iter().enumerate() {
            // Upstream lists are short, so a per-task map is cheaper than a global edge set.
            let mut seen: HashMap<&str, usize> = HashMap::with_capacity(task.upstream.len());
            for (j, up) in task.upstream.iter().enumerate() {
                let Some(&u) = index.get(up.as_str()) else {
                    return Err(DagError::UnknownUpstream {
                        task: task.name.clone(),
                        upstream: up.clone(),
                        index: i,
                        upstream_index: j,
                    });
                };
                if u == i {
                    return Err(DagError::SelfDependency {
                        task: task.name.clone(),
                        index: i,
                        upstream_index: j,
                    });
                }
                if let Some(&first) = seen.get(up.as_str()) {
                    return Err(DagError::DuplicateUpstream {
                        task: task.name.clone(),
                        upstream: up.clone(),
                        index: i,
                        upstream_index: j,
                        first_upstream_index: first,
                    });
                }
                seen.insert(up.as_str(), j);
                // Tasks are visited in file order, so every downstream list is in file order.
                downstream[u].push(task.name.clone());
                downstream_idx[u].push(i);
            }
        }

        let dag = Dag {
            names: tasks.iter().map(|t| t.name.clone()).collect(),
            index,
            upstream: tasks.iter().map(|t| t.upstream.clone()).collect(),
            downstream,
            downstream_idx,
            rules: tasks.iter().map(|t| t.trigger_rule).collect(),
            handlers: tasks.iter().map(|t| t.handler).collect(),
        };
        if dag.topological_indexes().len() < dag.names.len() {
            return Err(DagError::Cycle {
                path: dag.find_cycle(),
            });
        }
        Ok(dag)
    }

    /// Number of tasks.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    pub fn contains(&self, task: &str) -> bool {
        self.index.contains_key(task)
    }

    /// Task names in file order.
    pub fn tasks(&self) -> &[String] {
        &self.names
    }

    /// Direct downstream tasks, in file order; empty for an unknown task.
    pub fn downstream(&self, task: &str) -> &[String] {
        self.index.get(task).map_or(&[], |&i| &self.downstream[i])
    }

    /// Direct upstream tasks, in the order the task lists them; empty for an unknown task.
    pub fn upstream(&self, task: &str) -> &[String] {
        self.index.get(task).map_or(&[], |&i| &self.upstream[i])
    }

    /// How many upstreams must succeed before `task` is ready; 0 for a root or an unknown task.
    pub fn upstream_count(&self, task: &str) -> usize {
        self.upstream(task).len()
    }

    /// The trigger rule of `task` (`all_success` for an unknown task).
    pub fn rule(&self, task: &str) -> TriggerRule {
        self.index
            .get(task)
            .map_or(TriggerRule::default(), |&i| self.rules[i])
    }

    /// Which of the run's handler lists `task` belongs to; `None` for a task of the graph.
    pub fn handler(&self, task: &str) -> Option<Handler> {
        self.index.get(task).and_then(|&i| self.handlers[i])
    }

    /// The tasks a new run starts with, in file order: those of the graph (not handlers) with no
    /// upstream or whose rule is `always`.
    pub fn roots(&self) -> Vec<&str> {
        (0..self.names.len())
            .filter(|&i| {
                self.handlers[i].is_none()
                    && (self.upstream[i].is_empty() || self.rules[i].starts_with_run())
            })
            .map(|i| self.names[i].as_str())
            .collect()
    }

    /// Tasks of the graph (not handlers) with neither upstream nor downstream, in file order.
    /// Empty for a one-task graph, where being alone is the point rather than a likely mistake.
    pub fn isolated(&self) -> Vec<&str> {
        let graph = || (0..self.names.len()).filter(|&i| self.handlers[i].is_none());
        if graph().count() <= 1 {
            return Vec::new();
        }
        graph()
            .filter(|&i| self.upstream[i].is_empty() && self.downstream[i].is_empty())
            .map(|i| self.names[i].as_str())
            .collect()
    }

    /// `task` and every task below it (transitively), in topological order; empty for an unknown
    /// task. Costs the size of that part of the graph, not of the whole graph.
    pub fn downstream_closure(&self, task: &str) -> Vec<&str> {
        let Some(&start) = self.index.get(task) else {
            return Vec::new();
        };
        let mut seen = vec![false; self.names.len()];
        seen[start] = true;
        let mut stack = vec![start];
        let mut found = Vec::new();
        while let Some(i) = stack.pop() {
            found.push(i);
            for &d in &self.downstream_idx[i] {
                if !seen[d] {
                    seen[d] = true;
                    stack.push(d);
                }
            }
        }
        // Topological order restricted to the closure: in-degrees counted inside it only.
        let mut in_degree = vec![0usize; self.names.len()];
        for &i in &found {
            for &d in &self.downstream_idx[i] {
                in_degree[d] += 1;
            }
        }
        let mut ready: BinaryHeap<Reverse<usize>> = BinaryHeap::from([Reverse(start)]);
        let mut order = Vec::with_capacity(found.len());
        while let Some(Reverse(i)) = ready.pop() {
            order.push(self.names[i].as_str());
            for &d in &self.downstream_idx[i] {
                in_degree[d] -= 1;
                if in_degree[d] == 0 {
                    ready.push(Reverse(d));
                }
            }
        }
        order
    }

    /// Every task after all of its upstreams. Among tasks ready at the same time the earlier one in
    /// the file comes first, so the order is deterministic and close to the file's.
    pub fn topological_order(&self) -> Vec<&str> {
        self.topological_indexes()
            .into_iter()
            .map(|i| self.names[i].as_str())
            .collect()
    }

    /// Whether every upstream of `task` has succeeded (true for a root). False for an unknown task.
    pub fn is_ready(&self, task: &str, succeeded: impl Fn(&str) -> bool) -> bool {
        self.contains(task) && self.upstream(task).iter().all(|up| succeeded(up))
    }

    /// Kahn's algorithm with a min-heap on file position. Returns fewer indexes than tasks when
    /// the graph has a cycle (the tasks on or behind it never reach in-degree zero).
    fn topological_indexes(&self) -> Vec<usize> {
        let mut in_degree: Vec<usize> = self.upstream.iter().map(Vec::len).collect();
        let mut ready: BinaryHeap<Reverse<usize>> = (0..self.names.len())
            .filter(|&i| in_degree[i] == 0)
            .map(Reverse)
            .collect();
        let mut order = Vec::with_capacity(self.names.len());
        while let Some(Reverse(i)) = ready.pop() {
            order.push(i);
            for &d in &self.downstream_idx[i] {
                in_degree[d] -= 1;
                if in_degree[d] == 0 {
                    ready.push(Reverse(d));
                }
            }
        }
        order
    }

    /// Spells one cycle, deterministically: it starts at the first task in file order that lies
    /// on a cycle and follows the shortest way back to it along downstream edges (ties broken by
    /// file order). Only called when a cycle is known to exist.
    fn find_cycle(&self) -> Vec<String> {
        let component = self.strongly_connected_components();
        let n = self.names.len();
        let mut size = vec![0usize; n];
        for &c in &component {
            size[c] += 1;
        }
        // Self loops are refused before this point, so a task is on a cycle exactly when its
        // strongly connected component has more than one task.
        let Some(start) = (0..n).find(|&i| size[component[i]] > 1) else {
            return Vec::new();
        };

        // Breadth-first search inside the component, back to `start`.
        let mut parent: Vec<Option<usize>> = vec![None; n];
        let mut visited = vec![false; n];
        let mut queue = VecDeque::from([start]);
        visited[start] = true;
        let mut last = None;
        'search: while let Some(i) = queue.pop_front() {
            for &d in &self.downstream_idx[i] {
                if component[d] != component[start] {
                    continue;
                }
                if d == start {
                    last = Some(i);
                    break 'search;
                }
                if !visited[d] {
                    visited[d] = true;
                    parent[d] = Some(i);
                    queue.push_back(d);
                }
            }
        }

        let mut reversed = vec![start];
        let mut cursor = last;
        while let Some(i) = cursor {
            reversed.push(i);
            cursor = parent[i];
        }
        // `reversed` is start ← last ← … ← start's successor ← start (the BFS root has no parent,
        // so the walk ends on it); flip it into execution order.
        reversed.reverse();
        reversed
            .into_iter()
            .map(|i| self.names[i].clone())
            .collect()
    }

    /// Kosaraju's algorithm with explicit stacks: component id per task.
    fn strongly_connected_components(&self) -> Vec<usize> {
        let n = self.names.len();
        let mut upstream_idx: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (u, downs) in self.downstream_idx.iter().enumerate() {
            for &d in downs {
                upstream_idx[d].push(u);
            }
        }

        // Pass 1: post-order of a depth-first search along downstream edges.
        let mut visited = vec![false; n];
        let mut post_order = Vec::with_capacity(n);
        for root in 0..n {
            if visited[root] {
                continue;
            }
            visited[root] = true;
            let mut stack = vec![(root, 0usize)];
            while let Some((i, next_edge)) = stack.last_mut() {
                let i = *i;
                if let Some(&d) = self.downstream_idx[i].get(*next_edge) {
                    *next_edge += 1;
                    if !visited[d] {
                        visited[d] = true;
                        stack.push((d, 0));
                    }
                } else {
                    post_order.push(i);
                    stack.pop();
                }
            }
        }

        // Pass 2: on the reversed graph, in reverse post-order, each search is one component.
        let mut component = vec![usize::MAX; n];
        let mut next_component = 0;
        for &root in post_order.iter().rev() {
            if component[root] != usize::MAX {
                continue;
            }
            component[root] = next_component;
            let mut stack = vec![root];
            while let Some(i) = stack.pop() {
                for &u in &upstream_idx[i] {
                    if component[u] == usize::MAX {
                        component[u] = next_component;
                        stack.push(u);
                    }
                }
            }
            next_component += 1;
        }
        component
    }
}

/// Task indexes (file positions) with every task after its upstreams, in
/// [`Dag::topological_order`]; tasks that do not form a valid DAG keep their file order.
pub fn topological_positions(tasks: &[TaskSpec]) -> Vec<usize> {
    match Dag::new(tasks) {
        Ok(dag) => dag.topological_indexes(),
        Err(_) => (0..tasks.len()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Tasks from `(name, upstreams)` pairs.
    fn tasks(spec: &[(&str, &[&str])]) -> Vec<TaskSpec> {
        spec.iter()
            .map(|(name, ups)| TaskSpec {
                name: name.to_string(),
                upstream: ups.iter().map(|u| u.to_string()).collect(),
                ..TaskSpec::default()
            })
            .collect()
    }

    fn dag(spec: &[(&str, &[&str])]) -> Dag {
        Dag::new(&tasks(spec)).unwrap()
    }

    fn err(spec: &[(&str, &[&str])]) -> DagError {
        Dag::new(&tasks(spec)).unwrap_err()
    }

    fn assert_respects_edges(dag: &Dag) {
        let order = dag.topological_order();
        assert_eq!(order.len(), dag.len());
        let position: HashMap<&str, usize> =
            order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        for name in dag.tasks() {
            for up in dag.upstream(name) {
                assert!(
                    position[up.as_str()] < position[name.as_str()],
                    "{up} must precede {name}"
                );
            }
        }
    }

    #[test]
    fn three_cycle_is_spelled_from_first_task_in_file_order() {
        let e = err(&[("a", &["c"]), ("b", &["a"]), ("c", &["b"])]);
        assert_eq!(
            e,
            DagError::Cycle {
                path: vec!["a".into(), "b".into(), "c".into(), "a".into()]
            }
        );
        assert_eq!(e.to_string(), "cycle: a → b → c → a");
    }

    #[test]
    fn two_cycle_and_shortest_way_back() {
        // a → b → a is shorter than a → c → d → a; both are cycles through a.
        let e = err(&[
            ("a", &["b", "d"]),
            ("b", &["a"]),
            ("c", &["a"]),
            ("d", &["c"]),
        ]);
        assert_eq!(e.to_string(), "cycle: a → b → a");
    }

    #[test]
    fn self_loop_is_its_own_error() {
        let e = err(&[("a", &[]), ("b", &["a", "b"])]);
        assert_eq!(
            e,
            DagError::SelfDependency {
                task: "b".into(),
                index: 1,
                upstream_index: 1
            }
        );
        assert_eq!(e.to_string(), "cycle: b → b (task \"b\" depends on itself)");
    }

    #[test]
    fn cycle_reachable_only_from_a_later_task() {
        // `start` and `mid` are not on the cycle, though `mid` is downstream of it and upstream
        // of nothing; the cycle must start at `x`, the first task on it.
        let e = err(&[
            ("start", &[]),
            ("mid", &["z"]),
            ("x", &["start", "z"]),
            ("y", &["x"]),
            ("z", &["y"]),
        ]);
        assert_eq!(e.to_string(), "cycle: x → y → z → x");
    }

    #[test]
    fn cycle_between_tasks_not_on_it() {
        // `bridge` sits between two cycles without being on either.
        let e = err(&[
            ("bridge", &["p"]),
            ("q", &["bridge", "r"]),
            ("r", &["q"]),
            ("p", &["o"]),
            ("o", &["p"]),
        ]);
        assert_eq!(e.to_string(), "cycle: q → r → q");
    }

    #[test]
    fn unknown_upstream_names_its_position() {
        let e = err(&[("a", &[]), ("b", &["a", "nope"])]);
        assert_eq!(
            e,
            DagError::UnknownUpstream {
                task: "b".into(),
                upstream: "nope".into(),
                index: 1,
                upstream_index: 1
            }
        );
        assert_eq!(e.to_string(), "task \"b\" has unknown upstream \"nope\"");
    }

    #[test]
    fn duplicate_task_names_point_at_both() {
        let e = err(&[("a", &[]), ("b", &[]), ("a", &["b"])]);
        assert_eq!(
            e,
            DagError::DuplicateTask {
                name: "a".into(),
                index: 2,
                first_index: 0
            }
        );
    }

    #[test]
    fn duplicate_upstream_entries_are_refused() {
        let e = err(&[("a", &[]), ("b", &["a", "a"])]);
        assert_eq!(
            e,
            DagError::DuplicateUpstream {
                task: "b".into(),
                upstream: "a".into(),
                index: 1,
                upstream_index: 1,
                first_upstream_index: 0
            }
        );
    }

    #[test]
    fn roots_downstream_upstream_and_isolated() {
        let d = dag(&[
            ("extract", &[]),
            ("lonely", &[]),
            ("load", &["transform"]),
            ("transform", &["extract"]),
            ("report", &["extract", "load"]),
        ]);
        assert_eq!(d.len(), 5);
        assert_eq!(d.roots(), ["extract", "lonely"]);
        assert_eq!(d.isolated(), ["lonely"]);
        assert_eq!(d.downstream("extract"), ["transform", "report"]);
        assert_eq!(d.upstream("report"), ["extract", "load"]);
        assert_eq!(d.upstream_count("report"), 2);
        assert_eq!(d.upstream_count("extract"), 0);
        assert!(d.downstream("missing").is_empty());
        assert_eq!(d.upstream_count("missing"), 0);
        assert_eq!(
            d.topological_order(),
            ["extract", "lonely", "transform", "load", "report"]
        );
        assert_respects_edges(&d);
    }

    #[test]
    fn downstream_closure_is_the_task_and_everything_below_it_in_order() {
        let d = dag(&[
            ("extract", &[]),
            ("lonely", &[]),
            ("load", &["transform"]),
            ("transform", &["extract"]),
            ("report", &["extract", "load"]),
            ("audit", &["lonely"]),
        ]);
        assert_eq!(
            d.downstream_closure("extract"),
            ["extract", "transform", "load", "report"]
        );
        assert_eq!(d.downstream_closure("load"), ["load", "report"]);
        assert_eq!(d.downstream_closure("report"), ["report"]);
        assert_eq!(d.downstream_closure("lonely"), ["lonely", "audit"]);
        assert!(d.downstream_closure("missing").is_empty());
    }

    #[test]
    fn one_task_is_not_isolated() {
        let d = dag(&[("only", &[])]);
        assert!(d.isolated().is_empty());
        assert_eq!(d.roots(), ["only"]);
    }

    #[test]
    fn readiness_needs_every_upstream() {
        let d = dag(&[("a", &[]), ("b", &[]), ("c", &["a", "b"])]);
        assert!(d.is_ready("a", |_| false));
        assert!(!d.is_ready("c", |t| t == "a"));
        assert!(d.is_ready("c", |t| t == "a" || t == "b"));
        assert!(!d.is_ready("missing", |_| true));
    }

    #[test]
    fn topological_order_respects_edges_when_file_order_does_not() {
        let d = dag(&[("d", &["c"]), ("c", &["b", "a"]), ("b", &["a"]), ("a", &[])]);
        assert_eq!(d.topological_order(), ["a", "b", "c", "d"]);
        assert_respects_edges(&d);
    }

    #[test]
    fn ten_thousand_task_chain() {
        let names: Vec<String> = (0..10_000).map(|i| format!("t{i}")).collect();
        let spec: Vec<TaskSpec> = names
            .iter()
            .enumerate()
            .map(|(i, name)| TaskSpec {
                name: name.clone(),
                upstream: if i == 0 {
                    vec![]
                } else {
                    vec![names[i - 1].clone()]
                },
                ..TaskSpec::default()
            })
            .collect();
        let d = Dag::new(&spec).unwrap();
        assert_eq!(d.len(), 10_000);
        assert_eq!(d.roots(), ["t0"]);
        assert_eq!(d.downstream("t4999"), ["t5000"]);
        assert!(d.isolated().is_empty());
        assert_respects_edges(&d);

        // Closing the chain into one 10,000-long cycle must not overflow the stack either.
        let mut cyclic = spec.clone();
        cyclic[0].upstream = vec!["t9999".into()];
        let Err(DagError::Cycle { path }) = Dag::new(&cyclic) else {
            panic!("expected a cycle")
        };
        assert_eq!(path.len(), 10_001);
        assert_eq!(path.first().map(String::as_str), Some("t0"));
        assert_eq!(path.get(1).map(String::as_str), Some("t1"));
        assert_eq!(path.last().map(String::as_str), Some("t0"));
    }

    #[test]
    fn wide_layered_dag() {
        // 100 layers of 100 tasks, each task depending on every task of the layer before:
        // 10,000 tasks and 990,000 edges.
        let layer = |l: usize| (0..100).map(move |i| format!("l{l}_{i}"));
        let spec: Vec<TaskSpec> = (0..100)
            .flat_map(|l| {
                layer(l).map(move |name| TaskSpec {
                    name,
                    upstream: if l == 0 {
                        vec![]
                    } else {
                        layer(l - 1).collect()
                    },
                    ..TaskSpec::default()
                })
            })
            .collect();
        let d = Dag::new(&spec).unwrap();
        assert_eq!(d.len(), 10_000);
        assert_eq!(d.roots(), layer(0).collect::<Vec<_>>());
        assert_eq!(d.downstream("l3_7"), layer(4).collect::<Vec<_>>());
        assert_eq!(d.upstream_count("l99_0"), 100);
        assert!(d.downstream("l99_0").is_empty());
        let order = d.topological_order();
        assert_eq!(order[..100], layer(0).collect::<Vec<_>>());
        assert_respects_edges(&d);
    }
}
