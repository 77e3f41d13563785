//! W7: W2's chain again, after 1,000,000 finished historical instances (with their runs and
//! attempts) of the same workflow were written into the store. The chain runs before the history
//! is inserted and again after it, in the same cluster, so the ratio compares like with like. The history goes in with multi-row SQL inserts of 5,000 rows (no API creates finished
//! instances in bulk), under ids reserved through the `id_block` allocator exactly as the store
//! reserves them, so they cannot collide with ids the running scheduler hands out.

use std::time::Instant;

use anyhow::Context;
use sqlx::{AnyConnection, Connection, Row};

use super::chain_latency::{apply_chain, chain_length, run_chain};
use super::{Checks, ClusterSpec, Env, Measurement, Target, mean, percentile, wall_ms};

const BATCH: usize = 5_000;
const NAME: &str = "w7-chain";
const MEASURED_CHAINS: usize = 5;

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let length = chain_length(env);
    let history: usize = if env.quick { 10_000 } else { 1_000_000 };
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

/// Writes `count` finished instances of `workflow` (in runs of `length` tasks named `t000`…)
/// and their attempts; returns the number of rows written. One run in a hundred failed.
pub async fn insert_history(
    store_url: &str,
    workflow: &str,
    length: usize,
    count: usize,
) -> anyhow::Result<usize> {
    sqlx::any::install_default_drivers();
    let mut conn = sqlx::AnyConnection::connect(store_url)
        .await
        .with_context(|| format!("connecting to {store_url}"))?;
    let written = write_history(&mut conn, workflow, length, count).await?;
    // MariaDB refreshes a table's index statistics by itself once a tenth of it has changed,
    // a little later; until then its plans are made for the empty tables the history went
    // into. A store that grew to this size over months has current statistics.
    if store_url.starts_with("mysql:") {
        sqlx::query("ANALYZE TABLE run, task_instance, task_attempt")
            .execute(&mut conn)
            .await
            .context("refreshing the index statistics")?;
    }
    let _ = conn.close().await;
    Ok(written)
}

async fn write_history(
    conn: &mut AnyConnection,
    workflow: &str,
    length: usize,
    count: usize,
) -> anyhow::Result<usize> {
    let row = sqlx::query("SELECT id, latest_version FROM workflow WHERE name = ?")
        .bind(workflow)
        .fetch_one(&mut *conn)
        .await
        .with_context(|| format!("finding the workflow {workflow}"))?;
    let workflow_id: i64 = row.try_get(0)?;
    let version: i64 = row.try_get(1)?;
    let runs = count.div_ceil(length);
    let first_run = reserve(conn, "run", runs as i64).await?;
    let first_instance = reserve(conn, "task_instance", (runs * length) as i64).await?;

    // A month ago, one run every few seconds, each task 1 ms after the previous one.
    let base = wall_ms() - 30 * 24 * 3_600_000;
    let mut written = 0usize;
    let mut run_rows = Vec::with_capacity(BATCH);
    for r in 0..runs {
        let at = base + r as i64 * 2_000;
        run_rows.push(format!(
            "({}, {workflow_id}, {version}, '{}', 'api', {at}, NULL, NULL, '{{}}', \
             'ax-bench-history', 0, {at}, {})",
            first_run + r as i64,
            if failed(r) { "FAILED" } else { "SUCCESS" },
            at + length as i64 + 1
        ));
        if run_rows.len() == BATCH || r + 1 == runs {
            written += flush(
                conn,
                "INSERT INTO run (id, workflow_id, workflow_version, state, trigger_type, \
                 logical_time, dedup_key, idempotency_key, params_json, triggered_by, \
                 cancel_requested, created_at, finished_at) VALUES ",
                &mut run_rows,
            )
            .await?;
        }
    }
    let total = runs * length;
    let mut instance_rows = Vec::with_capacity(BATCH);
    let mut attempt_rows = Vec::with_capacity(BATCH);
    for n in 0..total {
        let (r, task) = (n / length, n % length);
        let id = first_instance + n as i64;
        let created = base + r as i64 * 2_000 + task as i64;
        let (started, finished) = (created, created + 1);
        // A failed run's last task failed with exit code 1.
        let (state, exit) = if failed(r) && task + 1 == length {
            ("FAILED", 1)
        } else {
            ("SUCCESS", 0)
        };
        instance_rows.push(format!(
            "({id}, {}, {workflow_id}, {version}, 't{task:03}', '{state}', 1, 'bench-history', 0, \
             {created}, {created}, {started}, {finished}, {exit}, NULL)",
            first_run + r as i64
        ));
        attempt_rows.push(format!(
            "({id}, 1, '{state}', 'bench-history', 'bench-node', {created}, {started}, \
             {finished}, {exit}, NULL, 0, 0, '')"
        ));
        if instance_rows.len() == BATCH || n + 1 == total {
            written += flush(
                conn,
                "INSERT INTO task_instance (id, run_id, workflow_id, workflow_version, task_name, \
                 state, attempt, worker_id, priority, not_before, created_at, started_at, \
                 finished_at, exit_code, last_heartbeat_at) VALUES ",
                &mut instance_rows,
            )
            .await?;
            written += flush(
                conn,
                "INSERT INTO task_attempt (instance_id, attempt, state, worker_id, node_id, \
                 dispatched_at, started_at, finished_at, exit_code, signal_num, pid, log_lines, \
                 message) VALUES ",
                &mut attempt_rows,
            )
            .await?;
        }
    }
    Ok(written)
}

fn failed(run: usize) -> bool {
    run % 100 == 99
}

async fn flush(
    conn: &mut AnyConnection,
    head: &str,
    rows: &mut Vec<String>,
) -> anyhow::Result<usize> {
    let n = rows.len();
    // Every value is a number or a constant of this file: nothing from outside is spliced in.
    let sql = format!("{head}{}", rows.join(", "));
    sqlx::query(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .context("inserting history rows")?;
    rows.clear();
    Ok(n)
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
