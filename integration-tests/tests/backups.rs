//! Backup and restore of the MySQL store (docs/operations.md, "Backup and restore"): a
//! `mysqldump --single-transaction` taken under load while the cluster keeps running, then
//! restored by the documented procedure (workers and nodes stopped, the workers' state emptied,
//! the dump loaded, the id allocators moved past what was handed out since, the Redis
//! namespace emptied) and the cluster started again. What the test asserts is what the
//! operations page says a restore does:
//! - runs created after the snapshot are gone from the store, though their tasks ran;
//! - every attempt RUNNING at the snapshot ran to its end before the restore and runs again after
//!   it, as the next attempt (the restored store finds its worker without it: lost, retried);
//! - a `catch_up` cron fires again every slot since the snapshot (those slots run twice), a
//!   `skip` cron does not fire the slots missed while the cluster was down (they are not in the
//!   store at all afterwards);
//! - after the restore every run ends SUCCESS, and no attempt the restored store dispatches
//!   starts twice or overlaps another of its instance.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use anyhow::Context;
use ax_integration_tests::client::{RUN_GUARD, summary};
use ax_integration_tests::fault_kit::{Note, numbered_lines, read_notes, script};
use ax_integration_tests::harness::{Requirement, Test, trial};
use ax_integration_tests::process::{
    ProcessCluster, RedisChoice, SchedulerSettings, WorkerSettings,
};
use ax_integration_tests::requirements::{MYSQL, REDIS};
use ax_integration_tests::{Backend, TestClient};
use ax_proto::v1 as pb;
use pb::InstanceState as S;
use sqlx::Connection;

use crate::cluster_faults::{SlotNote, StoredRun, read_slot_notes, stored_runs};

/// The MariaDB/MySQL client programs the procedure uses.
static MYSQL_CLIENT: Requirement = Requirement::program(
    "mysqldump",
    &["--version"],
    "install the MariaDB or MySQL client (mysqldump, mysql) to run the backup and restore test",
);

pub(crate) fn tests() -> Vec<Test> {
    vec![
        trial!(async(multi_thread = 2) backup_a_restored_snapshot_forgets_later_runs_reruns_what_was_running_and_refires_catch_up_slots)
            .requires(&MYSQL)
            .requires(&REDIS)
            .requires(&MYSQL_CLIENT),
    ]
}

const NODES: usize = 2;
const WORKERS: [&str; 2] = ["w1", "w2"];
const CATCH_UP: &str = "every-second-catch-up";
const SKIP: &str = "every-second-skip";
/// A slot this close to an edge (applied, dumped, stopped, started, paused) may go either way.
const EDGE_MS: i64 = 2_000;
/// A slot later than the schedule's stored next fire by more than this is missed, not late
/// (the misfire grace, decisions.md).
const MISFIRE_GRACE_MS: i64 = 5_000;
/// How far the id allocators are moved past a restored snapshot (docs/operations.md).
const ID_BUMP: i64 = 1_000_000;

/// `mysql://user@host:port/db` as (user, host, port, db).
fn mysql_target(url: &str) -> anyhow::Result<(String, String, String, String)> {
    let rest = url.strip_prefix("mysql://").context("a MySQL url")?;
    let (authority, db) = rest.split_once('/').context("a database in the url")?;
    let (user, host_port) = authority.rsplit_once('@').unwrap_or(("root", authority));
    let user = user.split(':').next().unwrap_or(user);
    let (host, port) = host_port.split_once(':').unwrap_or((host_port, "3306"));
    let db = db.split('?').next().unwrap_or(db);
    Ok((user.into(), host.into(), port.into(), db.into()))
}

/// Runs a MySQL client program against the store's server with `args`, stdin from `input`
/// and stdout to `output` when given.
fn mysql_client(
    program: &str,
    url: &str,
    args: &[&str],
    input: Option<&std::path::Path>,
    output: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    let (user, host, port, _) = mysql_target(url)?;
    let mut command = std::process::Command::new(program);
    command
        .args(["-h", &host, "-P", &port, "-u", &user])
        .args(args);
    if let Some(input) = input {
        command.stdin(std::fs::File::open(input)?);
    }
    if let Some(output) = output {
        command.stdout(std::fs::File::create(output)?);
    }
    let result = command
        .output()
        .with_context(|| format!("running {program}"))?;
    anyhow::ensure!(
        result.status.success(),
        "{program} {args:?} failed ({}): {}",
        result.status,
        String::from_utf8_lossy(&result.stderr)
    );
    Ok(())
}

async fn query_store<T>(url: &str, sql: &'static str) -> Vec<T>
where
    T: for<'r> sqlx::FromRow<'r, sqlx::mysql::MySqlRow> + Send + Unpin,
{
    let mut conn = sqlx::MySqlConnection::connect(url)
        .await
        .expect("connect to the store");
    sqlx::query_as(sql)
        .fetch_all(&mut conn)
        .await
        .expect("read the store")
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Waits until every run in the store has ended, reading again until no new run appears.
async fn settle(client: &TestClient, url: &str) -> Vec<StoredRun> {
    let mut runs = stored_runs(url).await;
    loop {
        for run in &runs {
            client
                .wait_run_within(run.id, RUN_GUARD)
                .await
                .expect("the run ends");
        }
        let again = stored_runs(url).await;
        let settled = again.len() == runs.len();
        runs = again;
        if settled {
            return runs;
        }
    }
}

/// Starts of `workflow`'s slot `slot` in the slot ledger.
fn slot_starts(ledger: &[SlotNote], workflow: &str, slot: i64) -> usize {
    ledger
        .iter()
        .filter(|n| n.workflow == workflow && n.slot_ms == slot && n.what == "start")
        .count()
}

/// The whole seconds in `(from, to)`.
fn slots_between(from: i64, to: i64) -> Vec<i64> {
    let mut slots = Vec::new();
    let mut slot = (from + 999).div_euclid(1_000) * 1_000;
    while slot < to {
        slots.push(slot);
        slot += 1_000;
    }
    slots
}

/// Attempts that started more than once, and notes of an earlier attempt after a later one
/// started, among `notes`.
fn restarted_or_overlapping(notes: &[&Note]) -> Vec<String> {
    let mut starts: BTreeMap<(i64, u32), usize> = BTreeMap::new();
    let mut newest: BTreeMap<i64, u32> = BTreeMap::new();
    let mut problems = Vec::new();
    for note in notes {
        if note.what == "start" {
            *starts.entry((note.instance, note.attempt)).or_default() += 1;
        }
        let latest = newest.entry(note.instance).or_insert(note.attempt);
        if note.attempt < *latest {
            problems.push(format!(
                "attempt {} of instance {} wrote (line {}) after attempt {} started",
                note.attempt, note.instance, note.index, latest
            ));
        }
        *latest = (*latest).max(note.attempt);
    }
    problems.extend(starts.into_iter().filter(|(_, count)| *count > 1).map(
        |((instance, attempt), count)| {
            format!("attempt {attempt} of instance {instance} started {count} times")
        },
    ));
    problems
}

async fn backup_a_restored_snapshot_forgets_later_runs_reruns_what_was_running_and_refires_catch_up_slots()
 {
    let settings = SchedulerSettings {
        redis: RedisChoice::FromEnv,
        nodes: NODES,
        heartbeat_interval: Some("500ms".into()),
        dead_after_missed_heartbeats: Some(8),
        ..SchedulerSettings::default()
    };
    let mut cluster = ProcessCluster::start_with(Backend::MySql, settings)
        .await
        .expect("the nodes");
    let worker = WorkerSettings {
        capacity: Some(8),
        kill_grace: Some("1s".into()),
        heartbeat_interval: Some("500ms".into()),
        ..WorkerSettings::default()
    };
    for id in WORKERS {
        cluster
            .start_live_worker(id, &worker)
            .await
            .expect("a worker");
    }
    let client = cluster.client().await.expect("client");
    let url = cluster.store_url().to_string();
    let dir = cluster.dir().to_path_buf();
    let effects = dir.join("effects");
    let slots = dir.join("slots");

    // Work that is RUNNING when the dump is taken: a root, a fan of six and a join, each task
    // about two seconds long; and two per-second crons.
    let long = script(&dir, "long", &effects, &numbered_lines(4, "0.5"));
    let mut yaml = format!(
        "name: work\ndefaults: {{ retries: 3, retry_backoff: 100ms }}\ntasks:\n  - name: root\n    command: \"{long}\"\n"
    );
    for fan in 1..=6 {
        yaml.push_str(&format!(
            "  - name: fan{fan}\n    upstream: [root]\n    command: \"{long}\"\n"
        ));
    }
    yaml.push_str(&format!(
        "  - name: join\n    upstream: [{}]\n    command: \"{long}\"\n",
        (1..=6)
            .map(|f| format!("fan{f}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    client.apply(&yaml).await.expect("apply work");
    let body = format!(
        "S='{}'\nslot() {{ echo \"$AX_WORKFLOW $AX_LOGICAL_TIME $AX_INSTANCE_ID $AX_ATTEMPT $1\" >> \"$S\"; }}\nslot start\n{}\nslot end",
        slots.display(),
        numbered_lines(1, "0.1")
    );
    let tick = script(&dir, "tick", &effects, &body);
    for (name, misfire) in [(CATCH_UP, "catch_up, max_catch_up: 1000"), (SKIP, "skip")] {
        client
            .apply(&format!(
                "name: {name}\nschedule: {{cron: '* * * * * *', misfire: {misfire}}}\n\
                 defaults: {{ retries: 3, retry_backoff: 100ms }}\n\
                 tasks:\n  - name: tick\n    command: \"{tick}\"\n"
            ))
            .await
            .expect("apply a cron");
    }
    let applied_ms = now_ms();
    let mut before = Vec::new();
    for _ in 0..2 {
        before.push(client.trigger_run("work").await.expect("trigger").id);
    }
    // Wait until the fans run: several long attempts are RUNNING.
    let deadline = tokio::time::Instant::now() + RUN_GUARD;
    loop {
        let running: Vec<(i64,)> =
            query_store(&url, "SELECT id FROM task_instance WHERE state = 'RUNNING'").await;
        if running.len() >= 4 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no work running");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The backup, under load.
    let dump = dir.join("store.sql");
    let (_, _, _, db) = mysql_target(&url).expect("the store's url");
    let dumped_from_ms = now_ms();
    let dump_url = url.clone();
    let dump_path = dump.clone();
    let dump_db = db.clone();
    tokio::task::spawn_blocking(move || {
        mysql_client(
            "mysqldump",
            &dump_url,
            &["--single-transaction", "--skip-lock-tables", &dump_db],
            None,
            Some(&dump_path),
        )
    })
    .await
    .expect("the dump's thread")
    .expect("mysqldump");
    let dumped_ms = now_ms();

    // The cluster keeps going: more runs, the crons, the work RUNNING at the dump ends.
    let mut after = Vec::new();
    for _ in 0..2 {
        after.push(client.trigger_run("work").await.expect("trigger").id);
    }
    for run in &before {
        client
            .wait_run_within(*run, RUN_GUARD)
            .await
            .expect("a run of before the dump ends");
    }
    tokio::time::sleep(Duration::from_secs(4)).await;
    let forgotten_runs: BTreeSet<i64> = stored_runs(&url).await.iter().map(|r| r.id).collect();

    // The restore: workers drained and stopped, nodes stopped, the workers' state emptied, the
    // dump loaded into a fresh database, ids moved on, the Redis namespace emptied.
    for id in WORKERS {
        cluster.stop_worker(id).await.expect("the worker drains");
    }
    let workers_stopped_ms = now_ms();
    for index in 0..NODES {
        cluster.stop_node(index).await.expect("the node stops");
    }
    for id in WORKERS {
        let state = cluster.worker_state_dir(id);
        std::fs::remove_dir_all(&state)
            .unwrap_or_else(|err| panic!("emptying {}: {err}", state.display()));
    }
    let restore_url = url.clone();
    let restore_db = db.clone();
    let restore_path = dump.clone();
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        mysql_client(
            "mysql",
            &restore_url,
            &[
                "-e",
                &format!(
                    "DROP DATABASE {restore_db}; CREATE DATABASE {restore_db} \
                     CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
                ),
            ],
            None,
            None,
        )?;
        mysql_client(
            "mysql",
            &restore_url,
            &[&restore_db],
            Some(&restore_path),
            None,
        )?;
        mysql_client(
            "mysql",
            &restore_url,
            &[
                &restore_db,
                "-e",
                &format!("UPDATE id_block SET next_id = next_id + {ID_BUMP}"),
            ],
            None,
            None,
        )
    })
    .await
    .expect("the restore's thread")
    .expect("the restore");
    let (redis_url, namespace) = cluster.redis().expect("the nodes use Redis");
    let redis = redis::Client::open(redis_url).expect("redis url");
    let mut conn = redis
        .get_multiplexed_async_connection()
        .await
        .expect("connect to Redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{namespace}:*"))
        .query_async(&mut conn)
        .await
        .expect("the namespace's keys");
    if !keys.is_empty() {
        let _: i64 = redis::cmd("DEL")
            .arg(&keys)
            .query_async(&mut conn)
            .await
            .expect("empty the namespace");
    }

    // What the snapshot holds: the runs, and the attempts RUNNING at it.
    let restored_runs: BTreeSet<i64> = stored_runs(&url).await.iter().map(|r| r.id).collect();
    let running_at_snapshot: Vec<(i64, i64)> = query_store(
        &url,
        "SELECT id, attempt FROM task_instance WHERE state = 'RUNNING'",
    )
    .await;
    let forgotten: BTreeSet<i64> = forgotten_runs.difference(&restored_runs).copied().collect();
    assert!(
        after.iter().all(|run| forgotten.contains(run)),
        "runs triggered after the dump {after:?} are not all forgotten: {forgotten:?}"
    );
    assert!(
        !running_at_snapshot.is_empty(),
        "no attempt was RUNNING at the snapshot: the test proved nothing"
    );

    // The cluster again, on the restored store.
    for index in 0..NODES {
        cluster.start_node(index).await.expect("the node starts");
    }
    let restarted_ms = now_ms();
    for id in WORKERS {
        cluster
            .start_live_worker(id, &worker)
            .await
            .expect("the worker starts");
    }
    let client = cluster.client().await.expect("client");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let paused_ms = now_ms();
    for name in [CATCH_UP, SKIP] {
        client.pause(name).await.expect("pause");
    }
    let runs = settle(&client, &url).await;

    // Every run of the restored store ends SUCCESS; none of the forgotten ones came back.
    let unsuccessful: Vec<String> = runs
        .iter()
        .filter(|r| r.state != "SUCCESS")
        .map(|r| format!("run {} ({}): {}", r.id, r.workflow, r.state))
        .collect();
    assert!(
        unsuccessful.is_empty(),
        "runs not SUCCESS: {unsuccessful:?}"
    );
    assert!(
        runs.iter().all(|r| !forgotten.contains(&r.id)),
        "a forgotten run id came back"
    );

    // What was RUNNING at the snapshot ran to its end before the restore, and again after it
    // as the next attempt; the attempt of the snapshot is lost.
    let notes = read_notes(&effects);
    let mut all_instances: BTreeMap<i64, pb::Instance> = BTreeMap::new();
    for run in &runs {
        for instance in client.instances(run.id).await.expect("instances") {
            all_instances.insert(instance.id, instance);
        }
    }
    let mut reran = 0;
    for (instance, attempt) in &running_at_snapshot {
        let attempt = *attempt as u32;
        let ended_before = notes.iter().any(|n| {
            n.instance == *instance
                && n.attempt == attempt
                && n.what == "end"
                && n.at_ms < restarted_ms
        });
        assert!(
            ended_before,
            "attempt {attempt} of instance {instance} did not end before the restore"
        );
        let stored = all_instances
            .get(instance)
            .unwrap_or_else(|| panic!("instance {instance} is not in the restored store"));
        assert!(
            stored.attempt > attempt && stored.state() == S::Success,
            "instance {instance} after the restore: {stored:?}"
        );
        let lost = stored
            .attempts
            .iter()
            .find(|a| a.attempt == attempt)
            .map(pb::Attempt::state);
        assert_eq!(
            lost,
            Some(S::Failed),
            "the snapshot's attempt of {instance}"
        );
        let ran_after = notes.iter().any(|n| {
            n.instance == *instance
                && n.attempt > attempt
                && n.what == "end"
                && n.at_ms >= restarted_ms
        });
        assert!(
            ran_after,
            "instance {instance} (attempt {attempt} at the snapshot) did not run again after the restore"
        );
        reran += 1;
    }

    // After the restore, no attempt started twice and none overlapped another of its instance.
    let since_restart: Vec<&Note> = notes.iter().filter(|n| n.at_ms >= restarted_ms).collect();
    let problems = restarted_or_overlapping(&since_restart);
    assert!(problems.is_empty(), "{problems:?}");
    // An instance that was WAITING at the snapshot and ran after it runs again under the same
    // attempt number (counted, not required: it depends on what was waiting at the dump).
    let started_before: BTreeSet<(i64, u32)> = notes
        .iter()
        .filter(|n| n.what == "start" && n.at_ms < restarted_ms)
        .map(|n| (n.instance, n.attempt))
        .collect();
    let same_number_again = since_restart
        .iter()
        .filter(|n| n.what == "start" && started_before.contains(&(n.instance, n.attempt)))
        .count();
    let instances: Vec<pb::Instance> = all_instances.into_values().collect();
    assert!(
        instances.iter().all(|i| i.state() == S::Success),
        "{}",
        summary(&instances)
    );

    // The crons: catch_up fires again every slot since the snapshot, once each in the store;
    // skip leaves the slots missed while down out of the store.
    let ledger = read_slot_notes(&slots);
    let in_store = |workflow: &str| -> BTreeMap<i64, usize> {
        let mut slots = BTreeMap::new();
        for run in runs.iter().filter(|r| r.workflow == workflow) {
            *slots.entry(run.logical_time).or_default() += 1;
        }
        slots
    };
    let catch_up = in_store(CATCH_UP);
    let missed: Vec<i64> = slots_between(applied_ms + EDGE_MS, paused_ms - EDGE_MS)
        .into_iter()
        .filter(|slot| catch_up.get(slot) != Some(&1))
        .collect();
    assert!(
        missed.is_empty(),
        "catch_up slots not once in the store: {missed:?}"
    );
    let twice = slots_between(dumped_ms + EDGE_MS, workers_stopped_ms - EDGE_MS);
    assert!(!twice.is_empty(), "no slot between the dump and the stop");
    let not_twice: Vec<(i64, usize)> = twice
        .iter()
        .map(|slot| (*slot, slot_starts(&ledger, CATCH_UP, *slot)))
        .filter(|(_, starts)| *starts != 2)
        .collect();
    assert!(
        not_twice.is_empty(),
        "catch_up slots after the snapshot should have run twice (before the restore and after): {not_twice:?}"
    );
    let skip = in_store(SKIP);
    let dropped = slots_between(
        dumped_ms + EDGE_MS,
        restarted_ms - MISFIRE_GRACE_MS - EDGE_MS,
    );
    assert!(!dropped.is_empty(), "no slot missed while down");
    let refired: Vec<i64> = dropped
        .iter()
        .copied()
        .filter(|slot| skip.contains_key(slot))
        .collect();
    assert!(
        refired.is_empty(),
        "skip slots missed while down were fired after the restore: {refired:?}"
    );
    let after_restart = slots_between(restarted_ms + EDGE_MS, paused_ms - EDGE_MS);
    let not_fired: Vec<i64> = after_restart
        .iter()
        .copied()
        .filter(|slot| skip.get(slot) != Some(&1))
        .collect();
    assert!(
        not_fired.is_empty(),
        "skip slots after the restart: {not_fired:?}"
    );

    println!(
        "restore: snapshot of {} runs after {} ms of load; {} runs created after it forgotten; {} attempts RUNNING at it ran again; {same_number_again} attempts ran again under the same number; {} catch_up slots ran twice; {} skip slots dropped; dump {} ms",
        restored_runs.len(),
        dumped_from_ms - applied_ms,
        forgotten.len(),
        reran,
        twice.len(),
        dropped.len(),
        dumped_ms - dumped_from_ms
    );
    cluster.shutdown().await.expect("clean shutdown");
}
