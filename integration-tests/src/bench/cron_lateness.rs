//! W8: 100 workflows on a per-second cron (`* * * * * *`) for 5 minutes. Every run a cron fire
//! created is matched with its nominal second (the run's logical time): fire lateness is the
//! run's created_at − logical time, dispatch lateness its attempt's dispatched_at − logical time,
//! start lateness its instance's started_at − logical time.
//! Within the window every workflow must have exactly one run per second: a second without one
//! is a missed fire, a second with two a duplicate.

use std::collections::BTreeMap;
use std::time::Duration;

use ax_proto::v1 as pb;

use super::{Checks, ClusterSpec, Env, Measurement, Target, percentile, wall_ms, workflow_yaml};

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let (workflows, seconds) = if env.quick {
        (5usize, 5i64)
    } else {
        (100usize, 300i64)
    };
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    let names: Vec<String> = (0..workflows).map(|i| format!("w8-cron-{i:03}")).collect();
    for name in &names {
        cluster
            .apply(&workflow_yaml(
                name,
                Some("* * * * * *"),
                &[("tick".into(), "true".into(), Vec::new())],
            ))
            .await?;
    }
    // The window opens on a whole second after every workflow is applied and has settled.
    let window_start = (wall_ms() + 2_000) / 1_000 * 1_000 + 1_000;
    let window_end = window_start + seconds * 1_000;
    let until_end = (window_end + 2_000 - wall_ms()).max(0) as u64;
    tokio::time::sleep(Duration::from_millis(until_end)).await;
    let mut control = cluster.control();
    for name in &names {
        control
            .pause_workflow(pb::PauseWorkflowRequest {
                name: name.clone(),
                actor: "ax-bench".into(),
            })
            .await?;
    }

    let mut all_runs = Vec::new();
    let mut in_window: Vec<pb::Run> = Vec::new();
    let mut missed = 0usize;
    let mut duplicate = 0usize;
    for name in &names {
        let runs = control
            .list_runs(pb::ListRunsRequest {
                workflow: name.clone(),
                limit: 1_000,
                state: pb::RunState::Unspecified as i32,
                ..Default::default()
            })
            .await?
            .into_inner()
            .runs;
        let mut per_second: BTreeMap<i64, usize> = BTreeMap::new();
        for run in &runs {
            all_runs.push(run.id);
            if (window_start..window_end).contains(&run.logical_time_ms) {
                *per_second.entry(run.logical_time_ms).or_default() += 1;
                in_window.push(run.clone());
            }
        }
        for second in (window_start..window_end).step_by(1_000) {
            match per_second.get(&second).copied().unwrap_or(0) {
                0 => missed += 1,
                1 => {}
                n => duplicate += n - 1,
            }
        }
        // A fire off the whole second would be neither missed nor duplicate above; count it.
        duplicate += per_second.keys().filter(|t| *t % 1_000 != 0).count();
    }
    cluster.runs.extend(all_runs.iter().copied());
    cluster
        .wait_runs(&all_runs, Duration::from_secs(300))
        .await?;

    let mut checks = Checks::default();
    checks.add(
        "no missed fire",
        missed == 0,
        format!(
            "{missed} of {} nominal seconds have no run",
            workflows as i64 * seconds
        ),
    );
    checks.add(
        "no duplicate fire",
        duplicate == 0,
        format!("{duplicate} duplicate runs"),
    );
    let instances = cluster
        .verify_runs(&all_runs, 1, true, true, &mut checks)
        .await?;
    let logical: BTreeMap<i64, i64> = in_window
        .iter()
        .map(|r| (r.id, r.logical_time_ms))
        .collect();
    let fire: Vec<f64> = in_window
        .iter()
        .map(|r| (r.created_at_ms - r.logical_time_ms) as f64)
        .collect();
    let start: Vec<f64> = instances
        .iter()
        .filter_map(|i| logical.get(&i.run_id).map(|t| (i.started_at_ms - t) as f64))
        .collect();
    // Where a start's lateness goes: the scheduler's part (created and handed to the worker)
    // and the worker's (delivery and spawn, behind the other starts of the second).
    let dispatch: Vec<f64> = instances
        .iter()
        .filter_map(|i| {
            let attempt = i.attempts.first()?;
            logical
                .get(&i.run_id)
                .map(|t| (attempt.dispatched_at_ms - t) as f64)
        })
        .collect();

    let mut m = Measurement::default();
    m.figure("fires in window", "", fire.len() as f64, None);
    m.figure("fire lateness p50", "ms", percentile(&fire, 50.0), None);
    m.figure(
        "fire lateness p99",
        "ms",
        percentile(&fire, 99.0),
        Some(Target::AtMost(50.0)),
    );
    m.figure(
        "fire lateness max",
        "ms",
        percentile(&fire, 100.0),
        Some(Target::AtMost(200.0)),
    );
    m.figure(
        "dispatch lateness p50",
        "ms",
        percentile(&dispatch, 50.0),
        None,
    );
    m.figure(
        "dispatch lateness p99",
        "ms",
        percentile(&dispatch, 99.0),
        None,
    );
    m.figure("start lateness p50", "ms", percentile(&start, 50.0), None);
    m.figure(
        "start lateness p99",
        "ms",
        percentile(&start, 99.0),
        Some(Target::AtMost(50.0)),
    );
    m.figure(
        "start lateness max",
        "ms",
        percentile(&start, 100.0),
        Some(Target::AtMost(200.0)),
    );
    m.figure("missed fires", "", missed as f64, Some(Target::AtMost(0.0)));
    m.figure(
        "duplicate fires",
        "",
        duplicate as f64,
        Some(Target::AtMost(0.0)),
    );
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
