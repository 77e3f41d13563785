//! Fires cron schedules.
//!
//! Each due schedule creates a run whose dedup key is its logical fire time, so a fire is
//! exactly-once across nodes and restarts: a second node (or a retry after a crash between
//! creating the run and advancing the schedule) finds the run already there. A schedule whose
//! slots fell in a downtime fires once for them (the default misfire policy) and moves on to
//! the next slot after now.

use std::sync::Arc;
use std::time::Duration;

use ax_core::Millis;
use ax_core::cron::{CronSchedule, parse_timezone};
use ax_core::spec::TriggerKind;
use ax_store::{DueSchedule, NewRun};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::node::Node;

/// How far ahead the loop looks, so it can sleep until the exact fire instant.
const LOOKAHEAD_MS: Millis = 1_000;
/// The longest sleep when nothing is due soon (a schedule applied on another node shows up
/// within this).
const IDLE_POLL: Duration = Duration::from_millis(500);

pub async fn run(node: Arc<Node>, cancel: CancellationToken) {
    loop {
        let sleep = match fire_due(&node).await {
            Ok(next) => next,
            Err(err) => {
                tracing::error!(error = %err, "cron pass failed");
                IDLE_POLL
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {}
            _ = node.schedule_wake.notified() => {}
            _ = cancel.cancelled() => return,
        }
    }
}

/// Fires every schedule that is due and returns how long to sleep until the next one.
async fn fire_due(node: &Node) -> anyhow::Result<Duration> {
    let now = now_ms();
    let upcoming = node.store.due_schedules(now + LOOKAHEAD_MS, 1_000).await?;
    let mut next_wake = IDLE_POLL;
    for due in upcoming {
        if due.next_fire_at > now {
            let wait = Duration::from_millis((due.next_fire_at - now) as u64);
            next_wake = next_wake.min(wait);
            continue;
        }
        if let Err(err) = fire(node, &due, now).await {
            tracing::error!(workflow = %due.workflow, error = %err, "cron fire failed");
        }
    }
    Ok(next_wake)
}

async fn fire(node: &Node, due: &DueSchedule, now: Millis) -> anyhow::Result<()> {
    let schedule = CronSchedule::parse(&due.cron)?;
    let tz = parse_timezone(&due.timezone)?;
    let run = NewRun {
        workflow_id: due.workflow_id,
        workflow_version: due.workflow_version,
        trigger: TriggerKind::Cron,
        logical_time: due.next_fire_at,
        dedup_key: Some(format!("cron:{}", due.next_fire_at)),
        idempotency_key: None,
        params: Default::default(),
        triggered_by: format!("cron@{}", node.options.node_id),
        now,
    };
    let (record, created) = node.store.create_run(&run).await?;
    // The next slot after now: slots missed during a downtime collapse into this one fire.
    let after = due.next_fire_at.max(now);
    let next = schedule.next_after(after, tz).unwrap_or(Millis::MAX);
    node.store
        .advance_schedule(due.workflow_id, due.next_fire_at, next)
        .await?;
    if created {
        let lateness = now - due.next_fire_at;
        tracing::info!(workflow = %due.workflow, run = %record.id, logical_time = due.next_fire_at, lateness_ms = lateness, "cron fired");
        node.dispatch_wake.notify_one();
        node.bump_progress();
    }
    Ok(())
}
