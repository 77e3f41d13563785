//! U1: the web UI in a real browser (Debian's chromium through `browser/measure.mjs`). Figures:
//! the time from navigation to a 2,000-task graph drawn whole (target 2 s) and to a 10,000-task
//! workflow's task list, each over several cold loads; and what an idle UI costs: the
//! scheduler's CPU with no browser, with six pages open and visible (the workflows list, a
//! finished run and task, the workers, a running run and its task's live log), and with the
//! same pages hidden, plus the requests those pages made in each phase. Then the grid of a
//! 300-task workflow with 100 runs (issue 38): its JSON's size and read time, cold loads until
//! its rows and first screens of cells are drawn and painted (the page draws a row as it nears
//! the view), when in those loads the page asked for the grid's data,
//! the time to draw its last row once scrolled to, and the scheduler's CPU with the grid alone
//! open (its live stream) and hidden. Needs node, chromium and `npm ci` in
//! `integration-tests/browser`; without them the workload is unsupported.

use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::{Checks, ClusterSpec, Env, Measurement, Target, cpu_seconds, percentile};
use crate::browser;
use crate::workflows::layered;

const DAG_BUDGET_MS: f64 = 2_000.0;

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let mut m = Measurement::default();
    let chromium = match browser::tools() {
        Ok(chromium) => chromium,
        Err(missing) => {
            m.unsupported = Some(format!("U1 drives a browser: {missing}"));
            return Ok(m);
        }
    };
    let (loads, idle) = if env.quick { (1, 3) } else { (5, 30) };
    // The grid's runs: 100 of a 300-task workflow (10 when quick).
    let grid_runs: usize = if env.quick { 10 } else { GRID_RUNS };
    let mut cluster = env.start(&ClusterSpec::one_worker(4)).await?;
    cluster.apply(&layered("u1-dag", 50, 40)).await?;
    cluster.apply(&layered("u1-huge", 100, 100)).await?;
    cluster
        .apply("name: u1-done\ntasks:\n  - name: hello\n    command: seq 1 200\n")
        .await?;
    cluster
        .apply("name: u1-live\ntasks:\n  - name: waits\n    command: echo started; sleep 600\n")
        .await?;
    cluster.apply(&layered("u1-grid", 3, 100)).await?;
    let http = reqwest::Client::new();
    let base = cluster.endpoint.clone();
    let mut grid_ids = Vec::with_capacity(grid_runs);
    while grid_ids.len() < grid_runs {
        match cluster.trigger("u1-grid").await {
            Ok(run) => grid_ids.push(run.id),
            // 300 waiting instances a run: past the app's bound, the trigger waits its turn.
            Err(err) if refused_for_load(&err) => {
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(err) => return Err(err),
        }
    }
    for id in &grid_ids {
        wait_ended(&http, &base, *id, Duration::from_secs(900)).await?;
    }
    let done = cluster.trigger("u1-done").await?;
    cluster
        .wait_run(done.id, Duration::from_secs(60), Duration::from_millis(100))
        .await?;
    let live = cluster.trigger("u1-live").await?;
    let done_instance = first_instance(&http, &base, done.id, false).await?;
    let live_instance = first_instance(&http, &base, live.id, true).await?;
    let paths = [
        "/".to_string(),
        format!("/runs/{}", done.id),
        format!("/instances/{done_instance}"),
        "/workers".to_string(),
        format!("/runs/{}", live.id),
        format!("/instances/{live_instance}"),
    ];

    let pid = cluster.scheduler_pid()?;
    let baseline = cpu_share(pid, Duration::from_secs(idle)).await?;
    let mut child = tokio::process::Command::new("node")
        .arg("measure.mjs")
        .current_dir(browser::dir())
        .env("AX_UI_URL", &base)
        .env("AX_CHROMIUM", &chromium)
        .env("AX_UI_DAG", "u1-dag")
        .env("AX_UI_HUGE", "u1-huge")
        .env("AX_UI_PAGES", paths.join(","))
        .env("AX_UI_IDLE_S", idle.to_string())
        .env("AX_UI_LOADS", loads.to_string())
        .env("AX_UI_GRID", "u1-grid")
        .env("AX_UI_GRID_RUNS", grid_runs.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting node measure.mjs")?;
    let stdout = child.stdout.take().context("node's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    // (CPU seconds, instant) at each phase's start, and the last line: the result.
    let mut marks: Vec<(String, f64, Instant)> = Vec::new();
    let mut last = String::new();
    let read = async {
        while let Some(line) = lines.next_line().await? {
            if let Ok(Value::Object(mark)) = serde_json::from_str::<Value>(&line)
                && let Some(phase) = mark.get("phase").and_then(Value::as_str)
            {
                marks.push((phase.to_string(), cpu_seconds(pid)?, Instant::now()));
                continue;
            }
            last = line;
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(Duration::from_secs(600), read)
        .await
        .context("measure.mjs hung")??;
    let output = child.wait_with_output().await?;
    if !output.status.success() {
        bail!(
            "measure.mjs failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let result: Value =
        serde_json::from_str(&last).with_context(|| format!("measure.mjs printed {last:?}"))?;
    let share = |from: &str, to: &str| -> Option<f64> {
        let a = marks.iter().find(|(p, _, _)| p == from)?;
        let b = marks.iter().find(|(p, _, _)| p == to)?;
        Some((b.1 - a.1) / b.2.duration_since(a.2).as_secs_f64() * 100.0)
    };
    let visible = share("visible", "hidden").context("no visible phase")?;
    let hidden = share("hidden", "done").context("no hidden phase")?;
    let per_minute = |phase: &str| -> f64 {
        let total: u64 = result[phase]
            .as_object()
            .map(|pages| pages.values().filter_map(Value::as_u64).sum())
            .unwrap_or(0);
        total as f64 * 60.0 / idle as f64
    };
    let grid_visible = share("grid_visible", "grid_hidden").context("no grid phase")?;
    let grid_hidden = share("grid_hidden", "grid_done").context("no hidden grid phase")?;
    let grid_ms = numbers(&result["grid_ms"]);
    let grid_api_ms = numbers(&result["grid_api_ms"]);
    let dag_ms = numbers(&result["dag_ms"]);
    let huge_ms = numbers(&result["huge_ms"]);

    let mut checks = Checks::default();
    checks.add(
        "every cold load drew the whole graph and listed the big workflow",
        dag_ms.len() == loads && huge_ms.len() == loads && result["dag_nodes"] == 2_000,
        format!("{result}"),
    );
    checks.add(
        "every cold load of the grid drew it, and its last row once scrolled to",
        grid_ms.len() == loads
            && result["grid_cells"] == grid_runs * 300
            && result["grid_scroll_ms"].is_number(),
        format!("{}", result["grid_cells"]),
    );
    let hidden_requests = per_minute("hidden_requests");
    let grid_hidden_requests = per_minute("grid_hidden_requests");
    checks.add(
        "a hidden grid makes no request",
        grid_hidden_requests == 0.0,
        format!("{}", result["grid_hidden_requests"]),
    );
    checks.add(
        "hidden pages make no request",
        hidden_requests == 0.0,
        format!("{}", result["hidden_requests"]),
    );
    m.figure(
        "2,000-task graph drawn, cold load median",
        "ms",
        percentile(&dag_ms, 50.0),
        Some(Target::AtMost(DAG_BUDGET_MS)),
    );
    m.figure(
        "2,000-task graph drawn, cold load max",
        "ms",
        percentile(&dag_ms, 100.0),
        None,
    );
    m.figure(
        "10,000-task workflow listed, cold load median",
        "ms",
        percentile(&huge_ms, 50.0),
        None,
    );
    m.figure("scheduler CPU, no browser", "% of a core", baseline, None);
    m.figure("scheduler CPU, 6 pages open", "% of a core", visible, None);
    m.figure("scheduler CPU, 6 pages hidden", "% of a core", hidden, None);
    m.figure(
        "requests by the open pages",
        "1/min",
        per_minute("visible_requests"),
        None,
    );
    m.figure(
        "requests by the hidden pages",
        "1/min",
        hidden_requests,
        None,
    );
    m.figure(
        &format!("grid of {grid_runs} runs × 300 tasks drawn, cold load median"),
        "ms",
        percentile(&grid_ms, 50.0),
        None,
    );
    m.figure(
        &format!("grid of {grid_runs} runs × 300 tasks drawn, cold load max"),
        "ms",
        percentile(&grid_ms, 100.0),
        None,
    );
    m.figure(
        "grid's data asked for (page and modules loaded), cold load median",
        "ms",
        percentile(&numbers(&result["grid_requested_ms"]), 50.0),
        None,
    );
    m.figure(
        "grid scrolled to its last row, drawn",
        "ms",
        result["grid_scroll_ms"].as_f64().unwrap_or(f64::NAN),
        None,
    );
    m.figure(
        "grid JSON (GetGrid) read, median",
        "ms",
        percentile(&grid_api_ms, 50.0),
        None,
    );
    m.figure(
        "grid JSON size",
        "KB",
        result["grid_bytes"].as_f64().unwrap_or(0.0) / 1000.0,
        None,
    );
    m.figure(
        "scheduler CPU, grid open",
        "% of a core",
        grid_visible,
        None,
    );
    m.figure(
        "scheduler CPU, grid hidden",
        "% of a core",
        grid_hidden,
        None,
    );
    m.figure(
        "requests by the open grid",
        "1/min",
        per_minute("grid_visible_requests"),
        None,
    );
    m.figure(
        "requests by the hidden grid",
        "1/min",
        grid_hidden_requests,
        None,
    );
    m.notes.push(format!(
        "{loads} cold loads of each timed page; idle phases of {idle} s each; requests open: {}, hidden: {}",
        result["visible_requests"], result["hidden_requests"]
    ));
    m.checks = checks.0;
    let cancel = http
        .post(format!("{base}/api/v1/runs/{}/cancel", live.id))
        .json(&serde_json::json!({ "reason": "U1 is done" }))
        .send()
        .await?;
    if !cancel.status().is_success() {
        bail!("cancelling the live run: {}", cancel.status());
    }
    cluster
        .wait_run(live.id, Duration::from_secs(60), Duration::from_millis(100))
        .await?;
    cluster.shutdown().await?;
    Ok(m)
}

/// The most runs a grid shows: U1 measures it full.
const GRID_RUNS: usize = 100;

/// Whether a trigger was refused for the waiting instances' bound (it creates nothing then).
fn refused_for_load(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<tonic::Status>()
            .is_some_and(|status| status.code() == tonic::Code::ResourceExhausted)
    })
}

/// Waits until run `id` has ended (a queued run has not).
async fn wait_ended(
    http: &reqwest::Client,
    base: &str,
    id: i64,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let run: Value = http
            .get(format!("{base}/api/v1/runs/{id}"))
            .send()
            .await?
            .json()
            .await?;
        let state = run["state"].as_str().unwrap_or_default();
        if [
            "RUN_STATE_SUCCESS",
            "RUN_STATE_FAILED",
            "RUN_STATE_CANCELLED",
        ]
        .contains(&state)
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("run {id} is {state} after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The run's first instance id, once it exists (and, if `running`, once it runs).
async fn first_instance(
    http: &reqwest::Client,
    base: &str,
    run: i64,
    running: bool,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list: Value = http
            .get(format!("{base}/api/v1/runs/{run}/instances"))
            .send()
            .await?
            .json()
            .await?;
        let first = &list["instances"][0];
        if let Some(id) = first["id"].as_str()
            && (!running || first["state"] == "INSTANCE_STATE_RUNNING")
        {
            return Ok(id.to_string());
        }
        if Instant::now() > deadline {
            bail!(
                "run {run} has no {} instance after 60 s",
                if running { "running" } else { "" }
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The process's CPU over `window`, in % of a core.
async fn cpu_share(pid: u32, window: Duration) -> anyhow::Result<f64> {
    let (before, started) = (cpu_seconds(pid)?, Instant::now());
    tokio::time::sleep(window).await;
    Ok((cpu_seconds(pid)? - before) / started.elapsed().as_secs_f64() * 100.0)
}

fn numbers(value: &Value) -> Vec<f64> {
    value
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}
