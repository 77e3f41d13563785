//! `GetGrid`: a workflow's recent runs as columns and its tasks as rows, each cell the state of
//! a task's own instance in a run (the web UI's grid, Airflow's most used view).
//!
//! One read answers the whole matrix (`Store::grid_cells`: three statements at most for 100
//! runs of 300 tasks), and the answer stays small: a column's states are one character per
//! row and its instance ids small offsets from a base, so 30,000 cells are a few hundred
//! kilobytes of JSON rather than megabytes of objects. Only cells with more to say (a retried
//! attempt, a mapped task's items, a child run) carry a detail.
//!
//! The rows are the latest version's tasks in topological order (each after its upstreams, the
//! graph's reading order), then the tasks only older versions' runs in the window had, so a
//! renamed or removed task keeps its history visible.

use std::collections::{HashMap, HashSet};

use ax_core::dag::topological_positions;
use ax_core::ids::RunId;
use ax_core::spec::WorkflowSpec;
use ax_core::state::InstanceState;
use ax_proto::v1 as pb;
use ax_store::{GridCell, GridParts, RunRecord};
use tonic::Status;

use super::access::Call;
use super::{ControlApi, positive_id};
use crate::grpc::convert::{self, store_status};

/// Runs (columns) when the caller does not say.
pub(crate) const DEFAULT_RUNS: u32 = 25;
/// The most runs one grid holds: 100 runs of 300 tasks is the size it is built for.
pub(crate) const MAX_RUNS: u32 = 100;
/// A cell without an instance.
const NO_INSTANCE: char = '.';

impl ControlApi {
    pub(super) async fn grid(
        &self,
        call: &Call,
        request: pb::GetGridRequest,
    ) -> Result<pb::Grid, Status> {
        if request.limit > MAX_RUNS {
            return Err(Status::invalid_argument(format!(
                "limit: {} runs is more than the {MAX_RUNS} a grid holds",
                request.limit
            )));
        }
        let limit = if request.limit == 0 {
            DEFAULT_RUNS
        } else {
            request.limit
        };
        let before = match request.before_id {
            0 => None,
            id => Some(RunId(positive_id(id, "before_id: run")?)),
        };
        let latest = self.latest_spec(call, &request.workflow).await?;
        // One run more than the page tells whether an older page follows.
        let mut records = self
            .node
            .store
            .list_runs_of(&[latest.id], None, before, limit + 1)
            .await
            .map_err(store_status)?;
        let next_before_id = if records.len() > limit as usize {
            records.truncate(limit as usize);
            records.last().map_or(0, |run| run.id.0)
        } else {
            0
        };
        records.reverse();

        let mut specs = vec![latest.versioned.clone()];
        let mut seen_versions = HashSet::from([latest.version]);
        for run in &records {
            if seen_versions.insert(run.workflow_version) {
                let spec = self
                    .node
                    .specs
                    .get(latest.id, run.workflow_version)
                    .await
                    .map_err(store_status)?;
                specs.push(spec);
            }
        }
        let tasks = rows(specs.iter().map(|versioned| &versioned.spec));
        let parts = GridParts {
            items: specs
                .iter()
                .any(|v| v.spec.tasks.iter().any(|t| t.for_each.is_some())),
            child_runs: specs
                .iter()
                .any(|v| v.spec.tasks.iter().any(|t| t.run_workflow.is_some())),
        };
        let also: HashSet<i64> = request.also.iter().copied().collect();
        let filled: Vec<RunId> = records
            .iter()
            .filter(|run| !request.live || !run.state.is_terminal() || also.contains(&run.id.0))
            .map(|run| run.id)
            .collect();
        let cells = self
            .node
            .store
            .grid_cells(&filled, parts)
            .await
            .map_err(store_status)?;
        let mut by_run: HashMap<RunId, Vec<GridCell>> = HashMap::new();
        for cell in cells {
            by_run.entry(cell.run).or_default().push(cell);
        }
        let row_of: HashMap<&str, usize> = tasks
            .iter()
            .enumerate()
            .map(|(row, task)| (task.name.as_str(), row))
            .collect();
        let filled: HashSet<RunId> = filled.into_iter().collect();
        let runs = records
            .iter()
            .map(|run| {
                let cells = by_run.remove(&run.id).unwrap_or_default();
                column(run, filled.contains(&run.id), &cells, &row_of)
            })
            .collect::<Result<_, _>>()?;
        Ok(pb::Grid {
            workflow: latest.versioned.name.clone(),
            version: latest.version,
            tasks,
            runs,
            next_before_id,
        })
    }
}

/// The rows: the first spec's tasks in topological order, then each later spec's tasks not
/// yet listed, in theirs.
fn rows<'a>(specs: impl Iterator<Item = &'a WorkflowSpec>) -> Vec<pb::GridTask> {
    let mut listed: HashSet<&str> = HashSet::new();
    let mut tasks = Vec::new();
    for spec in specs {
        for position in topological_positions(&spec.tasks) {
            let Some(task) = spec.tasks.get(position) else {
                continue;
            };
            if listed.insert(task.name.as_str()) {
                tasks.push(pb::GridTask {
                    name: task.name.clone(),
                    mapped: task.for_each.is_some(),
                    run_workflow: task.run_workflow.clone().unwrap_or_default(),
                    handler: task
                        .handler
                        .map(|h| h.field().to_string())
                        .unwrap_or_default(),
                });
            }
        }
    }
    tasks
}

/// A run's column: its header and, when `filled`, its cells by row.
fn column(
    run: &RunRecord,
    filled: bool,
    cells: &[GridCell],
    row_of: &HashMap<&str, usize>,
) -> Result<pb::GridRun, Status> {
    let mut column = pb::GridRun {
        id: run.id.0,
        state: convert::run_state(run.state) as i32,
        logical_time_ms: run.logical_time,
        trigger: convert::trigger(run.trigger) as i32,
        workflow_version: run.workflow_version,
        created_at_ms: run.created_at,
        finished_at_ms: run.finished_at.unwrap_or(0),
        has_cells: filled,
        ..Default::default()
    };
    if !filled {
        return Ok(column);
    }
    let mut states = vec![NO_INSTANCE; row_of.len()];
    let mut offsets = vec![0u32; row_of.len()];
    let base = cells.iter().map(|c| c.instance.0).min().unwrap_or(0);
    for cell in cells {
        // Every task of every version in the window has a row.
        let Some(&row) = row_of.get(cell.task.as_str()) else {
            continue;
        };
        states[row] = letter(cell.state);
        offsets[row] = u32::try_from(cell.instance.0 - base + 1).map_err(|_| {
            Status::internal(format!(
                "run {}: instance ids {base} and {} lie too far apart for the grid",
                run.id, cell.instance
            ))
        })?;
        if cell.attempt.0 > 1 || cell.child_run.is_some() || !cell.items.is_empty() {
            column.details.push(pb::GridCellDetail {
                task: u32::try_from(row).unwrap_or(u32::MAX),
                attempt: if cell.attempt.0 > 1 {
                    cell.attempt.0
                } else {
                    0
                },
                child_run_id: cell.child_run.map_or(0, |id| id.0),
                items: (!cell.items.is_empty()).then(|| item_counts(&cell.items)),
            });
        }
    }
    column.details.sort_by_key(|detail| detail.task);
    column.states = states.into_iter().collect();
    column.instance_base = base;
    column.instance_offsets = offsets;
    Ok(column)
}

fn item_counts(items: &[(InstanceState, u32)]) -> pb::ItemCounts {
    pb::ItemCounts {
        total: items.iter().map(|(_, n)| n).sum(),
        states: items
            .iter()
            .map(|(state, n)| (state.as_str().to_string(), *n))
            .collect(),
        first_failures: Vec::new(),
    }
}

/// A cell's state as the one character `GridRun.states` gives it.
pub(crate) fn letter(state: InstanceState) -> char {
    match state {
        InstanceState::Waiting => 'W',
        InstanceState::Dispatched => 'D',
        InstanceState::Running => 'R',
        InstanceState::Success => 'S',
        InstanceState::Failed => 'F',
        InstanceState::Timeout => 'T',
        InstanceState::Cancelled => 'C',
        InstanceState::Pending => 'P',
        InstanceState::Skipped => 'K',
        InstanceState::UpstreamFailed => 'U',
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_core::spec::{Handler, TaskSpec};

    fn task(name: &str, upstream: &[&str]) -> TaskSpec {
        TaskSpec {
            name: name.into(),
            command: "true".into(),
            upstream: upstream.iter().map(|u| u.to_string()).collect(),
            ..TaskSpec::default()
        }
    }

    fn spec(tasks: Vec<TaskSpec>) -> WorkflowSpec {
        WorkflowSpec {
            name: "wf".into(),
            tasks,
            ..WorkflowSpec::default()
        }
    }

    #[test]
    fn every_state_has_its_own_letter() {
        let letters: HashSet<char> = InstanceState::ALL.into_iter().map(letter).collect();
        assert_eq!(letters.len(), InstanceState::ALL.len());
        assert!(!letters.contains(&NO_INSTANCE));
    }

    #[test]
    fn rows_are_the_latest_tasks_in_topological_order_then_older_ones() {
        let mut page = task("page", &[]);
        page.handler = Some(Handler::OnFailure);
        let latest = spec(vec![task("load", &["extract"]), task("extract", &[]), page]);
        let older = spec(vec![task("extract", &[]), task("gone", &["extract"])]);
        let names: Vec<(String, String)> = rows([&latest, &older].into_iter())
            .into_iter()
            .map(|t| (t.name, t.handler))
            .collect();
        assert_eq!(
            names,
            vec![
                ("extract".into(), String::new()),
                ("load".into(), String::new()),
                ("page".into(), "on_failure".into()),
                ("gone".into(), String::new()),
            ]
        );
    }
}
