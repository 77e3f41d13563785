//! `BackfillWorkflow`: one run per cron slot of a range, in slot order.
//!
//! The slots come from `ax_core::firing::backfill_slots` (the schedule's time zone and DST rule).
//! Each run has the dedup key `cron:<slot>`, the same as the cron loop's, so a slot that already
//! fired (or was backfilled before) is reported and not doubled. The runs are created one by
//! one in slot order with trigger `backfill`; the store starts or queues each under
//! `max_active_runs` and the keyed limit, and queued runs start in creation order, that is in
//! slot order. Nothing is created when the request is refused: reversed range, more slots than
//! the maximum (the request's, capped by the scheduler's `max_backfill_runs`), a workflow
//! without a cron schedule, the workflow's app or the cluster at its bound on waiting instances
//! (`admission.rs`; a dry run is never refused). A dry run lists the slots with the runs they
//! already have, and counts those as `existing`. Each run gets the workflow's declared param
//! defaults, as a cron fire's does.

use ax_core::cron::{CronSchedule, parse_timezone};
use ax_core::decision::DecisionKind;
use ax_core::firing::{BackfillError, backfill_slots};
use ax_core::spec::TriggerKind;
use ax_proto::v1 as pb;
use ax_store::{DecisionRecord, NewRun, WorkflowRecord};
use tonic::Status;

use super::access::Call;
use crate::clock::now_ms;
use crate::grpc::convert::{self, store_status};
use crate::node::Node;

pub async fn backfill(
    node: &Node,
    call: &Call,
    workflow: &WorkflowRecord,
    request: &pb::BackfillWorkflowRequest,
) -> Result<pb::BackfillWorkflowResponse, Status> {
    let schedule = &workflow.spec.schedule;
    let (Some(expression), TriggerKind::Cron) = (schedule.cron.as_deref(), schedule.trigger) else {
        return Err(Status::failed_precondition(format!(
            "workflow {:?} has no cron schedule: backfill needs one to know its slots",
            workflow.name
        )));
    };
    if request.from_ms < 0 || request.to_ms < 0 {
        return Err(Status::invalid_argument(
            "backfill from and to must not be negative",
        ));
    }
    let cap = node.options.max_backfill_runs;
    let max = match request.max_runs {
        0 => cap,
        n => n.min(cap),
    };
    let cron = CronSchedule::parse(expression)
        .map_err(|err| Status::internal(format!("stored schedule.cron: {err}")))?;
    let tz = parse_timezone(&schedule.timezone)
        .map_err(|err| Status::internal(format!("stored schedule.timezone: {err}")))?;
    let slots = backfill_slots(&cron, tz, request.from_ms, request.to_ms, max).map_err(|err| {
        let mut message = err.to_string();
        if let BackfillError::TooMany { .. } = err
            && max == cap
        {
            message.push_str(&format!(" (the scheduler's max_backfill_runs is {cap})"));
        }
        Status::invalid_argument(message)
    })?;
    let mut response = pb::BackfillWorkflowResponse::default();
    if request.dry_run {
        // Each slot with the run it already has, if any: what a backfill would leave alone.
        for slot in slots {
            let run = node
                .store
                .run_by_dedup_key(workflow.id, &format!("cron:{slot}"))
                .await
                .map_err(store_status)?;
            if run.is_some() {
                response.existing += 1;
            }
            response.slots.push(pb::BackfillSlot {
                logical_time_ms: slot,
                run: run.as_ref().map(|run| convert::run(run, None)),
                created: false,
            });
        }
        return Ok(response);
    }
    // Judged once, for every slot: a backfill is refused whole or goes in whole (its slots
    // past a bound then say so, as cron fires do).
    let ticket = super::admission::admit(node, call, &workflow.spec, slots.len() as u64)?;
    let actor = if request.actor.trim().is_empty() {
        "anonymous".to_string()
    } else {
        request.actor.trim().to_string()
    };
    let mut decisions = Vec::new();
    for slot in slots {
        let now = now_ms();
        let new_run = NewRun {
            workflow_id: workflow.id,
            workflow_version: workflow.version,
            trigger: TriggerKind::Backfill,
            logical_time: slot,
            dedup_key: Some(format!("cron:{slot}")),
            idempotency_key: None,
            // A slot passes no params: the run gets the declared defaults.
            params: ax_core::params::defaults(&workflow.spec.params),
            triggered_by: actor.clone(),
            now,
            audit_from: None,
        };
        let (run, created) = node.runs.create(new_run).await.map_err(store_status)?;
        if created {
            response.created += 1;
            decisions.push(DecisionRecord {
                at: now,
                workflow_id: workflow.id,
                slot_at: slot,
                run_id: Some(run.id),
                instance_id: None,
                task: None,
                kind: DecisionKind::Fired,
                detail: format!("backfill slot, by {actor}"),
                node_id: node.options.node_id.clone(),
            });
        } else {
            response.existing += 1;
        }
        response.slots.push(pb::BackfillSlot {
            logical_time_ms: slot,
            run: Some(convert::run(&run, None)),
            created,
        });
    }
    // Slots that had their run already are counted as created until the next reading: the
    // estimate errs high.
    ticket.settle_all(response.created > 0);
    if response.created > 0 {
        node.dispatch_wake.notify_one();
        node.bump_progress();
    }
    if let Err(err) = node.store.record_decisions(&decisions).await {
        tracing::warn!(workflow = %workflow.name, error = %err, "recording decisions failed");
    }
    Ok(response)
}
