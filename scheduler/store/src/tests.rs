//! The store conformance suite: every scenario is written once against `dyn Store` and runs on
//! SQLite (a fresh file per test) and on MySQL/MariaDB when `AX_TEST_MYSQL_URL` is set (a fresh
//! database per test, dropped afterwards). Under `CI=true` a missing MySQL url fails the MySQL
//! variants instead of skipping them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ax_core::Millis;
use ax_core::decision::DecisionKind;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::run::RunState;
use ax_core::spec::{ScheduleSpec, TaskSpec, TriggerKind, WorkflowSpec};
use ax_core::state::{InstanceState, Outcome};

use crate::*;

#[macro_use]
mod support;

use support::*;

conformance!(
    apply_creates_then_keeps_then_updates_versions,
    workflow_heads_are_the_listed_workflows_without_their_specs,
    create_run_inserts_only_root_tasks,
    dedup_key_returns_the_existing_run,
    a_group_of_runs_is_created_in_order_and_an_error_creates_none,
    concurrent_creates_with_one_dedup_key_make_one_run,
    waiting_orders_by_priority_then_id_and_respects_backoff,
    mark_dispatched_is_a_conditional_claim,
    started_and_finished_end_a_one_task_run,
    rejected_dispatch_returns_to_waiting_and_reuses_its_attempt_row,
    heartbeat_applies_only_to_a_running_attempt,
    retry_with_backoff_keeps_every_attempt,
    spawn_failure_retries_then_fails,
    stale_report_changes_nothing,
    unknown_instance_is_not_found,
    diamond_creates_the_sink_only_after_both_branches,
    concurrent_fan_in_creates_the_sink_once,
    failure_leaves_downstream_uncreated_and_fails_the_run,
    run_counts_include_tasks_not_created,
    cancel_run_returns_live_attempts_and_ends_cancelled,
    active_counts_count_what_is_active_store_wide,
    cancel_instance_ends_the_run_when_nothing_is_left,
    logs_round_trip_in_chunks,
    schedules_are_due_and_advance_conditionally,
    pause_and_resume_keep_across_versions,
    workers_and_audit_round_trip,
    decisions_round_trip_by_workflow_and_slot,
    ids_are_unique_across_two_stores,
    advance_creates_exactly_the_ready_downstream_in_a_large_workflow,
    list_runs_newest_first_with_filters,
    a_manual_retry_reopens_the_run_and_keeps_the_history,
    rerun_failed_retries_the_failed_part_and_its_downstream_follows,
    active_attempts_list_what_is_on_workers_with_their_timeouts,
    a_report_from_another_worker_is_not_its_own,
    reports_and_lines_about_attempts_never_dispatched_to_their_worker_are_refused,
    thirty_megabytes_of_log_lines_go_in_one_append,
    a_fan_in_reached_in_one_batch_creates_the_sink_once_and_the_run_goes_on,
    one_batch_advancing_many_runs_creates_each_runs_ready_tasks_once,
    audit_rows_filter_by_action_target_and_actor,
    a_new_run_asked_for_gets_its_trigger_audit_row_with_it,
    runs_near_a_time_are_the_latest_before_and_the_earliest_after,
    rerun_from_a_task_reruns_it_and_its_downstream_keeping_history,
    a_rerun_task_that_fails_again_fails_the_run_with_the_rest_pending,
    rerun_from_refuses_unknown_tasks_and_active_instances,
    a_dependent_fires_once_every_upstream_succeeded_for_the_logical_time,
    a_paused_dependent_records_paused_and_creates_nothing,
    concurrent_upstream_successes_create_one_dependent_run,
    a_withdrawn_dispatch_waits_as_the_next_attempt_without_spending_a_retry,
    a_cancelled_attempt_records_how_its_worker_ended_it,
    a_withdrawal_that_finds_its_attempt_running_loses_it,
    a_withdrawal_decided_for_one_worker_spares_the_attempt_sent_to_another,
    a_withdrawal_of_an_earlier_dispatch_spares_the_same_attempt_sent_again,
    a_node_id_has_one_live_holder_on_the_database_clock,
    other_nodes_share_mysql_but_not_sqlite,
    an_expired_lease_is_free_to_claim,
);

mod scenarios {
    use super::*;

    mod dag;
    mod endings;
    mod nodes;
    pub(super) use dag::*;
    pub(super) use endings::*;
    pub(super) use nodes::*;

    pub(super) async fn workflow_heads_are_the_listed_workflows_without_their_specs(ctx: Ctx) {
        let s = ctx.s();
        let a = spec("b-second", vec![task("a", &[])]);
        let mut b = spec("a-first", vec![task("a", &[])]);
        b.app = "sales".into();
        apply(s, &a).await;
        apply(s, &b).await;
        let mut b2 = b.clone();
        b2.tasks.push(task("c", &["a"]));
        s.apply_workflow(&b2, "v2", None, T0 + 5).await.unwrap();
        s.set_paused("b-second", true, None, T0 + 6).await.unwrap();
        let heads = s.list_workflow_heads(None).await.unwrap();
        let listed = s.list_workflows(None).await.unwrap();
        assert_eq!(heads.len(), 2);
        for (head, record) in heads.iter().zip(&listed) {
            assert_eq!(
                (
                    head.id,
                    &head.name,
                    head.version,
                    head.paused,
                    head.created_at,
                    head.updated_at
                ),
                (
                    record.id,
                    &record.name,
                    record.version,
                    record.paused,
                    record.created_at,
                    record.updated_at
                )
            );
        }
        let names: Vec<(&str, u32, bool)> = heads
            .iter()
            .map(|h| (h.name.as_str(), h.version, h.paused))
            .collect();
        assert_eq!(names, vec![("a-first", 2, false), ("b-second", 1, true)]);
        let sales = s.list_workflow_heads(Some("sales")).await.unwrap();
        assert_eq!(sales.len(), 1);
        assert_eq!(sales[0].name, "a-first");
    }

    pub(super) async fn apply_creates_then_keeps_then_updates_versions(ctx: Ctx) {
        let s = ctx.s();
        let v1 = spec("daily", vec![task("a", &[]), task("b", &["a"])]);
        let (rec, outcome) = s.apply_workflow(&v1, "file v1", None, T0).await.unwrap();
        assert_eq!(outcome, ApplyOutcome::Created);
        assert_eq!(
            (rec.version, rec.name.as_str(), rec.source.as_str()),
            (1, "daily", "file v1")
        );
        assert_eq!(rec.spec, v1);
        assert!(!rec.paused);

        let (same, outcome) = s
            .apply_workflow(&v1, "file v1 again", None, T0 + 1)
            .await
            .unwrap();
        assert_eq!(outcome, ApplyOutcome::Unchanged);
        assert_eq!(
            (same.id, same.version, same.source.as_str()),
            (rec.id, 1, "file v1")
        );

        let mut v2 = v1.clone();
        v2.tasks.push(task("c", &["a", "b"]));
        let (rec2, outcome) = s
            .apply_workflow(&v2, "file v2", None, T0 + 2)
            .await
            .unwrap();
        assert_eq!(outcome, ApplyOutcome::Updated);
        assert_eq!((rec2.id, rec2.version), (rec.id, 2));
        assert_eq!(rec2.updated_at, T0 + 2);

        let latest = s.get_workflow("daily").await.unwrap().unwrap();
        assert_eq!((latest.version, latest.spec.tasks.len()), (2, 3));
        let old = s.get_workflow_version(rec.id, 1).await.unwrap().unwrap();
        assert_eq!(
            (old.version, old.spec.clone(), old.source.as_str()),
            (1, v1, "file v1")
        );
        assert!(s.get_workflow_version(rec.id, 3).await.unwrap().is_none());
        assert!(s.get_workflow("nope").await.unwrap().is_none());

        s.apply_workflow(&spec("other", vec![task("x", &[])]), "", None, T0)
            .await
            .unwrap();
        let mut misc = spec("zeta", vec![task("x", &[])]);
        misc.app = "misc".into();
        s.apply_workflow(&misc, "", None, T0).await.unwrap();
        let names: Vec<String> = s
            .list_workflows(None)
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(names, ["daily", "other", "zeta"]);
        let etl: Vec<String> = s
            .list_workflows(Some("etl"))
            .await
            .unwrap()
            .into_iter()
            .map(|w| w.name)
            .collect();
        assert_eq!(etl, ["daily", "other"]);

        // Runs of version 1 still see version 1's DAG after the update.
        let run = start_run(s, &old).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        run_task(s, run.id, "b", Outcome::Success).await;
        let run = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(run.state, RunState::Success);
    }

    pub(super) async fn create_run_inserts_only_root_tasks(ctx: Ctx) {
        let s = ctx.s();
        let mut root_b = task("b", &[]);
        root_b.priority = 7;
        let wf = apply(
            s,
            &spec("wf", vec![task("a", &[]), root_b, task("c", &["a", "b"])]),
        )
        .await;
        let run = start_run(s, &wf).await;
        assert_eq!(run.state, RunState::Running);
        assert_eq!((run.workflow.as_str(), run.workflow_version), ("wf", 1));
        assert_eq!(
            run.params.get("day").map(String::as_str),
            Some("2024-01-01")
        );
        assert_eq!(run.trigger, TriggerKind::Manual);
        assert_eq!(run.finished_at, None);
        let instances = s.list_instances(run.id).await.unwrap();
        let names: Vec<&str> = instances.iter().map(|i| i.task.as_str()).collect();
        assert_eq!(names.len(), 2);
        assert!(names.contains(&"a") && names.contains(&"b"));
        for inst in &instances {
            assert_eq!(inst.state, InstanceState::Waiting);
            assert_eq!(inst.attempt, Attempt::FIRST);
            assert_eq!((inst.run_id, inst.workflow.as_str()), (run.id, "wf"));
            assert_eq!(inst.priority, if inst.task == "b" { 7 } else { 0 });
        }
        assert_eq!(s.get_run(run.id).await.unwrap().unwrap(), run);
        let missing = NewRun {
            workflow_version: 9,
            ..new_run(&wf, None)
        };
        assert!(matches!(
            s.create_run(&missing).await,
            Err(StoreError::NotFound(_))
        ));
    }

    pub(super) async fn dedup_key_returns_the_existing_run(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let (first, created) = s.create_run(&new_run(&wf, Some("cron:1"))).await.unwrap();
        assert!(created);
        let (again, created) = s.create_run(&new_run(&wf, Some("cron:1"))).await.unwrap();
        assert!(!created);
        assert_eq!(again, first);
        assert_eq!(s.list_instances(first.id).await.unwrap().len(), 1);
        // Runs without a key never collide; another key is another run.
        let (a, ca) = s.create_run(&new_run(&wf, None)).await.unwrap();
        let (b, cb) = s.create_run(&new_run(&wf, None)).await.unwrap();
        let (c, cc) = s.create_run(&new_run(&wf, Some("cron:2"))).await.unwrap();
        assert!(ca && cb && cc);
        let ids: BTreeSet<RunId> = [first.id, a.id, b.id, c.id].into();
        assert_eq!(ids.len(), 4);
        assert_eq!(
            s.list_runs(Some("wf"), None, None, 100)
                .await
                .unwrap()
                .len(),
            4
        );
    }

    pub(super) async fn a_group_of_runs_is_created_in_order_and_an_error_creates_none(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &["a"])])).await;
        let (existing, _) = s.create_run(&new_run(&wf, Some("cron:1"))).await.unwrap();
        let group = [
            new_run(&wf, Some("cron:2")),
            new_run(&wf, Some("cron:1")),
            new_run(&wf, None),
            // A later run of the group sees an earlier one's key.
            new_run(&wf, Some("cron:2")),
        ];
        let created = s.create_runs(&group).await.unwrap();
        let flags: Vec<bool> = created.iter().map(|(_, new)| *new).collect();
        assert_eq!(flags, [true, false, true, false]);
        assert_eq!(created[1].0, existing);
        assert_eq!(created[3].0.id, created[0].0.id);
        assert!(
            created[0].0.id < created[2].0.id,
            "ids follow the group's order"
        );
        for (run, _) in &created {
            assert_eq!(tasks_of(s, run.id).await, BTreeSet::from(["a".to_string()]));
            // The answer is the run as stored.
            assert_eq!(s.get_run(run.id).await.unwrap().as_ref(), Some(run));
        }
        assert_eq!(
            s.list_runs(Some("wf"), None, None, 100)
                .await
                .unwrap()
                .len(),
            3
        );

        // A run of a version that does not exist fails the whole group: nothing of it is stored.
        let mut missing = new_run(&wf, Some("cron:3"));
        missing.workflow_version = 99;
        let error = s
            .create_runs(&[new_run(&wf, Some("cron:4")), missing])
            .await
            .expect_err("an unknown version fails the group");
        assert!(error.to_string().contains("version 99"), "{error}");
        assert_eq!(
            s.list_runs(Some("wf"), None, None, 100)
                .await
                .unwrap()
                .len(),
            3
        );
        assert!(s.create_runs(&[]).await.unwrap().is_empty());
    }

    pub(super) async fn concurrent_creates_with_one_dedup_key_make_one_run(ctx: Ctx) {
        let wf = apply(ctx.s(), &spec("wf", vec![task("a", &[]), task("b", &[])])).await;
        let barrier = Arc::new(tokio::sync::Barrier::new(8));
        let mut handles = Vec::new();
        for _ in 0..8 {
            let (store, barrier, run) = (
                ctx.store.clone(),
                barrier.clone(),
                new_run(&wf, Some("key:k1")),
            );
            handles.push(tokio::spawn(async move {
                barrier.wait().await;
                store.create_run(&run).await.expect("create run")
            }));
        }
        let mut ids = BTreeSet::new();
        let mut created = 0;
        for handle in handles {
            let (run, new) = handle.await.unwrap();
            ids.insert(run.id);
            created += usize::from(new);
        }
        assert_eq!((ids.len(), created), (1, 1));
        let runs = ctx
            .s()
            .list_runs(Some("wf"), None, None, 100)
            .await
            .unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(ctx.s().list_instances(runs[0].id).await.unwrap().len(), 2);
    }

    pub(super) async fn waiting_orders_by_priority_then_id_and_respects_backoff(ctx: Ctx) {
        let s = ctx.s();
        let mut hi = task("hi", &[]);
        hi.priority = 10;
        let mut lo = task("lo", &[]);
        lo.priority = -1;
        let mut flaky = task("flaky", &[]);
        flaky.priority = 20;
        flaky.retries = 1;
        flaky.retry_backoff_ms = 60_000;
        let wf = apply(s, &spec("wf", vec![lo, task("mid", &[]), hi, flaky])).await;
        let r1 = start_run(s, &wf).await;
        let r2 = start_run(s, &wf).await;
        // r1's flaky fails once: its retry waits out its backoff.
        run_task(s, r1.id, "flaky", Outcome::Failed).await;
        let waiting = s.waiting(T0 + 100, 100).await.unwrap();
        let order: Vec<(RunId, &str)> = waiting
            .iter()
            .map(|w| (w.instance.run_id, w.instance.task.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                (r2.id, "flaky"),
                (r1.id, "hi"),
                (r2.id, "hi"),
                (r1.id, "mid"),
                (r2.id, "mid"),
                (r1.id, "lo"),
                (r2.id, "lo"),
            ]
        );
        assert!(waiting.windows(2).all(|w| {
            let (a, b) = (&w[0].instance, &w[1].instance);
            a.priority > b.priority || (a.priority == b.priority && a.id < b.id)
        }));
        let first = &waiting[0];
        assert_eq!(first.logical_time, T0);
        assert_eq!(
            first.params.get("day").map(String::as_str),
            Some("2024-01-01")
        );
        assert_eq!(first.instance.workflow, "wf");
        assert_eq!(s.waiting(T0 + 100, 2).await.unwrap().len(), 2);
        // Two nodes' shares of the queue split it by instance id, each in the same order.
        for index in 0..2 {
            let share = crate::QueueShare { nodes: 2, index };
            let mine = s.waiting_share(T0 + 100, 100, share).await.unwrap();
            let expected: Vec<InstanceId> = waiting
                .iter()
                .map(|w| w.instance.id)
                .filter(|id| id.0 % 2 == i64::from(index))
                .collect();
            let got: Vec<InstanceId> = mine.iter().map(|w| w.instance.id).collect();
            assert_eq!(got, expected);
        }
        // After the longest possible backoff the retry is waiting too, first by priority.
        let later = s.waiting(T0 + 30 + 60_000, 100).await.unwrap();
        assert_eq!(later.len(), 8);
        assert_eq!(
            (later[0].instance.task.as_str(), later[0].instance.attempt),
            ("flaky", Attempt(2))
        );
    }

    pub(super) async fn mark_dispatched_is_a_conditional_claim(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        let b = instance_of(s, run.id, "b").await.unwrap();
        let won = s
            .mark_dispatched(&[
                claim(b.id, 1, "w1"),
                claim(a.id, 2, "w1"),
                claim(a.id, 1, "w2"),
            ])
            .await
            .unwrap();
        assert_eq!(won, [true, false, true], "a stale attempt loses");
        let again = s.mark_dispatched(&[claim(a.id, 1, "w3")]).await.unwrap();
        assert_eq!(again, [false], "a second claim of the same attempt loses");
        let a = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (a.state, a.worker_id.as_deref()),
            (InstanceState::Dispatched, Some("w2"))
        );
        let attempts = s.list_attempts(a.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(attempts[0].attempt, Attempt(1));
        assert_eq!(attempts[0].state, InstanceState::Dispatched);
        assert_eq!(attempts[0].worker_id.as_deref(), Some("w2"));
        assert_eq!(attempts[0].dispatched_at, Some(T0 + 10));
        assert!(s.waiting(T0, 10).await.unwrap().is_empty());
        assert_eq!(s.mark_dispatched(&[]).await.unwrap(), Vec::<bool>::new());
    }

    pub(super) async fn started_and_finished_end_a_one_task_run(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let inst = launch(s, run.id, "only").await;
        assert_eq!(inst.state, InstanceState::Running);
        assert_eq!(inst.started_at, Some(T0 + 20));
        assert_eq!(inst.worker_id.as_deref(), Some("w1"));
        // A repeated start of the running attempt (a worker re-attaching after a reconnect
        // replays it) is the same fact again: accepted, and it changes nothing.
        let dup = s
            .apply_reports(&[started(inst.id, 1)], T0 + 30)
            .await
            .unwrap();
        assert_eq!(dup, [ReportResult::Applied(Applied::default())]);
        let again = s.get_instance(inst.id).await.unwrap().unwrap();
        assert_eq!(again.started_at, Some(T0 + 20));
        assert_eq!(again.state, InstanceState::Running);

        let results = s
            .apply_reports(&[finished(inst.id, 1, Outcome::Success, 0)], T0 + 40)
            .await
            .unwrap();
        let applied = applied(&results[0]);
        assert!(applied.attempt_ended);
        assert_eq!(applied.new_waiting, 0);
        assert_eq!(applied.run_finished, Some((run.id, RunState::Success)));
        let inst = s.get_instance(inst.id).await.unwrap().unwrap();
        assert_eq!(
            (inst.state, inst.exit_code, inst.finished_at),
            (InstanceState::Success, Some(0), Some(T0 + 30))
        );
        let attempt = &s.list_attempts(inst.id).await.unwrap()[0];
        assert_eq!(attempt.state, InstanceState::Success);
        assert_eq!(
            (attempt.pid, attempt.exit_code, attempt.log_lines),
            (Some(4242), Some(0), 3)
        );
        assert_eq!(
            (attempt.started_at, attempt.finished_at),
            (Some(T0 + 20), Some(T0 + 30))
        );
        assert_eq!(attempt.message, "exit 0");
        let run = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            (run.state, run.finished_at),
            (RunState::Success, Some(T0 + 40))
        );
    }

    pub(super) async fn rejected_dispatch_returns_to_waiting_and_reuses_its_attempt_row(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        assert_eq!(
            s.mark_dispatched(&[claim(a.id, 1, "w1")]).await.unwrap(),
            [true]
        );
        let reject = Report::Rejected {
            instance_id: a.id,
            attempt: Attempt(1),
            worker_id: None,
            reason: "full".into(),
            withdrawn: false,
            dispatched_at: None,
        };
        let results = s
            .apply_reports(std::slice::from_ref(&reject), T0)
            .await
            .unwrap();
        assert_eq!(applied(&results[0]).new_waiting, 1);
        let now = s.get_instance(a.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt, now.worker_id),
            (InstanceState::Waiting, Attempt(1), None)
        );
        // Rejecting again is stale: it is no longer dispatched.
        let again = s.apply_reports(&[reject], T0).await.unwrap();
        assert_eq!(
            again,
            [ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Waiting
            }]
        );
        assert_eq!(
            s.mark_dispatched(&[claim(a.id, 1, "w2")]).await.unwrap(),
            [true]
        );
        let attempts = s.list_attempts(a.id).await.unwrap();
        assert_eq!(attempts.len(), 1);
        assert_eq!(
            (attempts[0].state, attempts[0].worker_id.as_deref()),
            (InstanceState::Dispatched, Some("w2"))
        );
        assert_eq!(attempts[0].message, "");
    }

    pub(super) async fn heartbeat_applies_only_to_a_running_attempt(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let a = instance_of(s, run.id, "a").await.unwrap();
        let beat = |attempt| Report::TaskHeartbeat {
            instance_id: a.id,
            attempt: Attempt(attempt),
            worker_id: None,
            at: T0 + 50,
        };
        let early = s.apply_reports(&[beat(1)], T0).await.unwrap();
        assert_eq!(
            early,
            [ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Waiting
            }]
        );
        launch(s, run.id, "a").await;
        let results = s.apply_reports(&[beat(1), beat(2)], T0).await.unwrap();
        assert_eq!(results[0], ReportResult::Applied(Applied::default()));
        assert_eq!(
            results[1],
            ReportResult::Stale {
                current_attempt: Attempt(1),
                state: InstanceState::Running
            }
        );
    }

    pub(super) async fn retry_with_backoff_keeps_every_attempt(ctx: Ctx) {
        let s = ctx.s();
        let mut flaky = task("flaky", &[]);
        flaky.retries = 2;
        flaky.retry_backoff_ms = 1_000;
        let wf = apply(s, &spec("wf", vec![flaky, task("after", &["flaky"])])).await;
        let run = start_run(s, &wf).await;
        let inst = launch(s, run.id, "flaky").await;
        let fail = Report::Finished {
            instance_id: inst.id,
            attempt: Attempt(1),
            worker_id: None,
            end: AttemptEnd::Finished(Outcome::Timeout),
            exit_code: None,
            signal: Some(9),
            at: T0 + 30,
            log_lines: 7,
            message: "killed after timeout".into(),
        };
        let results = s.apply_reports(&[fail], T0 + 100).await.unwrap();
        let applied1 = applied(&results[0]);
        assert_eq!(
            (
                applied1.new_waiting,
                applied1.attempt_ended,
                applied1.run_finished
            ),
            (1, true, None)
        );
        assert_eq!(
            (applied1.attempt_state, applied1.retry_scheduled),
            (Some(InstanceState::Timeout), true)
        );
        let now = s.get_instance(inst.id).await.unwrap().unwrap();
        assert_eq!(
            (now.state, now.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        // Backoff: 1 s × jitter in [0.5, 1.0] from the report's `now`.
        assert!(
            (T0 + 600..=T0 + 1_100).contains(&now.not_before),
            "{}",
            now.not_before
        );
        assert_eq!((now.worker_id, now.started_at), (None, None));
        assert!(s.waiting(T0 + 100, 10).await.unwrap().is_empty());
        assert_eq!(s.waiting(T0 + 1_100, 10).await.unwrap().len(), 1);
        assert_eq!(
            s.list_attempts(inst.id).await.unwrap().len(),
            1,
            "no row before dispatch"
        );

        run_task(s, run.id, "flaky", Outcome::Success).await;
        let attempts = s.list_attempts(inst.id).await.unwrap();
        assert_eq!(attempts.len(), 2);
        // The run's attempts: both of flaky's, then after's (still to run: none), in order.
        run_task(s, run.id, "after", Outcome::Success).await;
        let after = instance_of(s, run.id, "after").await.unwrap().id;
        let of_run: Vec<(InstanceId, Attempt)> = s
            .list_run_attempts(run.id)
            .await
            .unwrap()
            .iter()
            .map(|a| (a.instance_id, a.attempt))
            .collect();
        assert_eq!(
            of_run,
            [
                (inst.id, Attempt(1)),
                (inst.id, Attempt(2)),
                (after, Attempt(1))
            ]
        );
        assert!(
            s.list_run_attempts(RunId(999_999))
                .await
                .unwrap()
                .is_empty()
        );
        let (first, second) = (&attempts[0], &attempts[1]);
        assert_eq!(
            (first.attempt, first.state),
            (Attempt(1), InstanceState::Timeout)
        );
        assert_eq!(
            (first.exit_code, first.signal, first.log_lines),
            (None, Some(9), 7)
        );
        assert_eq!(first.message, "killed after timeout");
        assert_eq!(
            (second.attempt, second.state, second.exit_code),
            (Attempt(2), InstanceState::Success, Some(0))
        );
        assert!(instance_of(s, run.id, "after").await.is_some());
    }

    pub(super) async fn spawn_failure_retries_then_fails(ctx: Ctx) {
        let s = ctx.s();
        let mut t = task("t", &[]);
        t.retries = 1;
        let wf = apply(s, &spec("wf", vec![t])).await;
        let run = start_run(s, &wf).await;
        let spawn_failed = |id, attempt| Report::Finished {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: None,
            end: AttemptEnd::SpawnFailed,
            exit_code: None,
            signal: None,
            at: T0 + 5,
            log_lines: 0,
            message: "no such file".into(),
        };
        let inst = instance_of(s, run.id, "t").await.unwrap();
        s.mark_dispatched(&[claim(inst.id, 1, "w1")]).await.unwrap();
        let r = s
            .apply_reports(&[spawn_failed(inst.id, 1)], T0)
            .await
            .unwrap();
        assert_eq!(applied(&r[0]).new_waiting, 1);
        s.mark_dispatched(&[claim(inst.id, 2, "w1")]).await.unwrap();
        let r = s
            .apply_reports(&[spawn_failed(inst.id, 2)], T0)
            .await
            .unwrap();
        assert_eq!(
            applied(&r[0]).run_finished,
            Some((run.id, RunState::Failed))
        );
        let attempts = s.list_attempts(inst.id).await.unwrap();
        assert!(
            attempts
                .iter()
                .all(|a| a.state == InstanceState::Failed && a.message == "no such file")
        );
        assert_eq!(attempts.len(), 2);
    }

    pub(super) async fn stale_report_changes_nothing(ctx: Ctx) {
        let s = ctx.s();
        let mut t = task("t", &[]);
        t.retries = 1;
        let wf = apply(s, &spec("wf", vec![t])).await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "t", Outcome::Failed).await;
        let inst = instance_of(s, run.id, "t").await.unwrap();
        assert_eq!(inst.attempt, Attempt(2));
        let before = (
            s.get_instance(inst.id).await.unwrap(),
            s.list_attempts(inst.id).await.unwrap(),
        );
        let old = [
            started(inst.id, 1),
            finished(inst.id, 1, Outcome::Success, 0),
            Report::TaskHeartbeat {
                instance_id: inst.id,
                attempt: Attempt(1),
                worker_id: None,
                at: T0,
            },
            Report::Rejected {
                instance_id: inst.id,
                attempt: Attempt(1),
                worker_id: None,
                reason: String::new(),
                withdrawn: false,
                dispatched_at: None,
            },
        ];
        let results = s.apply_reports(&old, T0 + 500).await.unwrap();
        let stale = ReportResult::Stale {
            current_attempt: Attempt(2),
            state: InstanceState::Waiting,
        };
        assert_eq!(results, vec![stale; 4]);
        // A report for the current attempt in the wrong state is stale too.
        let wrong = s
            .apply_reports(&[finished(inst.id, 2, Outcome::Success, 0)], T0)
            .await
            .unwrap();
        assert_eq!(
            wrong,
            [ReportResult::Stale {
                current_attempt: Attempt(2),
                state: InstanceState::Waiting
            }]
        );
        let after = (
            s.get_instance(inst.id).await.unwrap(),
            s.list_attempts(inst.id).await.unwrap(),
        );
        assert_eq!(before, after);
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
    }

    pub(super) async fn unknown_instance_is_not_found(ctx: Ctx) {
        let s = ctx.s();
        let ghost = InstanceId(987_654_321);
        let results = s
            .apply_reports(
                &[started(ghost, 1), finished(ghost, 1, Outcome::Success, 0)],
                T0,
            )
            .await
            .unwrap();
        // A worker's report about it is about an attempt never dispatched to that worker; the
        // node's own verdict (no worker named) finds nothing.
        assert_eq!(results, [ReportResult::NotYours, ReportResult::NotFound]);
        assert_eq!(
            s.mark_dispatched(&[claim(ghost, 1, "w")]).await.unwrap(),
            [false]
        );
        assert!(s.get_instance(ghost).await.unwrap().is_none());
        assert!(s.cancel_instance(ghost, T0).await.unwrap().is_none());
        assert!(s.cancel_run(RunId(424_242), T0).await.unwrap().is_none());
        assert!(matches!(
            s.run_counts(RunId(424_242)).await,
            Err(StoreError::NotFound(_))
        ));
    }

    pub(super) async fn diamond_creates_the_sink_only_after_both_branches(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "diamond",
                vec![
                    task("a", &[]),
                    task("b", &["a"]),
                    task("c", &["a"]),
                    task("d", &["b", "c"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        assert_eq!(tasks_of(s, run.id).await, BTreeSet::from(["a".to_string()]));
        let after_a = run_task(s, run.id, "a", Outcome::Success).await;
        assert_eq!((after_a.new_waiting, after_a.run_finished), (2, None));
        assert_eq!(tasks_of(s, run.id).await.len(), 3);
        let after_b = run_task(s, run.id, "b", Outcome::Success).await;
        assert_eq!(after_b.new_waiting, 0);
        assert!(instance_of(s, run.id, "d").await.is_none(), "d waits for c");
        let after_c = run_task(s, run.id, "c", Outcome::Success).await;
        assert_eq!(after_c.new_waiting, 1);
        let d = instance_of(s, run.id, "d").await.expect("d created");
        assert_eq!((d.state, d.attempt), (InstanceState::Waiting, Attempt(1)));
        let after_d = run_task(s, run.id, "d", Outcome::Success).await;
        assert_eq!(after_d.run_finished, Some((run.id, RunState::Success)));
    }

    pub(super) async fn concurrent_fan_in_creates_the_sink_once(ctx: Ctx) {
        let s = ctx.s();
        let mut tasks: Vec<TaskSpec> = (0..8).map(|i| task(&format!("u{i}"), &[])).collect();
        let ups: Vec<String> = (0..8).map(|i| format!("u{i}")).collect();
        let ups: Vec<&str> = ups.iter().map(String::as_str).collect();
        tasks.push(task("sink", &ups));
        let wf = apply(s, &spec("fan", tasks)).await;
        for round in 0..3 {
            let run = start_run(s, &wf).await;
            let mut running = Vec::new();
            for up in &ups {
                running.push(launch(s, run.id, up).await);
            }
            let mut created = 0;
            for results in finish_at_once(&ctx.store, running).await {
                created += applied(&results[0]).new_waiting;
            }
            assert_eq!(
                created, 1,
                "round {round}: the sink is created exactly once"
            );
            let sinks = s.list_instances(run.id).await.unwrap();
            assert_eq!(sinks.iter().filter(|i| i.task == "sink").count(), 1);
            let done = run_task(s, run.id, "sink", Outcome::Success).await;
            assert_eq!(done.run_finished, Some((run.id, RunState::Success)));
        }
    }

    pub(super) async fn failure_leaves_downstream_uncreated_and_fails_the_run(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("a", &[]),
                    task("bad", &["a"]),
                    task("below", &["bad"]),
                    task("good", &["a"]),
                    task("good2", &["good"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        let failed = run_task(s, run.id, "bad", Outcome::Failed).await;
        assert_eq!(
            (
                failed.new_waiting,
                failed.run_finished,
                failed.attempt_ended
            ),
            (0, None, true)
        );
        assert_eq!(
            (failed.attempt_state, failed.retry_scheduled),
            (Some(InstanceState::Failed), false)
        );
        assert!(instance_of(s, run.id, "below").await.is_none());
        let good = run_task(s, run.id, "good", Outcome::Success).await;
        assert_eq!(
            (good.new_waiting, good.run_finished),
            (1, None),
            "the other branch goes on"
        );
        let last = run_task(s, run.id, "good2", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Failed)));
        assert!(instance_of(s, run.id, "below").await.is_none());
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!(
            (counts.success, counts.failed, counts.not_created),
            (3, 1, 1)
        );
        let failed_runs = s
            .list_runs(None, Some(RunState::Failed), None, 10)
            .await
            .unwrap();
        assert_eq!(failed_runs.len(), 1);
    }

    pub(super) async fn run_counts_include_tasks_not_created(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("a", &[]),
                    task("b", &[]),
                    task("c", &[]),
                    task("d", &["a"]),
                    task("e", &["d"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        launch(s, run.id, "b").await;
        let c = instance_of(s, run.id, "c").await.unwrap();
        s.mark_dispatched(&[claim(c.id, 1, "w1")]).await.unwrap();
        let counts = s.run_counts(run.id).await.unwrap();
        assert_eq!(
            counts,
            InstanceCounts {
                waiting: 1,
                dispatched: 1,
                running: 1,
                success: 1,
                not_created: 1,
                ..InstanceCounts::default()
            }
        );
        // Several runs in one read: each as alone; an unknown run is left out.
        let second = start_run(s, &wf).await;
        let many = s
            .runs_counts(&[run.id, second.id, RunId(424_242)])
            .await
            .unwrap();
        assert_eq!(many.len(), 2);
        assert_eq!(many[&run.id], counts);
        assert_eq!(many[&second.id], s.run_counts(second.id).await.unwrap());
        assert_eq!(many[&second.id].waiting, 3);
        assert!(s.runs_counts(&[]).await.unwrap().is_empty());
    }

    pub(super) async fn active_counts_count_what_is_active_store_wide(ctx: Ctx) {
        let s = ctx.s();
        assert_eq!(s.active_counts().await.unwrap(), ActiveCounts::default());
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("done", &[]),
                    task("run", &[]),
                    task("disp", &[]),
                    task("wait", &[]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "done", Outcome::Success).await;
        launch(s, run.id, "run").await;
        let disp = instance_of(s, run.id, "disp").await.unwrap();
        s.mark_dispatched(&[claim(disp.id, 1, "w2")]).await.unwrap();
        assert_eq!(
            s.active_counts().await.unwrap(),
            ActiveCounts {
                waiting: 1,
                dispatched: 1,
                running: 1,
                queued_runs: 0,
                running_runs: 1,
                // The one WAITING instance was created with the run.
                oldest_ready_since: Some(T0),
            }
        );
        s.cancel_run(run.id, T0 + 99).await.unwrap();
        assert_eq!(s.active_counts().await.unwrap(), ActiveCounts::default());
    }

    pub(super) async fn cancel_run_returns_live_attempts_and_ends_cancelled(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("done", &[]),
                    task("run", &[]),
                    task("disp", &[]),
                    task("wait", &[]),
                    task("later", &["done"]),
                ],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "done", Outcome::Success).await;
        let running = launch(s, run.id, "run").await;
        let disp = instance_of(s, run.id, "disp").await.unwrap();
        s.mark_dispatched(&[claim(disp.id, 1, "w2")]).await.unwrap();
        let killed = s
            .cancel_run(run.id, T0 + 99)
            .await
            .unwrap()
            .expect("run exists");
        let mut killed: Vec<(InstanceId, Attempt, Option<String>)> = killed
            .into_iter()
            .map(|k| (k.instance_id, k.attempt, k.worker_id))
            .collect();
        killed.sort();
        let mut want = vec![
            (running.id, Attempt(1), Some("w1".to_string())),
            (disp.id, Attempt(1), Some("w2".to_string())),
        ];
        want.sort();
        assert_eq!(killed, want);
        let run_now = s.get_run(run.id).await.unwrap().unwrap();
        assert_eq!(
            (run_now.state, run_now.cancel_requested, run_now.finished_at),
            (RunState::Cancelled, true, Some(T0 + 99))
        );
        for inst in s.list_instances(run.id).await.unwrap() {
            let want = if inst.task == "done" {
                InstanceState::Success
            } else {
                InstanceState::Cancelled
            };
            assert_eq!(inst.state, want, "{}", inst.task);
        }
        for id in [running.id, disp.id] {
            let attempt = &s.list_attempts(id).await.unwrap()[0];
            assert_eq!(
                (attempt.state, attempt.finished_at),
                (InstanceState::Cancelled, Some(T0 + 99))
            );
        }
        // The killed process's late report is stale; cancelling again is a no-op.
        let late = s
            .apply_reports(&[finished(running.id, 1, Outcome::Success, 0)], T0)
            .await
            .unwrap();
        assert!(matches!(
            late[0],
            ReportResult::Stale {
                state: InstanceState::Cancelled,
                ..
            }
        ));
        assert_eq!(
            s.cancel_run(run.id, T0 + 100).await.unwrap(),
            Some(Vec::new())
        );
        assert!(s.waiting(T0 + 1_000, 10).await.unwrap().is_empty());
    }

    pub(super) async fn cancel_instance_ends_the_run_when_nothing_is_left(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[]), task("b", &[])])).await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        let b = launch(s, run.id, "b").await;
        let (record, killed) = s
            .cancel_instance(b.id, T0 + 7)
            .await
            .unwrap()
            .expect("exists");
        assert_eq!(
            (record.state, record.finished_at),
            (InstanceState::Cancelled, Some(T0 + 7))
        );
        assert_eq!(
            killed,
            Some(CancelledAttempt {
                instance_id: b.id,
                attempt: Attempt(1),
                worker_id: Some("w1".into())
            })
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Cancelled
        );
        // Cancelling a finished instance changes nothing and kills nothing.
        let (again, none) = s.cancel_instance(b.id, T0 + 8).await.unwrap().unwrap();
        assert_eq!((again.finished_at, none), (Some(T0 + 7), None));

        // A waiting instance has no attempt to kill, and the run goes on while others run.
        let run2 = start_run(s, &wf).await;
        let a2 = instance_of(s, run2.id, "a").await.unwrap();
        let (_, killed) = s.cancel_instance(a2.id, T0).await.unwrap().unwrap();
        assert_eq!(killed, None);
        assert_eq!(
            s.get_run(run2.id).await.unwrap().unwrap().state,
            RunState::Running
        );
    }

    pub(super) async fn logs_round_trip_in_chunks(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let id = instance_of(s, run.id, "a").await.unwrap().id;
        let odd = "tab\there \u{1F600} \u{FFFD} caf\u{e9} \\n not a newline \u{0} nul";
        let chunk = |first: u64, lines: Vec<(LogStream, String)>, at: Millis| {
            LogChunk::from_lines(id, Attempt(1), first, lines, at)
        };
        let c1 = chunk(
            1,
            vec![
                (LogStream::Stdout, "line 1".into()),
                (LogStream::Stderr, "err 2".into()),
                (LogStream::Stdout, String::new()),
            ],
            T0 + 1,
        );
        let c2 = chunk(
            4,
            vec![
                (LogStream::Stdout, odd.into()),
                (LogStream::Stderr, "err 5".into()),
            ],
            T0 + 2,
        );
        let c3 = chunk(
            6,
            (6..=1_005)
                .map(|i| (LogStream::Stdout, format!("bulk {i}")))
                .collect(),
            T0 + 3,
        );
        let other_attempt = LogChunk {
            attempt: Attempt(2),
            ..chunk(1, vec![(LogStream::Stdout, "attempt 2".into())], T0)
        };
        s.append_logs(&[c2.clone(), c1.clone()]).await.unwrap();
        s.append_logs(&[c3, other_attempt]).await.unwrap();
        // A resend of the same chunk (even with other content) is ignored.
        let resend = chunk(1, vec![(LogStream::Stdout, "changed".into())], T0 + 9);
        s.append_logs(&[resend, c1]).await.unwrap();
        s.append_logs(&[]).await.unwrap();

        let all = s.read_logs(id, Attempt(1), 0, 10_000).await.unwrap();
        assert_eq!(all.len(), 1_005);
        assert!(
            all.iter()
                .enumerate()
                .all(|(i, line)| line.seq == i as u64 + 1)
        );
        assert_eq!(
            (all[0].text.as_str(), all[0].stream, all[0].at),
            ("line 1", LogStream::Stdout, T0 + 1)
        );
        assert_eq!(
            (all[1].text.as_str(), all[1].stream),
            ("err 2", LogStream::Stderr)
        );
        assert_eq!(all[2].text, "");
        assert_eq!(
            (all[3].text.as_str(), all[3].stream, all[3].at),
            (odd, LogStream::Stdout, T0 + 2)
        );
        assert_eq!(
            (all[4].text.as_str(), all[4].stream),
            ("err 5", LogStream::Stderr)
        );
        assert_eq!(all[1_004].text, "bulk 1005");

        let page = s.read_logs(id, Attempt(1), 2, 3).await.unwrap();
        let seqs: Vec<u64> = page.iter().map(|l| l.seq).collect();
        assert_eq!(seqs, [3, 4, 5]);
        let tail = s.read_logs(id, Attempt(1), 1_000, 100).await.unwrap();
        assert_eq!(
            tail.iter().map(|l| l.seq).collect::<Vec<_>>(),
            [1_001, 1_002, 1_003, 1_004, 1_005]
        );
        assert!(
            s.read_logs(id, Attempt(1), 1_005, 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(s.read_logs(id, Attempt(1), 0, 0).await.unwrap().is_empty());
        let second = s.read_logs(id, Attempt(2), 0, 10).await.unwrap();
        assert_eq!(second.len(), 1);
        assert_eq!(second[0].text, "attempt 2");
        assert!(s.read_logs(id, Attempt(3), 0, 10).await.unwrap().is_empty());
        assert_eq!(s.last_log_seq(id, Attempt(1)).await.unwrap(), 1_005);
        assert_eq!(s.last_log_seq(id, Attempt(2)).await.unwrap(), 1);
        assert_eq!(s.last_log_seq(id, Attempt(3)).await.unwrap(), 0);

        // Many chunks in one call go in several statements.
        let many: Vec<LogChunk> = (0..1_200u64)
            .map(|i| LogChunk {
                attempt: Attempt(5),
                ..chunk(i + 1, vec![(LogStream::Stderr, format!("n{i}"))], T0)
            })
            .collect();
        s.append_logs(&many).await.unwrap();
        let read = s.read_logs(id, Attempt(5), 1_150, 1_000).await.unwrap();
        assert_eq!(read.len(), 50);
        assert_eq!(read[0].text, "n1150");

        // Packed lines, as a worker sends them, read back line by line; a newline inside a
        // separate line is replaced, so it cannot shift the lines after it.
        let packed = LogChunk::packed(
            id,
            Attempt(6),
            1,
            vec![LogStream::Stdout, LogStream::Stderr, LogStream::Stdout],
            "first\n\nthird".into(),
            T0,
        )
        .expect("three lines, two breaks");
        let split = LogChunk::from_lines(id, Attempt(6), 4, [(LogStream::Stdout, "a\nb")], T0);
        assert_eq!(split.body(), "a b");
        s.append_logs(&[packed, split]).await.unwrap();
        let read = s.read_logs(id, Attempt(6), 0, 10).await.unwrap();
        let texts: Vec<(LogStream, &str)> =
            read.iter().map(|l| (l.stream, l.text.as_str())).collect();
        assert_eq!(
            texts,
            [
                (LogStream::Stdout, "first"),
                (LogStream::Stderr, ""),
                (LogStream::Stdout, "third"),
                (LogStream::Stdout, "a b"),
            ]
        );
        let mispacked = LogChunk::packed(
            id,
            Attempt(6),
            5,
            vec![LogStream::Stdout],
            "x\ny".into(),
            T0,
        );
        assert_eq!(
            mispacked,
            Err(MispackedLines {
                lines: 1,
                newlines: 1
            })
        );
        assert!(
            LogChunk::packed(id, Attempt(6), 5, Vec::new(), "text".into(), T0).is_err(),
            "text without lines is refused"
        );
    }

    pub(super) async fn schedules_are_due_and_advance_conditionally(ctx: Ctx) {
        let s = ctx.s();
        let mut cron = spec("nightly", vec![task("a", &[])]);
        cron.schedule = ScheduleSpec {
            trigger: TriggerKind::Cron,
            cron: Some("0 0 2 * * *".into()),
            timezone: "Asia/Shanghai".into(),
            ..ScheduleSpec::default()
        };
        let (wf, _) = s
            .apply_workflow(&cron, "", Some(T0 + 1_000), T0)
            .await
            .unwrap();
        s.apply_workflow(&spec("manual", vec![task("a", &[])]), "", None, T0)
            .await
            .unwrap();
        let mut later = cron.clone();
        later.name = "later".into();
        s.apply_workflow(&later, "", Some(T0 + 5_000), T0)
            .await
            .unwrap();

        assert!(s.due_schedules(T0 + 999, 10).await.unwrap().is_empty());
        let due = s.due_schedules(T0 + 1_000, 10).await.unwrap();
        assert_eq!(
            due,
            [DueSchedule {
                workflow_id: wf.id,
                workflow: "nightly".into(),
                workflow_version: 1,
                cron: "0 0 2 * * *".into(),
                timezone: "Asia/Shanghai".into(),
                next_fire_at: T0 + 1_000,
            }]
        );
        assert_eq!(s.due_schedules(T0 + 10_000, 10).await.unwrap().len(), 2);
        assert_eq!(s.due_schedules(T0 + 10_000, 1).await.unwrap().len(), 1);

        assert!(
            s.advance_schedule(wf.id, T0 + 1_000, T0 + 2_000)
                .await
                .unwrap()
        );
        assert!(
            !s.advance_schedule(wf.id, T0 + 1_000, T0 + 3_000)
                .await
                .unwrap(),
            "someone else advanced it"
        );
        let due = s.due_schedules(T0 + 2_000, 10).await.unwrap();
        assert_eq!(due[0].next_fire_at, T0 + 2_000);
        // In a group, each move is conditional on its own.
        assert_eq!(
            s.advance_schedules(&[
                (wf.id, T0 + 2_000, T0 + 2_500),
                (wf.id, T0 + 2_000, T0 + 9_000)
            ])
            .await
            .unwrap(),
            [true, false]
        );
        assert!(
            s.advance_schedule(wf.id, T0 + 2_500, T0 + 2_000)
                .await
                .unwrap()
        );

        // An unchanged apply keeps the stored fire time; a new version replaces it and is the
        // version a due schedule names.
        s.apply_workflow(&cron, "", Some(T0 + 50_000), T0)
            .await
            .unwrap();
        assert_eq!(s.due_schedules(T0 + 2_000, 10).await.unwrap().len(), 1);
        let mut v2 = cron.clone();
        v2.tasks.push(task("b", &["a"]));
        s.apply_workflow(&v2, "", Some(T0 + 3_000), T0)
            .await
            .unwrap();
        assert!(
            s.due_schedules(T0 + 2_999, 10)
                .await
                .unwrap()
                .iter()
                .all(|d| d.workflow != "nightly")
        );
        let due = s.due_schedules(T0 + 3_000, 10).await.unwrap();
        let nightly = due.iter().find(|d| d.workflow == "nightly").unwrap();
        assert_eq!(
            (nightly.workflow_version, nightly.next_fire_at),
            (2, T0 + 3_000)
        );
    }

    pub(super) async fn pause_and_resume_keep_across_versions(ctx: Ctx) {
        let s = ctx.s();
        let mut cron = spec("nightly", vec![task("a", &[])]);
        cron.schedule = ScheduleSpec {
            trigger: TriggerKind::Cron,
            cron: Some("0 * * * *".into()),
            timezone: "UTC".into(),
            ..ScheduleSpec::default()
        };
        s.apply_workflow(&cron, "", Some(T0), T0).await.unwrap();
        let paused = s
            .set_paused("nightly", true, None, T0 + 1)
            .await
            .unwrap()
            .unwrap();
        assert!(paused.paused);
        assert_eq!(paused.updated_at, T0 + 1);
        assert!(s.due_schedules(T0 + 10, 10).await.unwrap().is_empty());
        let mut v2 = cron.clone();
        v2.description = "changed".into();
        let (rec, outcome) = s
            .apply_workflow(&v2, "", Some(T0 + 5), T0 + 2)
            .await
            .unwrap();
        assert_eq!(outcome, ApplyOutcome::Updated);
        assert!(rec.paused, "pausing keeps across versions");
        assert!(s.due_schedules(T0 + 10, 10).await.unwrap().is_empty());
        let resumed = s
            .set_paused("nightly", false, Some(T0 + 100), T0 + 3)
            .await
            .unwrap()
            .unwrap();
        assert!(!resumed.paused);
        assert!(s.due_schedules(T0 + 99, 10).await.unwrap().is_empty());
        assert_eq!(
            s.due_schedules(T0 + 100, 10).await.unwrap()[0].next_fire_at,
            T0 + 100
        );
        assert!(
            s.set_paused("ghost", true, None, T0)
                .await
                .unwrap()
                .is_none()
        );
        assert!(!s.list_workflows(None).await.unwrap()[0].paused);
    }

    pub(super) async fn workers_and_audit_round_trip(ctx: Ctx) {
        let s = ctx.s();
        let mut w = WorkerRecord {
            id: "host-1:77".into(),
            version: "0.1.0".into(),
            hostname: "host-1".into(),
            labels: BTreeMap::from([("gpu".to_string(), "a100".to_string())]),
            capacity: 20,
            running: 3,
            started_at: T0,
            last_heartbeat: T0 + 5_000,
            node_id: "sched-a".into(),
            draining: false,
            connected: true,
            apps: Some(vec!["finance".into(), "sales".into()]),
            incarnation: "f00d".into(),
        };
        s.upsert_workers(std::slice::from_ref(&w)).await.unwrap();
        let other = WorkerRecord {
            id: "a-first".into(),
            labels: BTreeMap::new(),
            apps: None,
            incarnation: String::new(),
            ..w.clone()
        };
        s.upsert_workers(std::slice::from_ref(&other))
            .await
            .unwrap();
        w.running = 0;
        w.draining = true;
        w.connected = false;
        w.last_heartbeat = T0 + 10_000;
        s.upsert_workers(std::slice::from_ref(&w)).await.unwrap();
        assert_eq!(s.list_workers().await.unwrap(), [other.clone(), w.clone()]);

        // One save of many rows: new and existing workers, one of them listed twice (its last
        // record stays), in an order that is not the ids'.
        let mut many: Vec<WorkerRecord> = (0..300)
            .rev()
            .map(|n| WorkerRecord {
                id: format!("sim-{n:03}"),
                running: n,
                ..other.clone()
            })
            .collect();
        let mut w_again = w.clone();
        w_again.connected = true;
        w_again.last_heartbeat = T0 + 15_000;
        many.insert(7, w.clone());
        many.push(w_again.clone());
        s.upsert_workers(&many).await.unwrap();
        s.upsert_workers(&[]).await.unwrap();
        let listed = s.list_workers().await.unwrap();
        assert_eq!(listed.len(), 302);
        assert_eq!(listed[0], other);
        assert_eq!(listed[1], w_again);
        assert_eq!(listed[2].id, "sim-000");
        assert_eq!(listed[301].running, 299);

        // A save that arrives late from another node (older heartbeat) changes nothing: the
        // worker's row stays the one from the node it is connected to now.
        let late = WorkerRecord {
            node_id: "sched-b".into(),
            connected: false,
            last_heartbeat: T0 + 12_000,
            ..w_again.clone()
        };
        s.upsert_workers(std::slice::from_ref(&late)).await.unwrap();
        assert_eq!(s.list_workers().await.unwrap()[1], w_again);
        // One row by id: its apps and incarnation as saved (none: every app).
        assert_eq!(s.worker("host-1:77").await.unwrap(), Some(w_again.clone()));
        assert_eq!(s.worker("a-first").await.unwrap().unwrap().apps, None);
        assert_eq!(s.worker("nobody").await.unwrap(), None);
        let moved = WorkerRecord {
            incarnation: "beef".into(),
            apps: Some(vec!["hr".into()]),
            last_heartbeat: T0 + 16_000,
            ..w_again.clone()
        };
        s.upsert_workers(std::slice::from_ref(&moved))
            .await
            .unwrap();
        assert_eq!(s.worker("host-1:77").await.unwrap(), Some(moved));

        let audit = |at, action: &str| AuditRecord {
            at,
            actor: "alice".into(),
            action: action.into(),
            target: "workflow/daily".into(),
            detail: r#"{"version":2,"note":"caf\u00e9 \ud83d\ude00"}"#.into(),
            remote: "10.0.0.1:5555".into(),
            token: "deploy-bot".into(),
        };
        s.insert_audit(&audit(T0, "apply")).await.unwrap();
        s.insert_audits(&[audit(T0 + 2, "pause"), audit(T0 + 1, "trigger")])
            .await
            .unwrap();
        s.insert_audits(&[]).await.unwrap();
        let listed = s.list_audit(10).await.unwrap();
        assert_eq!(
            listed,
            [
                audit(T0 + 2, "pause"),
                audit(T0 + 1, "trigger"),
                audit(T0, "apply")
            ]
        );
        assert_eq!(s.list_audit(1).await.unwrap().len(), 1);
    }

    pub(super) async fn decisions_round_trip_by_workflow_and_slot(ctx: Ctx) {
        let s = ctx.s();
        let a = apply(s, &spec("a", vec![task("t", &[])])).await;
        let b = apply(s, &spec("b", vec![task("t", &[])])).await;
        let decision = |wf: &WorkflowRecord, slot_at, kind, detail: &str| DecisionRecord {
            at: T0 + 100,
            workflow_id: wf.id,
            slot_at,
            run_id: None,
            instance_id: None,
            task: None,
            kind,
            detail: detail.into(),
            node_id: "sched-a".into(),
        };
        let fired = DecisionRecord {
            run_id: Some(RunId(7)),
            instance_id: Some(InstanceId(9)),
            task: Some("t".into()),
            ..decision(&a, T0, DecisionKind::Fired, "cron slot")
        };
        let later = decision(
            &a,
            T0 + 60_000,
            DecisionKind::SkippedOverlap,
            "run 7 active",
        );
        let earlier = decision(&a, T0 - 60_000, DecisionKind::Misfired, "scheduler down");
        let other = decision(&b, T0, DecisionKind::NoWorker, "no worker with gpu=a100");
        s.record_decisions(&[later.clone(), fired.clone(), other.clone(), earlier.clone()])
            .await
            .unwrap();
        s.record_decisions(&[]).await.unwrap();
        assert_eq!(
            s.list_decisions(a.id, T0 - 60_000, T0 + 60_000, 10)
                .await
                .unwrap(),
            [earlier.clone(), fired.clone(), later]
        );
        assert_eq!(
            s.list_decisions(a.id, T0 - 60_000, T0, 10).await.unwrap(),
            [earlier.clone(), fired]
        );
        assert_eq!(
            s.list_decisions(a.id, T0 - 60_000, T0 + 60_000, 1)
                .await
                .unwrap(),
            [earlier]
        );
        assert_eq!(
            s.list_decisions(b.id, 0, i64::MAX, 10).await.unwrap(),
            [other]
        );
    }

    pub(super) async fn a_new_run_asked_for_gets_its_trigger_audit_row_with_it(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("etl", vec![task("a", &[])])).await;
        let asked = |key: &str| NewRun {
            triggered_by: "bob".into(),
            audit_from: Some(Caller {
                remote: "10.0.0.9:5000".into(),
                token: "ci".into(),
            }),
            ..new_run(&wf, Some(key))
        };
        let created = s
            .create_runs(&[asked("k1"), asked("k2"), asked("k1"), new_run(&wf, None)])
            .await
            .unwrap();
        let news: Vec<bool> = created.iter().map(|(_, new)| *new).collect();
        assert_eq!(news, [true, true, false, true]);
        // The same key again, alone: the existing run, and no second row.
        let (again, new) = s.create_run(&asked("k2")).await.unwrap();
        assert!(!new);
        assert_eq!(again.id, created[1].0.id);

        let rows = s.list_audit(10).await.unwrap();
        let mut details: Vec<&str> = rows.iter().map(|row| row.detail.as_str()).collect();
        details.sort();
        let mut expected = vec![
            format!("run {}, params day", created[0].0.id),
            format!("run {}, params day", created[1].0.id),
        ];
        expected.sort();
        assert_eq!(details, expected, "one row per new run that asked for it");
        for row in &rows {
            assert_eq!(
                (row.at, row.actor.as_str(), row.action.as_str()),
                (T0, "bob", "trigger")
            );
            assert_eq!(
                (row.target.as_str(), row.remote.as_str()),
                ("workflow/etl", "10.0.0.9:5000")
            );
        }
    }

    pub(super) async fn audit_rows_filter_by_action_target_and_actor(ctx: Ctx) {
        let s = ctx.s();
        let row = |at, actor: &str, action: &str, target: &str| AuditRecord {
            at,
            actor: actor.into(),
            action: action.into(),
            target: target.into(),
            detail: String::new(),
            remote: "127.0.0.1:5000".into(),
            token: format!("{actor}-token"),
        };
        let rows = [
            row(T0, "alice", "apply", "workflow/etl"),
            row(T0 + 1, "bob", "trigger", "workflow/etl"),
            row(T0 + 2, "alice", "pause", "workflow/etl"),
            row(T0 + 3, "alice", "cancel", "run/7"),
            row(T0 + 4, "bob", "trigger", "workflow/other"),
        ];
        for r in &rows {
            s.insert_audit(r).await.unwrap();
        }
        let query =
            |action: Option<&str>, target: Option<&str>, actor: Option<&str>, limit| AuditFilter {
                limit,
                action: action.map(str::to_string),
                target: target.map(str::to_string),
                actor: actor.map(str::to_string),
                token: None,
            };
        let all = s.query_audit(&query(None, None, None, 10)).await.unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[0], rows[4], "newest first");
        assert_eq!(
            s.query_audit(&query(Some("trigger"), None, None, 10))
                .await
                .unwrap(),
            [rows[4].clone(), rows[1].clone()]
        );
        assert_eq!(
            s.query_audit(&query(None, Some("workflow/etl"), None, 10))
                .await
                .unwrap(),
            [rows[2].clone(), rows[1].clone(), rows[0].clone()]
        );
        assert_eq!(
            s.query_audit(&query(
                Some("trigger"),
                Some("workflow/etl"),
                Some("bob"),
                10
            ))
            .await
            .unwrap(),
            [rows[1].clone()]
        );
        assert_eq!(
            s.query_audit(&query(None, None, Some("alice"), 2))
                .await
                .unwrap(),
            [rows[3].clone(), rows[2].clone()]
        );
        // Exact matches only: a prefix or a different case finds nothing.
        assert!(
            s.query_audit(&query(None, Some("workflow/"), None, 10))
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            s.query_audit(&query(Some("TRIGGER"), None, None, 10))
                .await
                .unwrap()
                .is_empty()
        );
        assert_eq!(s.list_audit(3).await.unwrap(), all[..3]);
        let by_token = AuditFilter {
            limit: 10,
            token: Some("bob-token".into()),
            ..AuditFilter::default()
        };
        assert_eq!(
            s.query_audit(&by_token).await.unwrap(),
            [rows[4].clone(), rows[1].clone()]
        );
    }

    pub(super) async fn runs_near_a_time_are_the_latest_before_and_the_earliest_after(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("near", vec![task("t", &[])])).await;
        let other = apply(s, &spec("far", vec![task("t", &[])])).await;
        assert!(s.runs_near(wf.id, T0).await.unwrap().is_empty());
        let mut ids = BTreeMap::new();
        for (offset, key) in [(0, "a"), (60_000, "b"), (120_000, "c"), (180_000, "d")] {
            let run = NewRun {
                logical_time: T0 + offset,
                dedup_key: Some(key.into()),
                ..new_run(&wf, None)
            };
            let (record, _) = s.create_run(&run).await.unwrap();
            ids.insert(offset, record.id);
        }
        s.create_run(&NewRun {
            logical_time: T0 + 90_000,
            ..new_run(&other, None)
        })
        .await
        .unwrap();
        let near = |at| async move {
            s.runs_near(wf.id, at)
                .await
                .unwrap()
                .into_iter()
                .map(|run| run.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(near(T0 + 90_000).await, [ids[&60_000], ids[&120_000]]);
        assert_eq!(near(T0 + 60_000).await, [ids[&60_000], ids[&120_000]]);
        assert_eq!(near(T0 - 1).await, [ids[&0]]);
        assert_eq!(near(T0 + 999_999).await, [ids[&180_000]]);
    }

    pub(super) async fn ids_are_unique_across_two_stores(ctx: Ctx) {
        let other = ctx.second_store().await;
        let wf = apply(
            ctx.s(),
            &spec("wf", vec![task("a", &[]), task("b", &[]), task("c", &[])]),
        )
        .await;
        let mut handles = Vec::new();
        for (i, store) in [ctx.store.clone(), other.clone()].into_iter().enumerate() {
            let wf = wf.clone();
            handles.push(tokio::spawn(async move {
                let mut runs = Vec::new();
                for k in 0..40 {
                    let key = format!("s{i}-{k}");
                    let (run, created) = store
                        .create_run(&new_run(&wf, Some(&key)))
                        .await
                        .expect("create");
                    assert!(created);
                    runs.push(run.id);
                }
                runs
            }));
        }
        let mut runs = BTreeSet::new();
        for handle in handles {
            runs.extend(handle.await.unwrap());
        }
        assert_eq!(runs.len(), 80, "run ids never repeat");
        let mut instances = BTreeSet::new();
        for run in &runs {
            for inst in ctx.s().list_instances(*run).await.unwrap() {
                assert!(
                    instances.insert(inst.id),
                    "instance id {} repeated",
                    inst.id
                );
            }
        }
        assert_eq!(instances.len(), 240);
        // Ids stay small and readable: two blocks of a thousand at most per kind and store.
        assert!(runs.iter().all(|r| r.0 < 5_000), "{runs:?}");
        other.close().await;
    }

    pub(super) async fn advance_creates_exactly_the_ready_downstream_in_a_large_workflow(ctx: Ctx) {
        let s = ctx.s();
        let mut tasks: Vec<TaskSpec> = (0..2_000)
            .map(|i| task(&format!("solo{i:04}"), &[]))
            .collect();
        tasks.push(task("a", &[]));
        tasks.push(task("b", &["a"]));
        let wf = apply(s, &spec("big", tasks)).await;
        let run = start_run(s, &wf).await;
        assert_eq!(s.list_instances(run.id).await.unwrap().len(), 2_001);
        let before = s.run_counts(run.id).await.unwrap();
        assert_eq!((before.waiting, before.not_created), (2_001, 1));
        let done = run_task(s, run.id, "a", Outcome::Success).await;
        assert_eq!((done.new_waiting, done.run_finished), (1, None));
        let instances = s.list_instances(run.id).await.unwrap();
        assert_eq!(instances.len(), 2_002);
        let b = instances.iter().find(|i| i.task == "b").expect("b created");
        assert_eq!(b.state, InstanceState::Waiting);
        assert_eq!(s.run_counts(run.id).await.unwrap().not_created, 0);
    }

    pub(super) async fn list_runs_newest_first_with_filters(ctx: Ctx) {
        let s = ctx.s();
        let one = apply(s, &spec("one", vec![task("a", &[])])).await;
        let two = apply(s, &spec("two", vec![task("a", &[])])).await;
        let r1 = start_run(s, &one).await;
        let r2 = start_run(s, &two).await;
        let r3 = start_run(s, &one).await;
        run_task(s, r3.id, "a", Outcome::Success).await;
        let ids = |runs: Vec<RunRecord>| runs.into_iter().map(|r| r.id).collect::<Vec<_>>();
        assert_eq!(
            ids(s.list_runs(None, None, None, 10).await.unwrap()),
            [r3.id, r2.id, r1.id]
        );
        assert_eq!(
            ids(s.list_runs(Some("one"), None, None, 10).await.unwrap()),
            [r3.id, r1.id]
        );
        assert_eq!(
            ids(s
                .list_runs(Some("one"), Some(RunState::Running), None, 10)
                .await
                .unwrap()),
            [r1.id]
        );
        assert_eq!(
            ids(s
                .list_runs(None, Some(RunState::Success), None, 10)
                .await
                .unwrap()),
            [r3.id]
        );
        assert_eq!(
            ids(s.list_runs(None, None, None, 1).await.unwrap()),
            [r3.id]
        );
        // The next page starts below the last id seen, with or without filters.
        assert_eq!(
            ids(s.list_runs(None, None, Some(r3.id), 10).await.unwrap()),
            [r2.id, r1.id]
        );
        assert_eq!(
            ids(s
                .list_runs(Some("one"), None, Some(r3.id), 1)
                .await
                .unwrap()),
            [r1.id]
        );
        assert!(
            s.list_runs(None, None, Some(r1.id), 10)
                .await
                .unwrap()
                .is_empty()
        );
        assert!(
            s.list_runs(Some("ghost"), None, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
        // A set of workflows (an app's): its runs only, paged as the others are.
        let three = apply(s, &spec("three", vec![task("a", &[])])).await;
        let r4 = start_run(s, &three).await;
        let both = [one.id, three.id];
        assert_eq!(
            ids(s.list_runs_of(&both, None, None, 10).await.unwrap()),
            [r4.id, r3.id, r1.id]
        );
        assert_eq!(
            ids(s.list_runs_of(&both, None, None, 2).await.unwrap()),
            [r4.id, r3.id]
        );
        assert_eq!(
            ids(s.list_runs_of(&both, None, Some(r3.id), 2).await.unwrap()),
            [r1.id],
            "the next page skips the other workflows' runs between"
        );
        assert_eq!(
            ids(s
                .list_runs_of(&both, Some(RunState::Success), None, 10)
                .await
                .unwrap()),
            [r3.id]
        );
        assert_eq!(
            ids(s.list_runs_of(&[two.id], None, None, 10).await.unwrap()),
            [r2.id]
        );
        assert!(
            s.list_runs_of(&[], None, None, 10)
                .await
                .unwrap()
                .is_empty()
        );
    }

    pub(super) async fn a_manual_retry_reopens_the_run_and_keeps_the_history(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let failed = run_task(s, run.id, "only", Outcome::Failed).await;
        assert_eq!(failed.run_finished, Some((run.id, RunState::Failed)));
        let inst = instance_of(s, run.id, "only").await.unwrap();

        let retried = s.retry_instance(inst.id, T0 + 100).await.unwrap();
        let ManualRetry::Retried(record) = retried else {
            panic!("{retried:?}")
        };
        assert_eq!(
            (record.state, record.attempt),
            (InstanceState::Waiting, Attempt(2))
        );
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        let attempts = s.list_attempts(inst.id).await.unwrap();
        assert_eq!(
            attempts.len(),
            1,
            "attempt 2 has no row until it is dispatched"
        );
        assert_eq!(attempts[0].state, InstanceState::Failed);

        let done = run_task(s, run.id, "only", Outcome::Success).await;
        assert_eq!(done.run_finished, Some((run.id, RunState::Success)));
        let attempts = s.list_attempts(inst.id).await.unwrap();
        let states: Vec<_> = attempts.iter().map(|a| (a.attempt, a.state)).collect();
        assert_eq!(
            states,
            vec![
                (Attempt(1), InstanceState::Failed),
                (Attempt(2), InstanceState::Success)
            ]
        );
        assert_eq!(
            s.retry_instance(inst.id, T0).await.unwrap(),
            ManualRetry::NotRetryable(InstanceState::Success)
        );
        assert_eq!(
            s.retry_instance(InstanceId(987_654), T0).await.unwrap(),
            ManualRetry::NotFound
        );
    }

    pub(super) async fn rerun_failed_retries_the_failed_part_and_its_downstream_follows(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![task("a", &[]), task("bad", &["a"]), task("below", &["bad"])],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "a", Outcome::Success).await;
        let failed = run_task(s, run.id, "bad", Outcome::Failed).await;
        assert_eq!(failed.run_finished, Some((run.id, RunState::Failed)));

        let bad = instance_of(s, run.id, "bad").await.unwrap();
        let retried = s.rerun_failed(run.id, T0 + 100).await.unwrap().unwrap();
        assert_eq!(retried.retried, vec![bad.id]);
        assert!(retried.shards_active.is_empty());
        assert_eq!(
            s.get_run(run.id).await.unwrap().unwrap().state,
            RunState::Running
        );
        run_task(s, run.id, "bad", Outcome::Success).await;
        let last = run_task(s, run.id, "below", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
        assert_eq!(
            s.rerun_failed(run.id, T0).await.unwrap(),
            Some(RerunFailed::default())
        );
        assert_eq!(s.rerun_failed(RunId(987_654), T0).await.unwrap(), None);
    }

    pub(super) async fn active_attempts_list_what_is_on_workers_with_their_timeouts(ctx: Ctx) {
        let s = ctx.s();
        let mut slow = task("slow", &[]);
        slow.timeout_ms = std::num::NonZeroU64::new(60_000);
        let wf = apply(
            s,
            &spec("wf", vec![slow, task("queued", &[]), task("done", &[])]),
        )
        .await;
        let run = start_run(s, &wf).await;
        run_task(s, run.id, "done", Outcome::Success).await;
        let running = launch(s, run.id, "slow").await;
        assert!(
            s.active_attempts(None, 100).await.unwrap().len() == 1,
            "WAITING and finished are not active"
        );

        let queued = instance_of(s, run.id, "queued").await.unwrap();
        s.mark_dispatched(&[claim(queued.id, 1, "w2")])
            .await
            .unwrap();
        let active = s.active_attempts(None, 100).await.unwrap();
        assert!(
            active
                .windows(2)
                .all(|w| w[0].instance_id < w[1].instance_id),
            "oldest first"
        );
        let find = |id: InstanceId| active.iter().find(|a| a.instance_id == id).expect("listed");
        let slow = find(running.id);
        assert_eq!(
            (
                slow.state,
                slow.worker_id.as_deref(),
                slow.timeout_ms,
                slow.started_at
            ),
            (
                InstanceState::Running,
                Some("w1"),
                std::num::NonZeroU64::new(60_000),
                Some(T0 + 20)
            )
        );
        assert_eq!(slow.last_heartbeat_at, Some(T0 + 20));
        let dispatched = find(queued.id);
        assert_eq!(
            (
                dispatched.state,
                dispatched.worker_id.as_deref(),
                dispatched.timeout_ms
            ),
            (InstanceState::Dispatched, Some("w2"), None)
        );
        assert_eq!(
            (dispatched.started_at, dispatched.dispatched_at),
            (None, Some(T0 + 10))
        );
        assert_eq!(active.len(), 2);
        let on_w2 = s.active_attempts(Some("w2"), 100).await.unwrap();
        assert_eq!(
            on_w2.iter().map(|a| a.instance_id).collect::<Vec<_>>(),
            vec![queued.id]
        );
    }

    pub(super) async fn a_report_from_another_worker_is_not_its_own(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let inst = instance_of(s, run.id, "only").await.unwrap();
        s.mark_dispatched(&[claim(inst.id, 1, "w1")]).await.unwrap();
        let impostor = Report::Started {
            instance_id: inst.id,
            attempt: Attempt(1),
            worker_id: "w2".into(),
            pid: 1,
            at: T0 + 20,
        };
        assert_eq!(
            s.apply_reports(&[impostor], T0).await.unwrap(),
            [ReportResult::NotYours]
        );
        let inst = launch_dispatched(s, inst.id).await;
        let mut report = finished(inst.id, 1, Outcome::Success, 0);
        if let Report::Finished { worker_id, .. } = &mut report {
            *worker_id = Some("w2".into());
        }
        assert_eq!(
            s.apply_reports(&[report.clone()], T0).await.unwrap(),
            [ReportResult::NotYours]
        );
        assert_eq!(
            s.get_instance(inst.id).await.unwrap().unwrap().state,
            InstanceState::Running,
            "the impostor's end changed nothing"
        );
        if let Report::Finished { worker_id, .. } = &mut report {
            *worker_id = Some("w1".into());
        }
        let results = s.apply_reports(&[report], T0).await.unwrap();
        assert_eq!(
            applied(&results[0]).run_finished,
            Some((run.id, RunState::Success))
        );
    }

    /// A worker speaks only of attempts dispatched to it: reports about another worker's ended
    /// attempt, about an attempt to come and about an instance that does not exist are
    /// NotYours (not merely stale), and their lines are not stored; its own stale report stays
    /// Stale, and its own lines go in, whether or not the node knew them.
    pub(super) async fn reports_and_lines_about_attempts_never_dispatched_to_their_worker_are_refused(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("only", &[])])).await;
        let run = start_run(s, &wf).await;
        let inst = instance_of(s, run.id, "only").await.unwrap();
        s.mark_dispatched(&[claim(inst.id, 1, "w1")]).await.unwrap();
        let inst = launch_dispatched(s, inst.id).await;
        let results = s
            .apply_reports(&[finished(inst.id, 1, Outcome::Success, 0)], T0)
            .await
            .unwrap();
        applied(&results[0]);
        let as_worker = |report: Report, worker: &str| match report {
            Report::Finished {
                instance_id,
                attempt,
                end,
                exit_code,
                signal,
                at,
                log_lines,
                message,
                ..
            } => Report::Finished {
                instance_id,
                attempt,
                worker_id: Some(worker.into()),
                end,
                exit_code,
                signal,
                at,
                log_lines,
                message,
            },
            Report::Started {
                instance_id,
                attempt,
                pid,
                at,
                ..
            } => Report::Started {
                instance_id,
                attempt,
                worker_id: worker.into(),
                pid,
                at,
            },
            other => other,
        };
        let heartbeat = |id: InstanceId, attempt: u32, worker: &str| Report::TaskHeartbeat {
            instance_id: id,
            attempt: Attempt(attempt),
            worker_id: Some(worker.into()),
            at: T0,
        };
        let reports = [
            // Another worker's ended attempt.
            as_worker(finished(inst.id, 1, Outcome::Failed, 1), "rogue"),
            // An attempt to come, and an instance that does not exist.
            as_worker(started(inst.id, 2), "rogue"),
            heartbeat(inst.id, 2, "w1"),
            heartbeat(InstanceId(inst.id.0 + 10_000), 1, "rogue"),
            // w1's own late report about its ended attempt: stale, not a stranger's.
            as_worker(started(inst.id, 1), "w1"),
        ];
        let results = s.apply_reports(&reports, T0).await.unwrap();
        assert_eq!(
            results[..4],
            [
                ReportResult::NotYours,
                ReportResult::NotYours,
                ReportResult::NotYours,
                ReportResult::NotYours
            ]
        );
        assert!(
            matches!(results[4], ReportResult::Stale { .. }),
            "{:?}",
            results[4]
        );
        assert_eq!(
            s.get_instance(inst.id).await.unwrap().unwrap().state,
            InstanceState::Success
        );

        let chunk = |attempt: u32, first: u64, text: &str| {
            LogChunk::from_lines(
                inst.id,
                Attempt(attempt),
                first,
                [(LogStream::Stdout, text)],
                T0,
            )
        };
        let chunks = [
            chunk(1, 1, "w1 known"),
            chunk(1, 2, "w1 checked"),
            chunk(1, 3, "INJECTED by rogue"),
            chunk(2, 1, "INJECTED ahead"),
            chunk(2, 2, "INJECTED ahead by w1"),
        ];
        let kept = s
            .append_worker_logs(
                &chunks,
                &[None, Some("w1"), Some("rogue"), Some("rogue"), Some("w1")],
            )
            .await
            .unwrap();
        assert_eq!(kept, [true, true, false, false, false]);
        let lines = |attempt: u32| async move {
            s.read_logs(inst.id, Attempt(attempt), 0, 100)
                .await
                .unwrap()
                .into_iter()
                .map(|line| line.text)
                .collect::<Vec<_>>()
        };
        assert_eq!(lines(1).await, ["w1 known", "w1 checked"]);
        assert!(lines(2).await.is_empty(), "nothing written ahead");
        assert_eq!(
            s.append_worker_logs(&[], &[]).await.unwrap(),
            Vec::<bool>::new()
        );
    }

    /// Starts an attempt already dispatched to w1.
    async fn launch_dispatched(s: &dyn Store, id: InstanceId) -> InstanceRecord {
        let inst = s.get_instance(id).await.unwrap().unwrap();
        let results = s
            .apply_reports(&[started(id, inst.attempt.0)], T0)
            .await
            .unwrap();
        applied(&results[0]);
        s.get_instance(id).await.unwrap().unwrap()
    }

    /// More text than one MySQL packet may carry (16 MiB on MariaDB by default), in one call.
    pub(super) async fn thirty_megabytes_of_log_lines_go_in_one_append(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("wf", vec![task("a", &[])])).await;
        let run = start_run(s, &wf).await;
        let id = instance_of(s, run.id, "a").await.unwrap().id;
        let line = "y".repeat(64 << 10);
        let chunks: Vec<LogChunk> = (0..120u64)
            .map(|i| {
                LogChunk::from_lines(
                    id,
                    Attempt(1),
                    i * 4 + 1,
                    vec![(LogStream::Stdout, line.as_str()); 4],
                    T0,
                )
            })
            .collect();
        s.append_logs(&chunks)
            .await
            .expect("a large append is split, not refused");
        let mut seen = 0u64;
        loop {
            let page = s.read_logs(id, Attempt(1), seen, 100).await.unwrap();
            let Some(last) = page.last() else { break };
            assert!(page.iter().all(|l| l.text.len() == 64 << 10));
            seen = last.seq;
        }
        assert_eq!(seen, 480);
    }

    pub(super) async fn a_fan_in_reached_in_one_batch_creates_the_sink_once_and_the_run_goes_on(
        ctx: Ctx,
    ) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![task("b", &[]), task("c", &[]), task("d", &["b", "c"])],
            ),
        )
        .await;
        let run = start_run(s, &wf).await;
        let b = launch(s, run.id, "b").await;
        let c = launch(s, run.id, "c").await;
        let batch = [
            finished(b.id, 1, Outcome::Success, 0),
            finished(c.id, 1, Outcome::Success, 0),
        ];
        let results = s.apply_reports(&batch, T0 + 40).await.unwrap();
        let created: u32 = results.iter().map(|r| applied(r).new_waiting).sum();
        assert_eq!(created, 1, "the sink is created once");
        assert!(
            results.iter().all(|r| applied(r).run_finished.is_none()),
            "the run goes on"
        );
        assert_eq!(
            tasks_of(s, run.id).await,
            BTreeSet::from(["b".into(), "c".into(), "d".into()])
        );
        let last = run_task(s, run.id, "d", Outcome::Success).await;
        assert_eq!(last.run_finished, Some((run.id, RunState::Success)));
    }

    /// One batch finishing a root in many runs of a small DAG (the seed's load: more runs than
    /// downstream tasks, counted per task): each run gets its own ready downstream once, and a
    /// fan-in waits in every run for its other upstream.
    pub(super) async fn one_batch_advancing_many_runs_creates_each_runs_ready_tasks_once(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(
            s,
            &spec(
                "wf",
                vec![
                    task("a", &[]),
                    task("x", &[]),
                    task("b", &["a"]),
                    task("j", &["a", "x"]),
                ],
            ),
        )
        .await;
        let mut runs = Vec::new();
        for _ in 0..3 {
            runs.push(start_run(s, &wf).await.id);
        }
        let mut batch = Vec::new();
        for &run in &runs {
            let a = launch(s, run, "a").await;
            batch.push(finished(a.id, 1, Outcome::Success, 0));
        }
        let results = s.apply_reports(&batch, T0 + 40).await.unwrap();
        let created: u32 = results.iter().map(|r| applied(r).new_waiting).sum();
        assert_eq!(created, 3, "b in each run, j in none: {results:?}");
        for &run in &runs {
            assert_eq!(
                tasks_of(s, run).await,
                BTreeSet::from(["a".into(), "x".into(), "b".into()])
            );
        }
        let mut batch = Vec::new();
        for &run in &runs {
            let x = launch(s, run, "x").await;
            batch.push(finished(x.id, 1, Outcome::Success, 0));
        }
        let results = s.apply_reports(&batch, T0 + 50).await.unwrap();
        let created: u32 = results.iter().map(|r| applied(r).new_waiting).sum();
        assert_eq!(created, 3, "j in each run: {results:?}");
        for &run in &runs {
            let j = instance_of(s, run, "j").await.expect("j exists");
            assert_eq!((j.state, j.attempt), (InstanceState::Waiting, Attempt(1)));
        }
    }
}

#[tokio::test]
async fn other_url_schemes_are_refused() {
    for url in ["postgres://localhost/ax", "redis://localhost", "ax.db", ""] {
        match SqlStore::connect(url).await {
            Err(StoreError::UnsupportedUrl(got)) => assert_eq!(got, url),
            other => panic!("{url}: expected UnsupportedUrl, got {other:?}"),
        }
    }
    assert!(matches!(
        open("file:///tmp/x").await,
        Err(StoreError::UnsupportedUrl(_))
    ));
}

#[tokio::test]
async fn open_returns_a_working_store_and_in_memory_sqlite_works() {
    let store = open("sqlite::memory:").await.expect("in-memory store");
    assert_eq!(store.backend(), Backend::Sqlite);
    let wf = store
        .apply_workflow(&spec("m", vec![task("a", &[])]), "", None, T0)
        .await
        .unwrap()
        .0;
    assert_eq!(store.get_workflow("m").await.unwrap().unwrap().id, wf.id);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("deep/er/ax.db");
    let store = open(&format!("sqlite://{}", path.display()))
        .await
        .expect("file store");
    assert!(path.exists());
    drop(store);
    // Opening again runs no migration twice and keeps the data.
    let again = SqlStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    assert!(again.list_workflows(None).await.unwrap().is_empty());
}

/// A SQLite file store with a table of eight rows to overwrite, and the path of its log.
async fn sqlite_store_with_filler(dir: &std::path::Path) -> (Arc<SqlStore>, std::path::PathBuf) {
    let path = dir.join("ax.db");
    let store = SqlStore::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE filler (id INTEGER PRIMARY KEY, body BLOB NOT NULL)")
        .execute(&store.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO filler (id, body) SELECT value, x'' FROM json_each('[0,1,2,3,4,5,6,7]')",
    )
    .execute(&store.pool)
    .await
    .unwrap();
    (Arc::new(store), dir.join("ax.db-wal"))
}

/// About 20 KiB of pages through the log per commit (a 16 KiB row and its page), at most one
/// commit a millisecond, each through the store's writer lock as the store's own writes go.
async fn overwrite_filler(store: &SqlStore, commits: i64) {
    for i in 0..commits {
        let mut write = store.begin_write().await.unwrap();
        sqlx::query("UPDATE filler SET body = randomblob(16384) WHERE id = ?")
            .bind(i % 8)
            .execute(&mut *write.tx)
            .await
            .unwrap();
        write.tx.commit().await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

fn file_len(path: &std::path::Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_file_store_checkpoints_outside_the_commits_and_its_log_rewinds_under_load() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = sqlite_store_with_filler(dir.path()).await;
    let automatic: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(automatic, 0, "a commit never checkpoints");
    // Readers that keep the log in use all the time, as a busy node's reads do: beside them a
    // checkpoint that only ever copies never sees the log wholly copied, and the log would
    // never rewind.
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop, reads) = (store.clone(), stop.clone(), reads.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _: Option<i64> = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
                        .fetch_one(&store.pool)
                        .await
                        .unwrap();
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    // About 60 MiB of pages through the log: steady load for a few seconds.
    overwrite_filler(&store, 3_000).await;
    stop.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.await.unwrap();
    }
    assert!(
        reads.load(Ordering::Relaxed) > 100,
        "the readers ran beside the writes"
    );
    // The log file keeps its largest size: it says how far the log ever grew before it was
    // written from its start again.
    let wal_bytes = file_len(&wal);
    assert!(
        wal_bytes < 24 * 1024 * 1024,
        "the log grew to {wal_bytes} bytes: it was not rewound under load"
    );
    let total: i64 = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
        .fetch_one(&store.pool)
        .await
        .unwrap();
    assert_eq!(total, 8 * 16384, "every row holds its last write");
    // Closed, the store leaves nothing in the log: the checkpointer's connection is closed too,
    // so the last connection's close checkpoints and removes it.
    store.close().await;
    let left = file_len(&wal);
    assert_eq!(left, 0, "the closed store left {left} bytes in its log");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_read_on_a_sqlite_file_store_holds_up_neither_the_writers_nor_later_rewinds() {
    let dir = tempfile::tempdir().unwrap();
    let (store, wal) = sqlite_store_with_filler(dir.path()).await;
    // A read transaction that stays open across 1,500 commits: no checkpoint can copy past its
    // snapshot, so every rewinding pass meanwhile finds it on the log and gives up.
    let mut reader = store.pool.acquire().await.unwrap();
    sqlx::query("BEGIN").execute(&mut *reader).await.unwrap();
    let before: i64 = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    assert_eq!(before, 0);
    // A generous bound that catches writers stuck behind the checkpointer's waits.
    tokio::time::timeout(
        std::time::Duration::from_secs(120),
        overwrite_filler(&store, 1_500),
    )
    .await
    .expect("the writers went on beside the long read");
    let seen: i64 = sqlx::query_scalar("SELECT SUM(LENGTH(body)) FROM filler")
        .fetch_one(&mut *reader)
        .await
        .unwrap();
    assert_eq!(seen, 0, "the long read kept its snapshot");
    sqlx::query("COMMIT").execute(&mut *reader).await.unwrap();
    drop(reader);
    let grown = file_len(&wal);
    assert!(
        grown > 24 * 1024 * 1024,
        "the log grew to {grown} bytes behind the long read"
    );
    // Once the reader is gone the log is rewound again, after the back-off (at most 16 ticks)
    // and a copy of what the read held back: another 60 MiB through the log grow the file by
    // less than that.
    overwrite_filler(&store, 3_000).await;
    let after = file_len(&wal);
    assert!(
        after < grown + 24 * 1024 * 1024,
        "the log grew from {grown} to {after} bytes after the long read ended"
    );
    store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mysql_session_gone_silent_in_a_transaction_frees_its_locks_after_the_timeout() {
    on_mysql(|ctx| async move {
        ctx.store
            .apply_workflow(&spec("held", vec![task("a", &[])]), "", None, T0)
            .await
            .unwrap();
        let options = StoreOptions {
            silent_client_timeout: std::time::Duration::from_secs(1),
        };
        let silent = SqlStore::connect_with(&ctx.url, &options).await.unwrap();
        let mut tx = silent.pool.begin().await.unwrap();
        let timeout: i64 = sqlx::query_scalar("SELECT @@session.wait_timeout")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        assert_eq!(timeout, 1);
        sqlx::query("SELECT id FROM workflow WHERE name = 'held' FOR UPDATE")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        // The transaction stays open and sends nothing, like a node cut off from the database.
        let started = std::time::Instant::now();
        sqlx::query("UPDATE workflow SET paused = 1 WHERE name = 'held'")
            .execute(&ctx.store.pool)
            .await
            .expect("the lock is freed when the server drops the silent session");
        // The server's lock wait would give up after innodb_lock_wait_timeout (50 s); the
        // default silent timeout is 10 s.
        assert!(
            started.elapsed() < std::time::Duration::from_secs(6),
            "the row stayed locked for {:?}",
            started.elapsed()
        );
        drop(tx);
        silent.close().await;
    })
    .await;
}

#[test]
fn migrations_are_paired_per_backend() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let list = |backend: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir.join(backend))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    };
    assert_eq!(list("mysql"), list("sqlite"));
    let embedded: Vec<String> = crate::sql::MYSQL_MIGRATIONS
        .iter()
        .map(|(v, d, _)| format!("{v:04}_{d}.sql"))
        .collect();
    assert_eq!(embedded, list("mysql"), "every migration file is embedded");
    let sqlite: Vec<i64> = crate::sql::SQLITE_MIGRATIONS.iter().map(|m| m.0).collect();
    let mysql: Vec<i64> = crate::sql::MYSQL_MIGRATIONS.iter().map(|m| m.0).collect();
    assert_eq!(sqlite, mysql);
}

#[test]
fn mysql_server_url_strips_the_database() {
    assert_eq!(
        mysql_server_url("mysql://root@127.0.0.1:3306"),
        "mysql://root@127.0.0.1:3306"
    );
    assert_eq!(
        mysql_server_url("mysql://u:p@h:1/db?x=1"),
        "mysql://u:p@h:1"
    );
}

mod access;
mod advance_cost;
mod dispatch;
mod group_cost;
mod interleavings;
mod placement;
mod purge;
mod queue;
