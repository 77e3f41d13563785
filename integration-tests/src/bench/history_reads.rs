//! W11: the reads people make of a long history, through the JSON API the web UI calls (the
//! same handlers as `ControlService`), and a purge of its oldest part. 10,000,000 finished
//! one-task runs of one workflow go into the store (10,000 in quick mode, `AX_BENCH_HISTORY`
//! sets another size; one in a hundred failed), as W7 writes its history; then each
//! read is made `SAMPLES` times: the newest page of runs, pages deep in the history (before a
//! random id), 50 pages walked by `nextBeforeId`, pages of failed runs, a page across every
//! workflow, the workflows list with each one's strip of recent runs, a run's page (the run and
//! its instances with every attempt) and `why`. The same cluster also holds a 2,000-task and a
//! 10,000-task workflow: their definition and laid-out graph are timed too, the first graph
//! read apart (it computes the layout; later reads are served from the cache).
//!
//! Then the purge: a steady trickle of one-task runs is triggered and dispatched for a while
//! alone, then while `PurgeRuns` deletes the oldest [`PURGE_SLICE`] of the history (each run
//! with its instance and attempt); the purge's rate (runs and rows a second) and the trickle's
//! queue → start latency alone and during the purge are reported.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ax_proto::v1 as pb;
use rand::Rng;
use serde_json::Value;

use super::large_history::{history_size, write_history};
use super::{Checks, ClusterSpec, Env, Measurement, Target, percentile, wall_ms};
use crate::workflows::layered;

const NAME: &str = "w11-history";
const SAMPLES: usize = 50;
const PAGE: usize = 50;
/// A page of runs, or any read a person waits on, answers within this (p99).
const PAGE_BUDGET_MS: f64 = 50.0;
/// The oldest part of the history the purge deletes.
const PURGE_SLICE: f64 = 0.02;
/// One-task runs triggered per second while the purge is measured.
const TRICKLE_PER_S: u64 = 10;
/// How long the trickle is measured alone, before the purge.
const TRICKLE_ALONE_S: u64 = 10;
const TRICKLE: &str = "w11-trickle";

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let history = history_size(env)?;
    let mut cluster = env.start(&ClusterSpec::one_worker(8)).await?;
    cluster
        .apply(&format!(
            "name: {NAME}\ntasks:\n  - name: t000\n    command: 'true'\n"
        ))
        .await?;
    for (name, layers, width) in [("w11-dag-2000", 50, 40), ("w11-dag-10000", 100, 100)] {
        cluster.apply(&layered(name, layers, width)).await?;
    }
    cluster
        .apply(&format!(
            "name: {TRICKLE}\ntasks:\n  - name: t\n    command: 'true'\n"
        ))
        .await?;
    let inserted_at = Instant::now();
    let written = write_history(&cluster.store_url, NAME, 1, history).await?;
    let rows = written.rows;
    let insert_secs = inserted_at.elapsed().as_secs_f64();

    let api = Api {
        http: reqwest::Client::new(),
        base: format!("{}/api/v1", cluster.endpoint),
    };
    let mut checks = Checks::default();
    let mut m = Measurement::default();
    m.figure("finished runs in the store", "", history as f64, None);
    m.figure("history insert", "rows/s", rows as f64 / insert_secs, None);
    m.figure("history insert, time", "s", insert_secs, None);

    let runs_url = format!("runs?workflow={NAME}&limit={PAGE}");
    let (newest_ms, newest) = api.times(&runs_url).await?;
    let ids = run_ids(&newest[0]);
    let newest_id = ids.first().copied().unwrap_or(0);
    checks.add(
        "the newest page is full, newest first",
        ids.len() == PAGE && ids.windows(2).all(|w| w[0] > w[1]),
        format!("{} ids: {ids:?}", ids.len()),
    );
    // The history's ids are one block, reserved together.
    let oldest_id = newest_id - history as i64 + 1;
    let mut rng = rand::rng();
    let deep: Vec<i64> = (0..SAMPLES)
        .map(|_| rng.random_range(oldest_id + PAGE as i64..=newest_id))
        .collect();
    let mut deep_ms = Vec::with_capacity(SAMPLES);
    let mut deep_ok = true;
    for before in &deep {
        let (ms, page) = api.get(&format!("{runs_url}&before={before}")).await?;
        deep_ms.push(ms);
        let ids = run_ids(&page);
        deep_ok &= ids.len() == PAGE && ids[0] == before - 1;
    }
    checks.add(
        "a page before an id starts right below it",
        deep_ok,
        "a deep page started elsewhere or was short",
    );

    let (walk_ms, walked) = walk(&api, &runs_url, SAMPLES).await?;
    checks.add(
        "walking by nextBeforeId repeats and skips no run",
        walked.len() == SAMPLES * PAGE
            && walked.windows(2).all(|w| w[0] == w[1] + 1)
            && walked.first() == Some(&newest_id),
        format!("{} runs walked", walked.len()),
    );

    let failed_url = format!("runs?workflow={NAME}&state=failed&limit={PAGE}");
    let (failed_ms, failed_pages) = api.times(&failed_url).await?;
    checks.add(
        "a page of failed runs holds only failed runs",
        failed_pages.iter().all(|page| {
            page["runs"].as_array().is_some_and(|runs| {
                runs.len() == PAGE.min(history / 100)
                    && runs.iter().all(|r| r["state"] == "RUN_STATE_FAILED")
            })
        }),
        "a failed-runs page was short or held another state",
    );
    let mut failed_deep_ms = Vec::with_capacity(SAMPLES);
    for before in &deep {
        failed_deep_ms.push(api.get(&format!("{failed_url}&before={before}")).await?.0);
    }
    let (all_ms, _) = api.times(&format!("runs?limit={PAGE}")).await?;
    let (workflows_ms, workflows) = api.times("workflows?recent=12&summary=true").await?;
    checks.add(
        "the workflows list strips the last 12 runs",
        workflows[0]["workflows"].as_array().is_some_and(|list| {
            list.iter()
                .any(|w| w["name"] == NAME && w["recentRuns"].as_array().map(Vec::len) == Some(12))
        }),
        "the history workflow has no strip of 12 runs",
    );
    let mut run_page_ms = Vec::with_capacity(SAMPLES);
    let mut run_pages_ok = true;
    for id in &deep {
        let (run_ms, run) = api.get(&format!("runs/{id}")).await?;
        let (instances_ms, instances) = api
            .get(&format!("runs/{id}/instances?attempts=true"))
            .await?;
        run_page_ms.push(run_ms + instances_ms);
        run_pages_ok &= run["id"].as_str().and_then(|s| s.parse::<i64>().ok()) == Some(*id)
            && instances["instances"][0]["attempts"]
                .as_array()
                .is_some_and(|a| a.len() == 1);
    }
    checks.add(
        "a run's page has the run and its instance's attempt",
        run_pages_ok,
        "a run page lacked its run or attempt",
    );
    let (why_ms, _) = api.times(&format!("workflows/{NAME}/why")).await?;

    let (first_dag_ms, first_dag) = api.get("workflows/w11-dag-2000/dag?layout=true").await?;
    checks.add(
        "the 2,000-task graph is laid out",
        first_dag["nodes"].as_array().map(Vec::len) == Some(2_000)
            && first_dag["layout"]["omitted"]
                .as_str()
                .unwrap_or("")
                .is_empty(),
        format!("layout: {}", first_dag["layout"]),
    );
    let (dag_ms, _) = api.times("workflows/w11-dag-2000/dag?layout=true").await?;
    let (huge_ms, huge) = api.times("workflows/w11-dag-10000").await?;
    let (huge_dag_ms, huge_dag) = api.times("workflows/w11-dag-10000/dag?layout=true").await?;
    checks.add(
        "the 10,000-task workflow lists every task, its graph says why it is not drawn",
        huge[0]["tasks"].as_array().map(Vec::len) == Some(10_000)
            && !huge_dag[0]["layout"]["omitted"]
                .as_str()
                .unwrap_or("")
                .is_empty(),
        "tasks missing or the graph drawn",
    );

    let page = Some(Target::AtMost(PAGE_BUDGET_MS));
    m.figure(
        "runs page, newest p50",
        "ms",
        percentile(&newest_ms, 50.0),
        None,
    );
    m.figure(
        "runs page, newest p99",
        "ms",
        percentile(&newest_ms, 99.0),
        page,
    );
    m.figure(
        "runs page, deep p50",
        "ms",
        percentile(&deep_ms, 50.0),
        None,
    );
    m.figure(
        "runs page, deep p99",
        "ms",
        percentile(&deep_ms, 99.0),
        page,
    );
    m.figure(
        "runs page, walked p99",
        "ms",
        percentile(&walk_ms, 99.0),
        page,
    );
    m.figure(
        "failed runs page, newest p99",
        "ms",
        percentile(&failed_ms, 99.0),
        page,
    );
    m.figure(
        "failed runs page, deep p99",
        "ms",
        percentile(&failed_deep_ms, 99.0),
        page,
    );
    m.figure(
        "runs page, every workflow p99",
        "ms",
        percentile(&all_ms, 99.0),
        page,
    );
    m.figure(
        "workflows with 12 recent runs p99",
        "ms",
        percentile(&workflows_ms, 99.0),
        page,
    );
    m.figure(
        "a run's page p99",
        "ms",
        percentile(&run_page_ms, 99.0),
        page,
    );
    m.figure(
        "a run's page p50",
        "ms",
        percentile(&run_page_ms, 50.0),
        None,
    );
    m.figure("why p50", "ms", percentile(&why_ms, 50.0), None);
    m.figure("why p99", "ms", percentile(&why_ms, 99.0), page);
    m.figure(
        "2,000-task graph, first read (layout)",
        "ms",
        first_dag_ms,
        None,
    );
    m.figure(
        "2,000-task graph, cached p50",
        "ms",
        percentile(&dag_ms, 50.0),
        None,
    );
    m.figure(
        "10,000-task workflow p50",
        "ms",
        percentile(&huge_ms, 50.0),
        None,
    );
    m.figure(
        "10,000-task graph (not drawn) p50",
        "ms",
        percentile(&huge_dag_ms, 50.0),
        None,
    );
    m.notes.push(format!(
        "{SAMPLES} reads of each, one at a time over one HTTP connection; a run's page is its \
         run and its instances with attempts, read one after the other"
    ));
    purge_under_load(&mut cluster, &written, &mut checks, &mut m).await?;
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    /// One read: the milliseconds from sending to the whole body, and the body.
    async fn get(&self, path: &str) -> anyhow::Result<(f64, Value)> {
        let url = format!("{}/{path}", self.base);
        let started = Instant::now();
        let response = self
            .http
            .get(&url)
            .send()
            .await
            .with_context(|| format!("GET {url}"))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .with_context(|| format!("GET {url}"))?;
        let ms = started.elapsed().as_secs_f64() * 1_000.0;
        if !status.is_success() {
            bail!("GET {url}: {status} {}", String::from_utf8_lossy(&body));
        }
        let value =
            serde_json::from_slice(&body).with_context(|| format!("GET {url}: not JSON"))?;
        Ok((ms, value))
    }

    /// The same read `SAMPLES` times.
    async fn times(&self, path: &str) -> anyhow::Result<(Vec<f64>, Vec<Value>)> {
        let mut times = Vec::with_capacity(SAMPLES);
        let mut bodies = Vec::with_capacity(SAMPLES);
        for _ in 0..SAMPLES {
            let (ms, body) = self.get(path).await?;
            times.push(ms);
            bodies.push(body);
        }
        Ok((times, bodies))
    }
}

/// `pages` pages from the newest, each before the last one's `nextBeforeId`.
async fn walk(api: &Api, url: &str, pages: usize) -> anyhow::Result<(Vec<f64>, Vec<i64>)> {
    let (mut times, mut ids) = (Vec::with_capacity(pages), Vec::new());
    let mut next = String::new();
    for _ in 0..pages {
        let path = if next.is_empty() {
            url.to_string()
        } else {
            format!("{url}&before={next}")
        };
        let (ms, page) = api.get(&path).await?;
        times.push(ms);
        ids.extend(run_ids(&page));
        next = page["nextBeforeId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if next.is_empty() {
            break;
        }
    }
    Ok((times, ids))
}

/// The ids of a page of runs (64-bit ids are strings in the JSON mapping).
fn run_ids(page: &Value) -> Vec<i64> {
    page["runs"]
        .as_array()
        .map(|runs| {
            runs.iter()
                .filter_map(|r| r["id"].as_str().and_then(|id| id.parse().ok()))
                .collect()
        })
        .unwrap_or_default()
}

/// The trickle alone, then the purge of the history's oldest [`PURGE_SLICE`] beside it.
async fn purge_under_load(
    cluster: &mut super::Cluster,
    history: &super::large_history::History,
    checks: &mut Checks,
    m: &mut Measurement,
) -> anyhow::Result<()> {
    let alone = trickle(cluster, Trickle::For(Duration::from_secs(TRICKLE_ALONE_S))).await?;
    // The cutoff falls right after the slice's last run ended: exactly that many runs go.
    let slice = ((history.runs as f64 * PURGE_SLICE) as usize).max(1);
    let cutoff = history.timeline.ended(slice - 1) + 1;
    let older_than_ms = wall_ms() - cutoff;
    let mut control = cluster.control();
    let purge = tokio::spawn(async move {
        let started = Instant::now();
        let response = control
            .purge_runs(pb::PurgeRunsRequest {
                older_than_ms,
                workflow: NAME.into(),
                dry_run: false,
                actor: "ax-bench".into(),
            })
            .await
            .context("purging the oldest runs")?
            .into_inner();
        anyhow::Ok((started.elapsed().as_secs_f64(), response))
    });
    let during = trickle(cluster, Trickle::Until(&purge)).await?;
    let (purge_secs, purged) = purge.await.context("the purge task")??;
    checks.add(
        "the purge took exactly the runs that ended before the cutoff, with their rows",
        purged.runs == slice as u64
            && purged.instances == slice as u64
            && purged.attempts == slice as u64,
        format!(
            "{} runs, {} instances, {} attempts purged of {slice}",
            purged.runs, purged.instances, purged.attempts
        ),
    );
    let oldest_left = history.first_run + slice as i64;
    let kept = cluster
        .control()
        .get_run(pb::GetRunRequest { id: oldest_left })
        .await
        .is_ok();
    let gone = cluster
        .control()
        .get_run(pb::GetRunRequest {
            id: oldest_left - 1,
        })
        .await
        .is_err();
    checks.add(
        "the first run after the cutoff stays, the last before it is gone",
        kept && gone,
        format!(
            "run {oldest_left} kept: {kept}; run {} gone: {gone}",
            oldest_left - 1
        ),
    );
    let rows =
        purged.runs + purged.instances + purged.attempts + purged.log_chunks + purged.decisions;
    m.figure("purged runs", "", purged.runs as f64, None);
    m.figure("purge, time", "s", purge_secs, None);
    m.figure(
        "purge rate, runs",
        "runs/s",
        purged.runs as f64 / purge_secs,
        None,
    );
    m.figure("purge rate, rows", "rows/s", rows as f64 / purge_secs, None);
    for (phase, latencies) in [("without a purge", &alone), ("during the purge", &during)] {
        m.figure(
            &format!("trickle queue → start p50, {phase}"),
            "ms",
            percentile(latencies, 50.0),
            None,
        );
        m.figure(
            &format!("trickle queue → start p99, {phase}"),
            "ms",
            percentile(latencies, 99.0),
            None,
        );
    }
    checks.add(
        "the trickle ran during the purge",
        !during.is_empty(),
        "no run started during the purge",
    );
    m.figure(
        "trickle runs during the purge",
        "",
        during.len() as f64,
        None,
    );
    m.notes.push(format!(
        "purge: PurgeRuns of the oldest {:.0}% of the history ({slice} runs, each with its \
         instance and attempt) while {TRICKLE_PER_S} one-task runs a second are triggered; \
         queue → start is an instance's creation to its start as stored",
        PURGE_SLICE * 100.0
    ));
    Ok(())
}

enum Trickle<'a> {
    For(Duration),
    Until(&'a tokio::task::JoinHandle<anyhow::Result<(f64, pb::PurgeRunsResponse)>>),
}

/// Triggers [`TRICKLE_PER_S`] one-task runs a second for the duration, or until the purge has
/// ended; waits for them and returns each one's queue → start latency (ms).
async fn trickle(cluster: &mut super::Cluster, how: Trickle<'_>) -> anyhow::Result<Vec<f64>> {
    let started = Instant::now();
    let mut every = tokio::time::interval(Duration::from_millis(1_000 / TRICKLE_PER_S));
    let mut runs = Vec::new();
    loop {
        let done = match &how {
            Trickle::For(span) => started.elapsed() >= *span,
            Trickle::Until(purge) => purge.is_finished(),
        };
        if done {
            break;
        }
        every.tick().await;
        runs.push(cluster.trigger(TRICKLE).await?.id);
    }
    cluster.wait_runs(&runs, Duration::from_secs(120)).await?;
    let mut latencies = Vec::with_capacity(runs.len());
    for run in runs {
        for instance in cluster.list_instances(run).await? {
            if instance.started_at_ms > 0 {
                latencies.push((instance.started_at_ms - instance.created_at_ms) as f64);
            }
        }
    }
    Ok(latencies)
}
