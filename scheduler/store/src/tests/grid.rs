//! Conformance scenarios of the grid's read (`sql/grid.rs`): each run's own task instances
//! (never a shard or an item) by run then id, a mapped task's items counted by state on its
//! cell, a `run_workflow` task's child run on its cell, and neither read unless asked.

use std::collections::BTreeMap;

use ax_core::for_each::ForEach;
use ax_core::ids::{Attempt, RunId};
use ax_core::spec::TaskSpec;
use ax_core::state::Outcome;

use super::support::*;
use crate::{GridCell, GridParts, Report, Store, SubWorkflowStart, SubWorkflowStarted};

conformance!(the_grid_reads_own_instances_with_item_counts_and_child_runs);

/// `list` → `map` (for_each over list's `files`) and `call` (run_workflow: `child`).
fn grid_spec() -> Vec<TaskSpec> {
    let map = TaskSpec {
        for_each: Some(ForEach::Output {
            task: "list".into(),
            key: "files".into(),
        }),
        max_items: Some(5),
        ..task("map", &["list"])
    };
    let mut call = task("call", &[]);
    call.command = String::new();
    call.run_workflow = Some("child".into());
    vec![task("list", &[]), map, call]
}

async fn succeed_with_files(s: &Store, run: RunId, files: &str) {
    let inst = launch(s, run, "list").await;
    let mut report = finished(inst.id, inst.attempt.0, Outcome::Success, 0);
    if let Report::Finished { outputs, .. } = &mut report {
        *outputs = BTreeMap::from([("files".to_string(), files.to_string())]);
    }
    applied(&s.apply_reports(&[report], T0 + 30).await.unwrap()[0]);
}

/// Each cell of `run` as `task state attempt`, with its items and child run when it has them,
/// by task name.
fn described(cells: &[GridCell], run: RunId) -> Vec<String> {
    let mut described: Vec<String> = cells
        .iter()
        .filter(|c| c.run == run)
        .map(|c| {
            let mut text = format!("{} {} {}", c.task, c.state, c.attempt.0);
            if !c.items.is_empty() {
                let items: Vec<String> = c.items.iter().map(|(s, n)| format!("{s}={n}")).collect();
                text.push_str(&format!(" items[{}]", items.join(",")));
            }
            if let Some(child) = c.child_run {
                text.push_str(&format!(" child={}", child.0));
            }
            text
        })
        .collect();
    described.sort();
    described
}

mod scenarios {
    use super::*;

    pub(super) async fn the_grid_reads_own_instances_with_item_counts_and_child_runs(ctx: Ctx) {
        let s = ctx.s();
        apply(s, &spec("child", vec![task("load", &[])])).await;
        let wf = apply(s, &spec("gridded", grid_spec())).await;
        let first = start_run(s, &wf).await;
        let second = start_run(s, &wf).await;

        succeed_with_files(s, first.id, r#"["a", "b", "c"]"#).await;
        let mut items: Vec<_> = s
            .list_instances(first.id)
            .await
            .unwrap()
            .into_iter()
            .filter(|i| i.shard.as_ref().is_some_and(|sh| sh.item.is_some()))
            .collect();
        items.sort_by_key(|i| i.shard.as_ref().map(|sh| sh.index));
        assert_eq!(items.len(), 3, "three items");
        for (item, outcome) in [(&items[0], Outcome::Success), (&items[1], Outcome::Failed)] {
            let won = s.mark_dispatched(&[claim(item.id, 1, "w1")]).await.unwrap();
            assert_eq!(won, vec![true]);
            applied(&s.apply_reports(&[started(item.id, 1)], T0).await.unwrap()[0]);
            let exit = i32::from(outcome != Outcome::Success);
            applied(
                &s.apply_reports(&[finished(item.id, 1, outcome, exit)], T0 + 40)
                    .await
                    .unwrap()[0],
            );
        }
        let call = instance_of(s, first.id, "call").await.expect("call");
        let child = match s
            .start_sub_workflow(&SubWorkflowStart {
                instance_id: call.id,
                attempt: call.attempt,
                node_id: "node-1".into(),
                now: T0 + 5,
            })
            .await
            .unwrap()
        {
            SubWorkflowStarted::Started { child } => child.id,
            other => panic!("expected a child run, got {other:?}"),
        };

        let every = GridParts {
            items: true,
            child_runs: true,
        };
        let cells = s.grid_cells(&[second.id, first.id], every).await.unwrap();
        let runs: Vec<RunId> = cells.iter().map(|c| c.run).collect();
        let mut sorted = runs.clone();
        sorted.sort();
        assert_eq!(runs, sorted, "by run");
        assert_eq!(
            described(&cells, first.id),
            vec![
                format!("call RUNNING 1 child={}", child.0),
                "list SUCCESS 1".to_string(),
                "map FAILED 1 items[WAITING=1,SUCCESS=1,FAILED=1]".to_string(),
            ],
            "own instances: an item is counted on its task's cell, never a cell"
        );
        assert_eq!(
            described(&cells, second.id),
            vec!["call WAITING 1", "list WAITING 1"],
            "a task without an instance has no cell"
        );
        assert!(cells.iter().all(|c| c.attempt == Attempt(1)));

        let plain = s
            .grid_cells(&[first.id], GridParts::default())
            .await
            .unwrap();
        assert!(
            plain
                .iter()
                .all(|c| c.items.is_empty() && c.child_run.is_none()),
            "items and child runs are read only when asked for"
        );
        assert_eq!(plain.len(), 3);
        assert!(
            s.grid_cells(&[], every).await.unwrap().is_empty(),
            "no runs, no cells"
        );
    }
}
