//! W12: dynamic fan-out. One task writes a JSON list of 10,000 numbers to `$AX_OUTPUT`, a `true`
//! task maps over it (`for_each:`, one item instance per element, fanned out in the advance
//! that judges it), and a sink joins every item; one scheduler and one worker of capacity 64, as
//! W1. The headline is trigger → sink end (the sink's finished_at by the API, from the harness's
//! wall clock at the trigger); `ax-bench` divides it by W1's 10,000-task time when W1 ran in the
//! same invocation (target ≤ 1.2×: the fan-out costs little more than triggering as many
//! independent tasks). The fan-out is the list's end → the first item's start, the join the
//! last item's end → the sink's start.

use std::collections::BTreeMap;
use std::time::Duration;

use ax_proto::v1 as pb;

use super::{Checks, ClusterSpec, Env, Measurement, Target, wall_ms};

/// Items of the list: as many as W1 has tasks, so the two times compare.
pub fn items(quick: bool) -> usize {
    super::throughput::tasks(quick)
}

pub async fn run(env: &Env) -> anyhow::Result<Measurement> {
    let count = items(env.quick);
    let mut cluster = env.start(&ClusterSpec::one_worker(64)).await?;
    // `seq -s,` writes the list in one process; its 48,890 bytes for 10,000 items are under the
    // 64 KiB an attempt may pass on.
    let source = format!(
        r#"name: w12-mapped
tasks:
  - name: list
    command: printf 'items=[%s]\n' "$(seq -s, 0 {last})" >> "$AX_OUTPUT"
  - name: each
    upstream: list
    for_each: ${{tasks.list.outputs.items}}
    command: "true"
  - name: sink
    upstream: each
    command: "true"
"#,
        last = count - 1
    );
    cluster.apply(&source).await?;

    let triggered_ms = wall_ms();
    let run = cluster.trigger("w12-mapped").await?;
    cluster
        .wait_run(run.id, Duration::from_secs(600), Duration::from_millis(25))
        .await?;

    let mut checks = Checks::default();
    // The list, the mapped task's parent, its items and the sink; the parent runs no attempt
    // of its own, so one attempt per instance is checked for the others below.
    let instances = cluster
        .verify_runs(&[run.id], count + 3, true, false, &mut checks)
        .await?;
    let one = |task: &str| -> anyhow::Result<&pb::Instance> {
        instances
            .iter()
            .find(|i| i.task == task && i.shard_parent_id == 0)
            .ok_or_else(|| anyhow::anyhow!("no instance of {task}"))
    };
    let list = one("list")?;
    let parent = one("each")?;
    let sink = one("sink")?;
    let mut by_index: BTreeMap<u32, usize> = BTreeMap::new();
    let mut stray = 0usize;
    let mut not_once = 0usize;
    for item in instances.iter().filter(|i| i.shard_parent_id != 0) {
        if item.task != "each"
            || item.shard_parent_id != parent.id
            || item.shard_total as usize != count
        {
            stray += 1;
        }
        *by_index.entry(item.shard_index).or_default() += 1;
        let started = item.attempts.iter().filter(|a| a.started_at_ms > 0).count();
        if item.attempts.len() != 1 || started != 1 {
            not_once += 1;
        }
    }
    let indexes_ok = by_index.len() == count
        && by_index.values().all(|n| *n == 1)
        && by_index.keys().copied().eq(0..count as u32);
    checks.add(
        "every item exists exactly once (indexes 0..N, one instance each, of the one parent)",
        indexes_ok && stray == 0,
        format!(
            "{} distinct indexes of {count}, {} doubled, {stray} of another parent or total",
            by_index.len(),
            by_index.values().filter(|n| **n > 1).count(),
        ),
    );
    checks.add(
        "every item ran exactly one attempt, started once",
        not_once == 0,
        format!("{not_once} items have another attempt count"),
    );
    let items: Vec<&pb::Instance> = instances
        .iter()
        .filter(|i| i.shard_parent_id == parent.id)
        .collect();
    let last_item_end = items.iter().map(|i| i.finished_at_ms).max().unwrap_or(0);
    let first_item_start = items
        .iter()
        .map(|i| i.started_at_ms)
        .filter(|t| *t > 0)
        .min()
        .unwrap_or(0);
    checks.add(
        "the sink started after the last item ended",
        sink.started_at_ms >= last_item_end,
        format!(
            "sink started at {}, the last item ended at {last_item_end}",
            sink.started_at_ms
        ),
    );

    let total_s = (sink.finished_at_ms - triggered_ms) as f64 / 1_000.0;
    let mut m = Measurement::default();
    m.figure("trigger -> sink end", "s", total_s, None);
    m.figure(
        "items/s trigger -> sink end",
        "1/s",
        count as f64 / total_s,
        None,
    );
    m.figure(
        "fan-out: list end -> first item start",
        "ms",
        (first_item_start - list.finished_at_ms) as f64,
        None,
    );
    m.figure(
        "join: last item end -> sink start",
        "ms",
        (sink.started_at_ms - last_item_end) as f64,
        Some(Target::AtMost(100.0)),
    );
    m.checks = checks.0;
    cluster.shutdown().await?;
    Ok(m)
}
