//! Conformance scenarios of mapped tasks (`sql/fan_out.rs`, `sql/reports.rs`,
//! `sql/run_roots.rs`, `sql/dispatch.rs`): a task with `for_each` judged to run becomes the
//! RUNNING parent of one WAITING item per element, in the transaction that judged it; the
//! tasks below wait for every item (fan-in) and follow their rule on the parent's end; an empty
//! list is SKIPPED with its decision; a list that is no JSON array or is over `max_items`
//! fails the task before any item exists; a root maps over a param as its run starts; a
//! task's items are read as counts by state with the first failures, and a page at a time
//! (`sql/items.rs`).

use std::collections::BTreeMap;

use ax_core::decision::DecisionKind;
use ax_core::for_each::ForEach;
use ax_core::ids::{InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::spec::TaskSpec;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::{InstanceRecord, ItemPage, ManualRetry, NewRun, Report, RerunFrom, Store};

conformance!(
    an_output_list_fans_out_and_the_join_waits_for_every_item,
    a_failed_item_fails_its_task_and_the_join_follows_its_rule,
    an_empty_list_is_skipped_and_a_bad_one_fails_naming_why,
    a_root_maps_over_a_param_as_its_run_starts,
    items_are_read_as_counts_first_failures_and_pages,
    a_manual_retry_reruns_one_item_and_a_parent_retry_its_failed_items,
    a_rerun_from_a_mapped_task_runs_every_item_and_one_never_fanned_out_is_refused,
);

fn mapped(name: &str, upstream: &[&str], for_each: ForEach) -> TaskSpec {
    TaskSpec {
        for_each: Some(for_each),
        max_items: Some(5),
        ..task(name, upstream)
    }
}

fn files() -> ForEach {
    ForEach::Output {
        task: "list".into(),
        key: "files".into(),
    }
}

async fn succeed_with(s: &Store, run: RunId, task: &str, passed: &[(&str, &str)]) {
    let inst = launch(s, run, task).await;
    let mut report = finished(inst.id, inst.attempt.0, Outcome::Success, 0);
    if let Report::Finished { outputs, .. } = &mut report {
        *outputs = passed
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }
    let results = s.apply_reports(&[report], T0 + 30).await.unwrap();
    applied(&results[0]);
}

/// The task's instance (the parent, never an item).
async fn parent_of(s: &Store, run: RunId, task: &str) -> InstanceRecord {
    s.list_instances(run)
        .await
        .unwrap()
        .into_iter()
        .find(|i| i.task == task && i.shard.is_none())
        .expect("the task's instance")
}

/// The task's items, by index: (id, item, state).
async fn items_of(s: &Store, run: RunId, task: &str) -> Vec<(InstanceId, String, InstanceState)> {
    let mut items: Vec<(u32, InstanceId, String, InstanceState)> = s
        .list_instances(run)
        .await
        .unwrap()
        .into_iter()
        .filter(|i| i.task == task)
        .filter_map(|i| {
            let shard = i.shard?;
            Some((shard.index, i.id, shard.item?, i.state))
        })
        .collect();
    items.sort_by_key(|(index, _, _, _)| *index);
    items
        .into_iter()
        .map(|(_, id, item, state)| (id, item, state))
        .collect()
}

/// Runs item `id` to `outcome`.
async fn run_item(s: &Store, id: InstanceId, outcome: Outcome) -> crate::Applied {
    run_item_attempt(s, id, 1, outcome).await
}

/// Runs `attempt` of item `id` to `outcome`.
async fn run_item_attempt(
    s: &Store,
    id: InstanceId,
    attempt: u32,
    outcome: Outcome,
) -> crate::Applied {
    let won = s
        .mark_dispatched(&[claim(id, attempt, "w1")])
        .await
        .unwrap();
    assert_eq!(won, vec![true]);
    applied(&s.apply_reports(&[started(id, attempt)], T0).await.unwrap()[0]);
    let exit = i32::from(outcome != Outcome::Success);
    let results = s
        .apply_reports(&[finished(id, attempt, outcome, exit)], T0 + 40)
        .await
        .unwrap();
    applied(&results[0]).clone()
}

async fn sink_state(s: &Store, run: RunId) -> Option<InstanceState> {
    instance_of(s, run, "sink").await.map(|i| i.state)
}

mod scenarios {
    use super::*;
    use InstanceState::*;

    pub(super) async fn an_output_list_fans_out_and_the_join_waits_for_every_item(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "mapper",
                vec![
                    task("list", &[]),
                    mapped("map", &["list"], files()),
                    task("sink", &["map"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(
            s,
            run.id,
            "list",
            &[("files", r#"["a.csv", "b.csv", {"n": 3}]"#)],
        )
        .await;
        let parent = parent_of(s, run.id, "map").await;
        assert_eq!(parent.state, Running, "the parent runs on no worker");
        assert_eq!(parent.worker_id, None);
        let items = items_of(s, run.id, "map").await;
        let listed: Vec<(&str, InstanceState)> = items
            .iter()
            .map(|(_, item, st)| (item.as_str(), *st))
            .collect();
        assert_eq!(
            listed,
            vec![
                ("a.csv", Waiting),
                ("b.csv", Waiting),
                (r#"{"n":3}"#, Waiting)
            ]
        );
        let waiting = s.waiting(T0 + 1_000, 100).await.unwrap();
        let items_waiting: Vec<Option<String>> = waiting
            .iter()
            .filter(|w| w.instance.task == "map")
            .map(|w| w.shard.as_ref().and_then(|sh| sh.item.clone()))
            .collect();
        assert_eq!(
            items_waiting.len(),
            3,
            "every item waits for a worker, the parent does not"
        );
        assert!(items_waiting.iter().all(Option::is_some));

        run_item(s, items[0].0, Outcome::Success).await;
        run_item(s, items[2].0, Outcome::Success).await;
        assert_eq!(
            sink_state(s, run.id).await,
            None,
            "the join waits for every item"
        );
        let last = run_item(s, items[1].0, Outcome::Success).await;
        assert_eq!(last.new_waiting, 1, "the last item's end starts the join");
        assert_eq!(parent_of(s, run.id, "map").await.state, Success);
        assert_eq!(sink_state(s, run.id).await, Some(Waiting));
        let done = run_task(s, run.id, "sink", Outcome::Success).await;
        assert_eq!(done.run_finished, Some((run.id, RunState::Success)));
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!(counts.success, 3, "the run counts its tasks, not the items");
    }

    pub(super) async fn a_failed_item_fails_its_task_and_the_join_follows_its_rule(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "mapper",
                vec![
                    task("list", &[]),
                    mapped("map", &["list"], files()),
                    task("sink", &["map"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "list", &[("files", "[1, 2]")]).await;
        let items = items_of(s, run.id, "map").await;
        run_item(s, items[0].0, Outcome::Failed).await;
        assert_eq!(parent_of(s, run.id, "map").await.state, Failed);
        assert_eq!(sink_state(s, run.id).await, Some(UpstreamFailed));
        let ended = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            ended.state,
            RunState::Running,
            "the run waits for the other item"
        );
        let last = run_item(s, items[1].0, Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Failed)));
    }

    pub(super) async fn an_empty_list_is_skipped_and_a_bad_one_fails_naming_why(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "mapper",
                vec![
                    task("list", &[]),
                    mapped("map", &["list"], files()),
                    task("sink", &["map"]),
                ],
            ),
        )
        .await;
        let cases: [(&str, InstanceState, &str); 4] = [
            (
                "[]",
                Skipped,
                "for_each: output files of task list is an empty list",
            ),
            (
                "a.csv b.csv",
                Failed,
                "for_each: output files of task list is not a JSON array",
            ),
            (
                "[1, 2, 3, 4, 5, 6]",
                Failed,
                "for_each: output files of task list has 6 items, more than the task's \
                 max_items 5",
            ),
            (
                "",
                Failed,
                "for_each: output files of task list is not a JSON array",
            ),
        ];
        for (i, (list, state, why)) in cases.into_iter().enumerate() {
            let (run, _) = s
                .create_run(&new_run(&wf, Some(&format!("case-{i}"))))
                .await
                .unwrap();
            succeed_with(s, run.id, "list", &[("files", list)]).await;
            let parent = parent_of(s, run.id, "map").await;
            assert_eq!(parent.state, state, "{list:?}");
            assert!(
                items_of(s, run.id, "map").await.is_empty(),
                "no item for {list:?}"
            );
            let said = if state == Skipped {
                s.list_decisions(wf.id, 0, i64::MAX, 100)
                    .await
                    .unwrap()
                    .into_iter()
                    .find(|d| d.kind == DecisionKind::EmptyList && d.run_id == Some(run.id))
                    .map(|d| d.detail)
                    .expect("an empty_list decision")
            } else {
                s.list_attempts(parent.id).await.unwrap()[0].message.clone()
            };
            assert!(said.starts_with(why), "{list:?}: {said}");
            let below = if state == Skipped {
                Skipped
            } else {
                UpstreamFailed
            };
            assert_eq!(sink_state(s, run.id).await, Some(below), "{list:?}");
        }
    }

    pub(super) async fn a_root_maps_over_a_param_as_its_run_starts(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "regions",
                vec![
                    mapped("sync", &[], ForEach::Param("regions".into())),
                    mapped("fixed", &[], ForEach::Items(vec!["x".into(), "y".into()])),
                ],
            ),
        )
        .await;
        let (run, _) = s
            .create_run(&NewRun {
                params: BTreeMap::from([("regions".to_string(), r#"["eu","us"]"#.to_string())]),
                ..new_run(&wf, None)
            })
            .await
            .unwrap();
        let regions: Vec<String> = items_of(s, run.id, "sync")
            .await
            .into_iter()
            .map(|(_, item, _)| item)
            .collect();
        assert_eq!(regions, ["eu", "us"]);
        let fixed: Vec<String> = items_of(s, run.id, "fixed")
            .await
            .into_iter()
            .map(|(_, item, _)| item)
            .collect();
        assert_eq!(fixed, ["x", "y"]);
        // Without the param, the mapped root fails before any item exists.
        let (bare, _) = s
            .create_run(&NewRun {
                params: BTreeMap::new(),
                dedup_key: Some("bare".into()),
                ..new_run(&wf, None)
            })
            .await
            .unwrap();
        assert_eq!(parent_of(s, bare.id, "sync").await.state, Failed);
        let message = s
            .list_attempts(parent_of(s, bare.id, "sync").await.id)
            .await
            .unwrap()[0]
            .message
            .clone();
        assert_eq!(
            message,
            "for_each: param regions is missing: the run has no param regions"
        );
    }

    pub(super) async fn items_are_read_as_counts_first_failures_and_pages(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "mapper",
                vec![
                    task("list", &[]),
                    mapped("map", &["list"], files()),
                    task("sink", &["map"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(
            s,
            run.id,
            "list",
            &[("files", r#"["a", "b", "c", "d", "e"]"#)],
        )
        .await;
        let items = items_of(s, run.id, "map").await;
        run_item(s, items[3].0, Outcome::Failed).await;
        run_item(s, items[1].0, Outcome::Failed).await;
        run_item(s, items[0].0, Outcome::Success).await;

        let parent = parent_of(s, run.id, "map").await;
        let without: Vec<String> = s
            .list_instances_without_items(run.id)
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.task)
            .collect();
        assert_eq!(
            without,
            vec!["list", "map", "sink"],
            "the parent stays, the items go"
        );

        let summaries = s.item_summaries(run.id).await.unwrap();
        assert_eq!(summaries.len(), 1);
        let summary = &summaries[0];
        assert_eq!(summary.parent, parent.id);
        assert_eq!(summary.total, 5);
        assert_eq!(
            summary.states,
            vec![(Waiting, 2), (Success, 1), (Failed, 2)]
        );
        let failures: Vec<Option<String>> = summary
            .first_failures
            .iter()
            .map(|i| i.shard.as_ref().and_then(|sh| sh.item.clone()))
            .collect();
        assert_eq!(
            failures,
            vec![Some("b".into()), Some("d".into())],
            "by index"
        );

        let page = |state, from_index, limit| ItemPage {
            state,
            from_index,
            limit,
        };
        let indexes = |items: Vec<InstanceRecord>| -> Vec<u32> {
            items
                .iter()
                .filter_map(|i| i.shard.as_ref().map(|sh| sh.index))
                .collect()
        };
        let first = s.list_items(parent.id, page(None, 0, 2)).await.unwrap();
        assert_eq!(indexes(first), vec![0, 1]);
        let next = s.list_items(parent.id, page(None, 2, 2)).await.unwrap();
        assert_eq!(indexes(next), vec![2, 3]);
        let waiting = s
            .list_items(parent.id, page(Some(Waiting), 0, 10))
            .await
            .unwrap();
        assert_eq!(indexes(waiting), vec![2, 4]);
        let list = parent_of(s, run.id, "list").await;
        let none = s.list_items(list.id, page(None, 0, 10)).await.unwrap();
        assert!(none.is_empty(), "a task without items has no page");
    }

    pub(super) async fn a_manual_retry_reruns_one_item_and_a_parent_retry_its_failed_items(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "mapper",
                vec![
                    task("list", &[]),
                    mapped("map", &["list"], files()),
                    task("sink", &["map"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "list", &[("files", "[1, 2, 3]")]).await;
        let items = items_of(s, run.id, "map").await;
        run_item(s, items[0].0, Outcome::Success).await;
        run_item(s, items[1].0, Outcome::Failed).await;
        let last = run_item(s, items[2].0, Outcome::Failed).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Failed)));
        let parent = parent_of(s, run.id, "map").await;
        assert_eq!(parent.state, Failed);

        // One item is retried on its own; its parent runs again until the items settle it.
        let retried = s.retry_instance(items[1].0, T0 + 100).await.unwrap();
        let crate::ManualRetry::Retried(record) = retried else {
            panic!("an item of the current attempt is retried: {retried:?}");
        };
        assert_eq!(
            (record.id, record.state, record.attempt.0),
            (items[1].0, Waiting, 2)
        );
        let states: Vec<InstanceState> = items_of(s, run.id, "map")
            .await
            .iter()
            .map(|(_, _, st)| *st)
            .collect();
        assert_eq!(states, vec![Success, Waiting, Failed], "only that item");
        let again = parent_of(s, run.id, "map").await;
        assert_eq!((again.state, again.attempt), (Running, parent.attempt));
        assert_eq!(sink_state(s, run.id).await, Some(Pending));
        let reopened = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(reopened.state, RunState::Running);
        assert!(
            matches!(
                s.retry_instance(parent.id, T0 + 110).await.unwrap(),
                crate::ManualRetry::ShardsActive { unfinished: 1 }
            ),
            "the parent waits for its item going"
        );

        // Item 2 succeeds; item 3 is still FAILED, so the task fails again.
        let done = run_item_attempt(s, items[1].0, 2, Outcome::Success).await;
        assert_eq!(done.run_finished, Some((run.id, RunState::Failed)));
        assert_eq!(parent_of(s, run.id, "map").await.state, Failed);
        assert_eq!(sink_state(s, run.id).await, Some(UpstreamFailed));

        // A retry of the parent retries its failed items, not the whole list.
        let retried = s.retry_instance(parent.id, T0 + 200).await.unwrap();
        assert!(
            matches!(retried, crate::ManualRetry::Retried(ref r) if r.id == parent.id),
            "{retried:?}"
        );
        let after: Vec<(InstanceId, InstanceState)> = items_of(s, run.id, "map")
            .await
            .iter()
            .map(|(id, _, st)| (*id, *st))
            .collect();
        assert_eq!(
            after,
            vec![
                (items[0].0, Success),
                (items[1].0, Success),
                (items[2].0, Waiting)
            ],
            "no item made anew, only the failed one again"
        );
        assert_eq!(parent_of(s, run.id, "map").await.state, Running);
        run_item_attempt(s, items[2].0, 2, Outcome::Success).await;
        assert_eq!(parent_of(s, run.id, "map").await.state, Success);
        assert_eq!(sink_state(s, run.id).await, Some(Waiting));
        let done = run_task(s, run.id, "sink", Outcome::Success).await;
        assert_eq!(done.run_finished, Some((run.id, RunState::Success)));
    }

    pub(super) async fn a_rerun_from_a_mapped_task_runs_every_item_and_one_never_fanned_out_is_refused(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "mapper",
                vec![
                    task("list", &[]),
                    mapped("map", &["list"], files()),
                    task("sink", &["map"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "list", &[("files", "[1, 2]")]).await;
        let items = items_of(s, run.id, "map").await;
        run_item(s, items[0].0, Outcome::Success).await;
        run_item(s, items[1].0, Outcome::Success).await;
        run_task(s, run.id, "sink", Outcome::Success).await;
        let again = s.rerun_from(run.id, "map", T0 + 100).await.unwrap();
        assert!(matches!(again, RerunFrom::Rerun { .. }), "{again:?}");
        let parent = parent_of(s, run.id, "map").await;
        assert_eq!(
            parent.state, Running,
            "its items settle it, it runs nowhere"
        );
        let states: Vec<InstanceState> = items_of(s, run.id, "map")
            .await
            .into_iter()
            .map(|(_, _, state)| state)
            .collect();
        assert_eq!(
            states,
            vec![Waiting, Waiting],
            "every item again, none made anew"
        );
        assert_eq!(sink_state(s, run.id).await, Some(Pending));
        run_item_attempt(s, items[0].0, 2, Outcome::Success).await;
        run_item_attempt(s, items[1].0, 2, Outcome::Success).await;
        assert_eq!(parent_of(s, run.id, "map").await.state, Success);
        assert_eq!(sink_state(s, run.id).await, Some(Waiting));

        // Over the cap (5): FAILED before any item; nothing to retry or rerun as a plain task.
        let run = start_run(s, &wf).await;
        succeed_with(s, run.id, "list", &[("files", "[1, 2, 3, 4, 5, 6]")]).await;
        let refused = parent_of(s, run.id, "map").await;
        assert_eq!(refused.state, Failed);
        assert_eq!(
            s.retry_instance(refused.id, T0 + 200).await.unwrap(),
            ManualRetry::NotFannedOut
        );
        assert_eq!(
            s.rerun_from(run.id, "map", T0 + 200).await.unwrap(),
            RerunFrom::NotFannedOut
        );
        let rerun = s.rerun_failed(run.id, T0 + 200).await.unwrap().unwrap();
        assert!(rerun.retried.is_empty(), "{rerun:?}");
        assert_eq!(
            parent_of(s, run.id, "map").await.state,
            Failed,
            "left as it was"
        );
    }
}
