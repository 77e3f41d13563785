//! Conformance scenarios of creating and reading runs: root tasks only, dedup keys (under
//! concurrent creators too), a group created in order or not at all, the counts of a run and
//! of what is active store-wide, lists, the runs near a time, and ids unique across stores
//! (`sql/run_create.rs`, `sql/runs.rs`, `sql/gauges.rs`, `sql/ids.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use ax_core::ids::{Attempt, RunId};
use ax_core::run::RunState;
use ax_core::spec::TriggerKind;
use ax_core::state::{InstanceState, Outcome};

use super::support::*;
use crate::*;

conformance!(
    create_run_inserts_only_root_tasks,
    dedup_key_returns_the_existing_run,
    a_group_of_runs_is_created_in_order_and_an_error_creates_none,
    concurrent_creates_with_one_dedup_key_make_one_run,
    run_counts_include_tasks_not_created,
    active_counts_count_what_is_active_store_wide,
    runs_near_a_time_are_the_latest_before_and_the_earliest_after,
    ids_are_unique_across_two_stores,
    list_runs_newest_first_with_filters,
    runs_are_found_by_trigger_and_logical_time,
);

mod scenarios {
    use super::*;

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

    pub(super) async fn runs_are_found_by_trigger_and_logical_time(ctx: Ctx) {
        let s = ctx.s();
        let wf = apply(s, &spec("found", vec![task("a", &[])])).await;
        let other = apply(s, &spec("other", vec![task("a", &[])])).await;
        let make = async |wf: &WorkflowRecord, trigger, logical_time: i64| {
            let run = NewRun {
                trigger,
                logical_time,
                ..manual(wf)
            };
            s.create_run(&run).await.expect("create run").0.id
        };
        let cron_early = make(&wf, TriggerKind::Cron, T0).await;
        let manual_mid = make(&wf, TriggerKind::Manual, T0 + 1_000).await;
        let cron_late = make(&wf, TriggerKind::Cron, T0 + 2_000).await;
        let other_cron = make(&other, TriggerKind::Cron, T0 + 1_000).await;
        let find = async |workflow, filter: RunFilter, before| {
            s.find_runs(workflow, &filter, before, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect::<Vec<_>>()
        };
        let cron = RunFilter {
            trigger: Some(TriggerKind::Cron),
            ..RunFilter::default()
        };
        assert_eq!(
            find(None, cron, None).await,
            [other_cron, cron_late, cron_early]
        );
        assert_eq!(
            find(Some("found"), cron, None).await,
            [cron_late, cron_early]
        );
        // Both bounds are inclusive.
        let middle = RunFilter {
            logical_from: Some(T0 + 1_000),
            logical_to: Some(T0 + 2_000),
            ..RunFilter::default()
        };
        assert_eq!(
            find(Some("found"), middle, None).await,
            [cron_late, manual_mid]
        );
        assert_eq!(
            find(
                Some("found"),
                RunFilter {
                    trigger: Some(TriggerKind::Cron),
                    ..middle
                },
                None
            )
            .await,
            [cron_late]
        );
        assert_eq!(
            find(Some("found"), middle, Some(cron_late)).await,
            [manual_mid],
            "pages follow the filter"
        );
        let none = RunFilter {
            logical_from: Some(T0 + 3_000),
            ..RunFilter::default()
        };
        assert!(find(None, none, None).await.is_empty());
        assert_eq!(
            s.find_runs_of(&[wf.id, other.id], &middle, None, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect::<Vec<_>>(),
            [other_cron, cron_late, manual_mid]
        );
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
}
