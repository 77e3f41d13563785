//! W7: W2's chain again, after 10,000,000 finished historical instances (with their runs and
//! attempts) of the same workflow were written into the store (10,000 in quick mode;
//! `AX_BENCH_HISTORY` sets another size for W7 and W11). The chain runs before the history is
//! inserted and again after it, in the same cluster, so the ratio compares like with like.
//!
//! The history goes in with multi-row SQL inserts of 10,000 rows, ten to a transaction (no API
//! creates finished instances in bulk), runs, instances and attempts each on a connection of
//! its own at once on MySQL (one after the other on SQLite, whose writers take turns), under
//! ids reserved through the `id_block` allocator exactly as the store reserves them, so they
//! cannot collide with ids the running scheduler hands out. The runs ended over the year
//! before yesterday, evenly spaced, so a retention or a purge cuts the history by age.

use std::time::Instant;

use anyhow::Context;
use sqlx::{AnyConnection, Connection, Row};

use super::chain_latency::{apply_chain, chain_length, run_chain};
use super::{Checks, ClusterSpec, Env, Measurement, Target, mean, percentile, wall_ms};

/// Rows per insert statement, and statements per transaction.
const BATCH: usize = 10_000;
const STATEMENTS_PER_TX: usize = 10;
/// The history's full size, in finished instances (W7 and W11 at full size).
pub const FULL_HISTORY: usize = 10_000_000;
const QUICK_HISTORY: usize = 10_000;
const DAY_MS: i64 = 86_400_000;
const NAME: &str = "w7-chain";
const MEASURED_CHAINS: usize = 5;

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let length = chain_length(env);
    let history = history_size(env)?;
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    apply_chain(&cluster, NAME, length).await?;
    let mut checks = Checks::default();
    let before = chains(&mut cluster, length, &mut checks).await?;

    let inserted_at = Instant::now();
    let rows = insert_history(&cluster.store_url, NAME, length, history).await?;
    let insert_secs = inserted_at.elapsed().as_secs_f64();

    let after = chains(&mut cluster, length, &mut checks).await?;
    let mut m = Measurement::default();
    m.figure(
        "historical instances in the store",
        "",
        history as f64,
        None,
    );
    m.figure("history insert", "rows/s", rows as f64 / insert_secs, None);
    m.figure("history insert, time", "s", insert_secs, None);
    m.figure(
        "per-hop median, empty store",
        "ms",
        percentile(&before, 50.0),
        None,
    );
    m.figure(
        "per-hop median, with history",
        "ms",
        percentile(&after, 50.0),
        None,
    );
    m.figure("per-hop mean, empty store", "ms", mean(&before), None);
    m.figure("per-hop mean, with history", "ms", mean(&after), None);
    m.figure(
        "per-hop mean ratio history / empty",
        "x",
        mean(&after) / mean(&before).max(0.001),
        Some(Target::AtMost(1.2)),
    );
    m.notes.push(format!(
        "hops of {MEASURED_CHAINS} chains pooled on each side, after one warm-up chain"
    ));
    m.notes.push(
        "the ratio uses the mean hop: the API's timestamps are whole milliseconds, so a median of \
         a few ms moves in steps of 25% or more"
            .into(),
    );
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}

/// One untimed warm-up chain, then `MEASURED_CHAINS` chains whose hops are pooled: one chain of
/// 100 hops on a busy 2-core machine is too noisy to compare two means within 20%.
async fn chains(
    cluster: &mut super::Cluster,
    length: usize,
    checks: &mut Checks,
) -> anyhow::Result<Vec<f64>> {
    run_chain(cluster, NAME, length, checks).await?;
    let mut hops = Vec::new();
    for _ in 0..MEASURED_CHAINS {
        hops.extend(run_chain(cluster, NAME, length, checks).await?.hops);
    }
    Ok(hops)
}

/// Finished instances to write: `AX_BENCH_HISTORY` when set (digits, `_` allowed), else
/// [`FULL_HISTORY`], or [`QUICK_HISTORY`] in quick mode.
pub fn history_size(env: &super::Env) -> anyhow::Result<usize> {
    match std::env::var("AX_BENCH_HISTORY") {
        Ok(text) if !text.trim().is_empty() => text
            .trim()
            .replace('_', "")
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .with_context(|| {
                format!("AX_BENCH_HISTORY={text:?}: expected a number of instances, e.g. 10000000")
            }),
        _ => Ok(if env.quick {
            QUICK_HISTORY
        } else {
            FULL_HISTORY
        }),
    }
}

/// Where the history lies in time: run `r` of `runs` ended at `ended(r)` (its first task was
/// created `length + 1` ms before). The runs are spread evenly over the year that ends a day
/// before `now`.
#[derive(Debug, Clone, Copy)]
pub struct Timeline {
    pub first: i64,
    pub spacing: i64,
    pub length: i64,
}

impl Timeline {
    pub fn new(now: i64, runs: usize, length: usize) -> Timeline {
        let span = 365 * DAY_MS;
        let length = length as i64;
        let spacing = (span / runs.max(1) as i64).max(length + 2);
        Timeline {
            first: now - DAY_MS - spacing * runs as i64,
            spacing,
            length,
        }
    }

    /// When run `r` was created.
    pub fn created(&self, r: usize) -> i64 {
        self.first + r as i64 * self.spacing
    }

    /// When run `r` ended.
    pub fn ended(&self, r: usize) -> i64 {
        self.created(r) + self.length + 1
    }
}

/// What [`insert_history`] wrote.
#[derive(Debug, Clone, Copy)]
pub struct History {
    /// Rows written (runs, instances and attempts).
    pub rows: usize,
    pub runs: usize,
    pub first_run: i64,
    pub timeline: Timeline,
}

/// Writes `count` finished instances of `workflow` (in runs of `length` tasks named `t000`…)
/// and their attempts. One run in a hundred failed.
pub async fn insert_history(
    store_url: &str,
    workflow: &str,
    length: usize,
    count: usize,
) -> anyhow::Result<usize> {
    Ok(write_history(store_url, workflow, length, count)
        .await?
        .rows)
}

/// [`insert_history`], saying where the history lies.
pub async fn write_history(
    store_url: &str,
    workflow: &str,
    length: usize,
    count: usize,
) -> anyhow::Result<History> {
    sqlx::any::install_default_drivers();
    let mysql = store_url.starts_with("mysql:");
    let mut conn = connect(store_url).await?;
    let row = sqlx::query("SELECT id, latest_version FROM workflow WHERE name = ?")
        .bind(workflow)
        .fetch_one(&mut conn)
        .await
        .with_context(|| format!("finding the workflow {workflow}"))?;
    let workflow_id: i64 = row.try_get(0)?;
    let version: i64 = row.try_get(1)?;
    let runs = count.div_ceil(length);
    let total = runs * length;
    let first_run = reserve(&mut conn, "run", runs as i64).await?;
    let first_instance = reserve(&mut conn, "task_instance", total as i64).await?;
    let timeline = Timeline::new(wall_ms(), runs, length);

    let run_row = move |r: usize| {
        let (at, end) = (timeline.created(r), timeline.ended(r));
        format!(
            "({}, {workflow_id}, {version}, '{}', 'api', {at}, NULL, NULL, '{{}}', \
             'ax-bench-history', 0, {at}, {end})",
            first_run + r as i64,
            if failed(r) { "FAILED" } else { "SUCCESS" },
        )
    };
    // A failed run's last task failed with exit code 1.
    let outcome = move |n: usize| {
        let (r, task) = (n / length, n % length);
        if failed(r) && task + 1 == length {
            ("FAILED", 1)
        } else {
            ("SUCCESS", 0)
        }
    };
    let instance_row = move |n: usize| {
        let (r, task) = (n / length, n % length);
        let created = timeline.created(r) + task as i64;
        let (state, exit) = outcome(n);
        format!(
            "({}, {}, {workflow_id}, {version}, 't{task:03}', '{state}', 1, 'bench-history', 0, \
             {created}, {created}, {created}, {}, {exit}, NULL)",
            first_instance + n as i64,
            first_run + r as i64,
            created + 1
        )
    };
    let attempt_row = move |n: usize| {
        let (r, task) = (n / length, n % length);
        let created = timeline.created(r) + task as i64;
        let (state, exit) = outcome(n);
        format!(
            "({}, 1, '{state}', 'bench-history', 'bench-node', {created}, {created}, {}, {exit}, \
             NULL, 0, 0, '')",
            first_instance + n as i64,
            created + 1
        )
    };
    let runs_load = Load {
        head: "INSERT INTO run (id, workflow_id, workflow_version, state, trigger_type, \
               logical_time, dedup_key, idempotency_key, params_json, triggered_by, \
               cancel_requested, created_at, finished_at) VALUES ",
        rows: runs,
    };
    let instances_load = Load {
        head: "INSERT INTO task_instance (id, run_id, workflow_id, workflow_version, task_name, \
               state, attempt, worker_id, priority, not_before, created_at, started_at, \
               finished_at, exit_code, last_heartbeat_at) VALUES ",
        rows: total,
    };
    let attempts_load = Load {
        head: "INSERT INTO task_attempt (instance_id, attempt, state, worker_id, node_id, \
               dispatched_at, started_at, finished_at, exit_code, signal_num, pid, log_lines, \
               message) VALUES ",
        rows: total,
    };
    let rows = if mysql {
        // Three tables, three connections: the server inserts into them side by side.
        let (mut c2, mut c3) = (connect(store_url).await?, connect(store_url).await?);
        let (a, b, c) = tokio::try_join!(
            runs_load.write(&mut conn, run_row),
            instances_load.write(&mut c2, instance_row),
            attempts_load.write(&mut c3, attempt_row),
        )?;
        let _ = c2.close().await;
        let _ = c3.close().await;
        // MariaDB refreshes a table's index statistics by itself once a tenth of it has
        // changed, a little later; until then its plans are made for the empty tables the
        // history went into. A store that grew to this size over months has current
        // statistics.
        sqlx::query("ANALYZE TABLE run, task_instance, task_attempt")
            .execute(&mut conn)
            .await
            .context("refreshing the index statistics")?;
        a + b + c
    } else {
        runs_load.write(&mut conn, run_row).await?
            + instances_load.write(&mut conn, instance_row).await?
            + attempts_load.write(&mut conn, attempt_row).await?
    };
    let _ = conn.close().await;
    Ok(History {
        rows,
        runs,
        first_run,
        timeline,
    })
}

async fn connect(store_url: &str) -> anyhow::Result<AnyConnection> {
    let mut conn = sqlx::AnyConnection::connect(store_url)
        .await
        .with_context(|| format!("connecting to {store_url}"))?;
    if store_url.starts_with("mysql:") {
        // The rows are unique by construction: the unique keys need not be checked row by row.
        sqlx::query("SET SESSION unique_checks = 0")
            .execute(&mut conn)
            .await?;
    }
    Ok(conn)
}

fn failed(run: usize) -> bool {
    run % 100 == 99
}

/// One table's rows: multi-row inserts of [`BATCH`] rows, [`STATEMENTS_PER_TX`] to a
/// transaction.
struct Load {
    head: &'static str,
    rows: usize,
}

impl Load {
    async fn write(
        &self,
        conn: &mut AnyConnection,
        row: impl Fn(usize) -> String,
    ) -> anyhow::Result<usize> {
        let mut sql = String::with_capacity(BATCH * 180);
        let mut n = 0;
        while n < self.rows {
            let mut tx = conn.begin().await?;
            for _ in 0..STATEMENTS_PER_TX {
                if n == self.rows {
                    break;
                }
                let end = (n + BATCH).min(self.rows);
                sql.clear();
                sql.push_str(self.head);
                for i in n..end {
                    if i > n {
                        sql.push_str(", ");
                    }
                    sql.push_str(&row(i));
                }
                // Every value is a number or a constant of this file: nothing from outside is
                // spliced in.
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.clone()))
                    .execute(&mut *tx)
                    .await
                    .context("inserting history rows")?;
                n = end;
            }
            tx.commit().await?;
        }
        Ok(self.rows)
    }
}

/// Reserves `size` ids of one allocator row with the store's own compare-and-swap.
async fn reserve(conn: &mut AnyConnection, name: &str, size: i64) -> anyhow::Result<i64> {
    loop {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "SELECT next_id FROM id_block WHERE name = '{name}'"
        )))
        .fetch_one(&mut *conn)
        .await?;
        let next: i64 = row.try_get(0)?;
        let done = sqlx::query(sqlx::AssertSqlSafe(format!(
            "UPDATE id_block SET next_id = {} WHERE name = '{name}' AND next_id = {next}",
            next + size
        )))
        .execute(&mut *conn)
        .await?;
        if done.rows_affected() == 1 {
            return Ok(next);
        }
    }
}
