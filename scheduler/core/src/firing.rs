//! Cron policies, pure: which slots fire now (misfire policy and the start/end window), whether
//! a run starts, queues, is skipped or replaces the active ones (overlap policy, max active runs,
//! keyed concurrency), and the slots of a backfill.
//!
//! # Slots, "due" and "missed"
//! A *slot* is an instant the cron expression produces in its time zone (the DST rule of
//! [`crate::cron`]). The schedule stores the next slot it has not handled (`next_fire_at`).
//! When the loop looks at time `now`, the unhandled slots `s <= now` are *overdue*:
//! - When the oldest of them is at most `MISFIRE_GRACE_MS` (5 s) late, they are all **due** and
//!   all fire, whatever the misfire policy: a loop that woke a little late, or a busy store, is not
//!   a misfire.
//! - Otherwise the scheduler was down (or the workflow paused): the overdue slots are a backlog.
//!   Its latest slot is **due** if it is at most 5 s late; every other slot of the backlog is
//!   **missed**. The misfire policy picks which run: `skip` only a due latest slot,
//!   `fire_once` the latest slot once (late, `CaughtUp`, when it is missed), `catch_up N` the
//!   latest N slots in slot order. A due slot therefore always fires, and a downtime's backlog
//!   fires once under `fire_once` however many slots it holds. The others are dropped
//!   (`Misfired`; reported as a count with the first and last slot, never a list).
//!
//! On resume every slot that passed while paused is missed, even one within the grace
//! ([`resume_point`]).
//!
//! A slot before `schedule.start` or after `schedule.end` never fires (`OutsideWindow`); once a
//! slot past the end has passed, the schedule has no next fire.
//!
//! # Overlap and the run queue
//! See [`on_fire`] (scheduled fires: cron and dependency) and [`start_or_queue`] (every trigger,
//! decided by the store inside the run-creation transaction).

use std::collections::VecDeque;

use chrono_tz::Tz;

use crate::Millis;
use crate::cron::CronSchedule;
use crate::spec::{MisfirePolicy, OverlapPolicy};

/// How late a slot may be handled and still count as on time (see the module doc).
pub const MISFIRE_GRACE_MS: Millis = 5_000;
/// Missed slots are counted up to this many; past it the count is a lower bound.
pub const COUNT_CAP: u64 = 10_000;

/// `schedule.start` / `schedule.end`, both inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    pub start_at: Option<Millis>,
    pub end_at: Option<Millis>,
}

impl Window {
    pub fn of(schedule: &crate::spec::ScheduleSpec) -> Window {
        Window {
            start_at: schedule.start_at,
            end_at: schedule.end_at,
        }
    }

    pub fn contains(&self, at: Millis) -> bool {
        self.start_at.is_none_or(|start| at >= start) && self.end_at.is_none_or(|end| at <= end)
    }
}

/// Consecutive slots summarised: never an unbounded list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotSpan {
    pub first: Millis,
    pub last: Millis,
    pub count: u64,
    /// The walk stopped at [`COUNT_CAP`]: there are at least `count` slots and `last` is the
    /// last one counted.
    pub at_least: bool,
}

impl SlotSpan {
    /// "3 slots from 2023-11-14T22:13:20Z to 2023-11-14T22:15:20Z", for a decision's detail
    /// line (the decision itself is one row at the span's first slot).
    pub fn describe(&self) -> String {
        let more = if self.at_least { "at least " } else { "" };
        if self.count == 1 {
            format!("1 slot at {}", crate::rfc3339(self.first))
        } else {
            format!(
                "{more}{} slots from {} to {}",
                self.count,
                crate::rfc3339(self.first),
                crate::rfc3339(self.last)
            )
        }
    }
}

/// One slot to create a run for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedFire {
    pub at: Millis,
    /// A missed slot the misfire policy kept (`CaughtUp`), rather than a due one (`Fired`).
    pub late: bool,
}

/// What to do with a schedule at `now`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FirePlan {
    /// In slot order.
    pub fire: Vec<PlannedFire>,
    /// Missed slots the policy dropped.
    pub misfired: Option<SlotSpan>,
    /// Slots that passed outside the start/end window.
    pub outside_window: Option<SlotSpan>,
    /// The next unhandled slot; `None` when the schedule has no more (past its end, or 2100).
    pub next_fire_at: Option<Millis>,
}

/// The first slot at or after `at`.
fn slot_at_or_after(cron: &CronSchedule, tz: Tz, at: Millis) -> Option<Millis> {
    cron.next_after(at.saturating_sub(1), tz)
}

/// Slots in `[from, to]`, walked up to `cap`; `None` when there are none.
fn span(cron: &CronSchedule, tz: Tz, from: Millis, to: Millis, cap: u64) -> Option<SlotSpan> {
    let first = slot_at_or_after(cron, tz, from).filter(|&s| s <= to)?;
    let mut result = SlotSpan {
        first,
        last: first,
        count: 1,
        at_least: false,
    };
    let mut cursor = first;
    while let Some(next) = cron.next_after(cursor, tz).filter(|&s| s <= to) {
        if result.count >= cap {
            result.at_least = true;
            break;
        }
        result.count += 1;
        result.last = next;
        cursor = next;
    }
    Some(result)
}

/// The latest `n` slots in `[from, to]`, in order, without walking the whole range: the look-back
/// doubles from one minute until it holds `n` slots or reaches `from`.
fn latest_slots(cron: &CronSchedule, tz: Tz, from: Millis, to: Millis, n: usize) -> Vec<Millis> {
    if n == 0 || to < from {
        return Vec::new();
    }
    let mut lookback: Millis = 60_000;
    loop {
        let start = to.saturating_sub(lookback).max(from);
        let mut last: VecDeque<Millis> = VecDeque::with_capacity(n + 1);
        let mut cursor = slot_at_or_after(cron, tz, start);
        let mut walked = 0u64;
        while let Some(slot) = cursor.filter(|&s| s <= to) {
            last.push_back(slot);
            if last.len() > n {
                last.pop_front();
            }
            walked += 1;
            if walked > COUNT_CAP * 10 {
                break;
            }
            cursor = cron.next_after(slot, tz);
        }
        if last.len() >= n || start == from {
            return last.into_iter().collect();
        }
        lookback = lookback.saturating_mul(2);
    }
}

/// The slots to handle at `now` for a schedule whose next unhandled slot is `next_fire_at`.
pub fn plan_fires(
    cron: &CronSchedule,
    tz: Tz,
    next_fire_at: Millis,
    now: Millis,
    policy: MisfirePolicy,
    window: Window,
) -> FirePlan {
    plan(
        cron,
        tz,
        next_fire_at,
        now,
        now - MISFIRE_GRACE_MS,
        policy,
        window,
    )
}

/// [`plan_fires`] with slots before `cutoff` counted as missed.
fn plan(
    cron: &CronSchedule,
    tz: Tz,
    next_fire_at: Millis,
    now: Millis,
    cutoff: Millis,
    policy: MisfirePolicy,
    window: Window,
) -> FirePlan {
    if next_fire_at > now {
        return FirePlan {
            fire: Vec::new(),
            misfired: None,
            outside_window: None,
            next_fire_at: Some(next_fire_at),
        };
    }
    let end = window.end_at.unwrap_or(Millis::MAX);
    let mut outside: Option<SlotSpan> = None;
    let mut ended = false;
    let mut from = next_fire_at;
    if let Some(start) = window.start_at
        && from < start
    {
        outside = span(cron, tz, from, (start - 1).min(now), COUNT_CAP);
        from = start;
    }
    // Slots after the end that have passed: the schedule is over.
    if end < now
        && let Some(after_end) = span(cron, tz, from.max(end.saturating_add(1)), now, COUNT_CAP)
    {
        ended = true;
        outside = Some(match outside {
            Some(before) => SlotSpan {
                first: before.first,
                last: after_end.last,
                count: before.count + after_end.count,
                at_least: before.at_least || after_end.at_least,
            },
            None => after_end,
        });
    }
    let hi = now.min(end);
    let mut fire = Vec::new();
    let mut misfired = None;
    let oldest = slot_at_or_after(cron, tz, from).filter(|&s| s <= hi);
    match oldest {
        None => {}
        // No backlog: every overdue slot is due and fires (at most the grace's worth of slots).
        Some(oldest) if oldest >= cutoff => {
            let mut cursor = Some(oldest);
            while let Some(slot) = cursor.filter(|&s| s <= hi) {
                fire.push(PlannedFire {
                    at: slot,
                    late: false,
                });
                cursor = cron.next_after(slot, tz);
            }
        }
        // A backlog: the policy picks among all overdue slots; a due latest slot always fires.
        Some(_) => {
            let latest = latest_slots(cron, tz, from, hi, 1).first().copied();
            let latest_is_due = latest.is_some_and(|latest| latest >= cutoff);
            let keep = match policy {
                MisfirePolicy::Skip => 0,
                MisfirePolicy::FireOnce => 1,
                MisfirePolicy::CatchUp { max } => max as usize,
            };
            let keep = if latest_is_due { keep.max(1) } else { keep };
            let kept = latest_slots(cron, tz, from, hi, keep);
            let dropped_to = kept.first().map_or(hi, |&first| first - 1);
            misfired = span(cron, tz, from, dropped_to, COUNT_CAP);
            // Every slot of a backlog but a due latest one is missed, however late it is.
            fire.extend(kept.into_iter().map(|at| PlannedFire {
                at,
                late: !(latest_is_due && Some(at) == latest),
            }));
        }
    }
    let next = cron.next_after(now, tz);
    let next_fire_at = if ended { None } else { next };
    FirePlan {
        fire,
        misfired,
        outside_window: outside,
        next_fire_at,
    }
}

/// The first slot a schedule should wait for when applied or shown at `now`: the first slot
/// after `now` that is not before the start; `None` when it would be past the end.
pub fn first_slot(cron: &CronSchedule, tz: Tz, now: Millis, window: Window) -> Option<Millis> {
    let from = match window.start_at {
        Some(start) if start > now => start,
        _ => now.saturating_add(1),
    };
    slot_at_or_after(cron, tz, from).filter(|&s| window.end_at.is_none_or(|end| s <= end))
}

/// The next `n` slots after `now` inside the window (what `axctl get workflow` shows).
pub fn upcoming(cron: &CronSchedule, tz: Tz, now: Millis, window: Window, n: usize) -> Vec<Millis> {
    let mut out = Vec::with_capacity(n.min(64));
    let mut next = first_slot(cron, tz, now, window);
    while let Some(slot) = next {
        if out.len() >= n {
            break;
        }
        out.push(slot);
        next = cron
            .next_after(slot, tz)
            .filter(|&s| window.end_at.is_none_or(|end| s <= end));
    }
    out
}

/// Where a resumed schedule picks up: every slot that passed while paused (all slots up to `now`,
/// even those within the grace) is missed and handled by the misfire policy, like a downtime.
/// Returns the plan (its `misfired` span is what the pause dropped) and the `next_fire_at` to
/// store: the earliest slot the policy keeps, so the cron loop fires exactly the kept slots (the
/// loop then sees them missed or due, and keeps them all), or the plan's next slot when nothing
/// is kept.
pub fn resume_point(
    cron: &CronSchedule,
    tz: Tz,
    paused_next_fire_at: Millis,
    now: Millis,
    policy: MisfirePolicy,
    window: Window,
) -> (FirePlan, Option<Millis>) {
    let plan = plan(cron, tz, paused_next_fire_at, now, now + 1, policy, window);
    let next = plan.fire.first().map(|fire| fire.at).or(plan.next_fire_at);
    (plan, next)
}

/// What a scheduled fire does, given the runs of its workflow that have not ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireDecision {
    /// Create the run; the store starts or queues it by [`start_or_queue`].
    Create,
    /// Drop the slot (overlap `skip`).
    Skip,
    /// Cancel the unfinished runs, then create the run (overlap `replace`).
    Replace,
}

/// Run counts a decision needs. For a keyed workflow `*_same_key` count runs with the new run's
/// key; without a key they equal the workflow-wide counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunLoad {
    /// RUNNING runs of the workflow.
    pub active: u32,
    /// RUNNING runs with the same key.
    pub active_same_key: u32,
    /// QUEUED runs created before this one with the same key (or of the workflow, unkeyed).
    pub queued_ahead: u32,
}

/// The limits of a workflow (its latest version).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RunLimits {
    pub overlap: OverlapPolicy,
    /// 0 = no limit.
    pub max_active_runs: u32,
    /// `Some` for a keyed workflow (`concurrency.key`).
    pub max_runs_per_key: Option<u32>,
}

/// Overlap `skip` and `replace` for a cron fire (a dependency fire is made in the run-ending
/// transaction and obeys only overlap `queue`, through [`start_or_queue`]). `unfinished` counts the runs (RUNNING or QUEUED; for a keyed workflow,
/// with the same key) other than this slot's own run. `allow` and `queue` always create: the
/// store then starts or queues the run.
pub fn on_fire(overlap: OverlapPolicy, unfinished: u32) -> FireDecision {
    match overlap {
        _ if unfinished == 0 => FireDecision::Create,
        OverlapPolicy::Allow | OverlapPolicy::Queue => FireDecision::Create,
        OverlapPolicy::Skip => FireDecision::Skip,
        OverlapPolicy::Replace => FireDecision::Replace,
    }
}

/// Whether [`on_fire`] needs the unfinished runs at all: only overlap `skip` and `replace` look
/// at them (`allow` and `queue` always create), so the others need not read them.
pub fn overlap_reads_unfinished(overlap: OverlapPolicy) -> bool {
    matches!(overlap, OverlapPolicy::Skip | OverlapPolicy::Replace)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Start,
    /// Created QUEUED, with the reason for the decision log.
    Queue(QueueReason),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueReason {
    /// Older queued runs go first.
    Behind(u32),
    MaxActiveRuns(u32),
    /// Overlap `queue`: a scheduled fire waits for the active run.
    Overlap,
    PerKey(u32),
}

impl QueueReason {
    pub fn describe(self) -> String {
        match self {
            QueueReason::Behind(n) => format!("{n} queued runs ahead"),
            QueueReason::MaxActiveRuns(max) => format!("max_active_runs {max} reached"),
            QueueReason::Overlap => "overlap policy queue: a run is active".into(),
            QueueReason::PerKey(max) => format!("max_runs_per_key {max} reached for its key"),
        }
    }
}

/// Whether a new (or queued) run starts now or waits, for every trigger. `scheduled` is true for
/// cron and dependency fires, which also obey overlap `queue` (at most one active run when
/// max_active_runs is 0). Queued runs start in creation order: a run never passes an older queued
/// run with its key.
pub fn start_or_queue(limits: RunLimits, scheduled: bool, load: RunLoad) -> Admission {
    if load.queued_ahead > 0 {
        return Admission::Queue(QueueReason::Behind(load.queued_ahead));
    }
    if limits.max_active_runs > 0 && load.active >= limits.max_active_runs {
        return Admission::Queue(QueueReason::MaxActiveRuns(limits.max_active_runs));
    }
    if scheduled && limits.overlap == OverlapPolicy::Queue && load.active_same_key > 0 {
        return Admission::Queue(QueueReason::Overlap);
    }
    if let Some(max) = limits.max_runs_per_key
        && load.active_same_key >= max
    {
        return Admission::Queue(QueueReason::PerKey(max));
    }
    Admission::Start
}

/// Why a backfill was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackfillError {
    #[error(
        "backfill range is reversed: from {} is after to {}",
        crate::rfc3339(*from),
        crate::rfc3339(*to)
    )]
    Reversed { from: Millis, to: Millis },
    #[error("backfill range has more than {max} slots; narrow the range or raise --max")]
    TooMany { max: u32 },
}

/// Every slot in `[from, to]` (both inclusive) in order, DST-correct; refused when there are
/// more than `max`.
pub fn backfill_slots(
    cron: &CronSchedule,
    tz: Tz,
    from: Millis,
    to: Millis,
    max: u32,
) -> Result<Vec<Millis>, BackfillError> {
    if from > to {
        return Err(BackfillError::Reversed { from, to });
    }
    let mut slots = Vec::new();
    let mut cursor = slot_at_or_after(cron, tz, from);
    while let Some(slot) = cursor.filter(|&s| s <= to) {
        if slots.len() >= max as usize {
            return Err(BackfillError::TooMany { max });
        }
        slots.push(slot);
        cursor = cron.next_after(slot, tz);
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cron::parse_timezone;

    /// 2026-01-01T00:00:00Z.
    const T0: Millis = 1_767_225_600_000;
    const MIN: Millis = 60_000;
    const HOUR: Millis = 60 * MIN;

    fn cron(expr: &str) -> CronSchedule {
        CronSchedule::parse(expr).unwrap()
    }

    fn utc() -> Tz {
        parse_timezone("UTC").unwrap()
    }

    fn at(fires: &[PlannedFire]) -> Vec<(Millis, bool)> {
        fires.iter().map(|f| (f.at, f.late)).collect()
    }

    fn plan(next: Millis, now: Millis, policy: MisfirePolicy) -> FirePlan {
        plan_fires(
            &cron("* * * * *"),
            utc(),
            next,
            now,
            policy,
            Window::default(),
        )
    }

    #[test]
    fn a_slot_in_the_future_is_left_alone() {
        let p = plan(T0 + MIN, T0, MisfirePolicy::Skip);
        assert!(p.fire.is_empty());
        assert_eq!(p.next_fire_at, Some(T0 + MIN));
    }

    #[test]
    fn a_due_slot_fires_under_every_policy_even_a_little_late() {
        for policy in [
            MisfirePolicy::Skip,
            MisfirePolicy::FireOnce,
            MisfirePolicy::CatchUp { max: 3 },
        ] {
            let p = plan(T0, T0 + MISFIRE_GRACE_MS, policy);
            assert_eq!(at(&p.fire), [(T0, false)], "{policy:?}");
            assert_eq!(p.misfired, None);
            assert_eq!(p.next_fire_at, Some(T0 + MIN));
        }
    }

    #[test]
    fn one_ms_past_the_grace_a_slot_is_missed() {
        let p = plan(T0, T0 + MISFIRE_GRACE_MS + 1, MisfirePolicy::Skip);
        assert!(p.fire.is_empty());
        assert_eq!(
            p.misfired,
            Some(SlotSpan {
                first: T0,
                last: T0,
                count: 1,
                at_least: false
            })
        );
    }

    #[test]
    fn skip_drops_every_missed_slot_and_goes_on_from_now() {
        // Down from T0 to T0 + 10m + 30s: slots T0..T0+10m missed.
        let now = T0 + 10 * MIN + 30_000;
        let p = plan(T0, now, MisfirePolicy::Skip);
        assert!(p.fire.is_empty());
        let dropped = p.misfired.unwrap();
        assert_eq!(
            (dropped.first, dropped.last, dropped.count),
            (T0, T0 + 10 * MIN, 11)
        );
        assert_eq!(p.next_fire_at, Some(T0 + 11 * MIN));
    }

    #[test]
    fn fire_once_runs_the_latest_missed_slot() {
        let now = T0 + 10 * MIN + 30_000;
        let p = plan(T0, now, MisfirePolicy::FireOnce);
        assert_eq!(at(&p.fire), [(T0 + 10 * MIN, true)]);
        let dropped = p.misfired.unwrap();
        assert_eq!(
            (dropped.first, dropped.last, dropped.count),
            (T0, T0 + 9 * MIN, 10)
        );
    }

    #[test]
    fn catch_up_runs_the_latest_n_in_order_the_due_one_among_them() {
        // now is 2 s after the T0+10m slot: it is due, T0..T0+9m are missed.
        let now = T0 + 10 * MIN + 2_000;
        let p = plan(T0, now, MisfirePolicy::CatchUp { max: 3 });
        assert_eq!(
            at(&p.fire),
            [
                (T0 + 8 * MIN, true),
                (T0 + 9 * MIN, true),
                (T0 + 10 * MIN, false)
            ]
        );
        let dropped = p.misfired.unwrap();
        assert_eq!(
            (dropped.first, dropped.last, dropped.count),
            (T0, T0 + 7 * MIN, 8)
        );
    }

    #[test]
    fn after_a_downtime_fire_once_fires_once_even_when_the_latest_slot_is_due() {
        // Every 2 s, down for 7 s: slots 0..6 s overdue at 7.8 s, the latest 1.8 s late.
        let c = cron("*/2 * * * * *");
        let now = T0 + 7_800;
        let once = plan_fires(
            &c,
            utc(),
            T0,
            now,
            MisfirePolicy::FireOnce,
            Window::default(),
        );
        assert_eq!(at(&once.fire), [(T0 + 6_000, false)]);
        assert_eq!(once.misfired.map(|s| s.count), Some(3));
        // Skip still runs the due slot; catch_up 2 the latest two.
        let skip = plan_fires(&c, utc(), T0, now, MisfirePolicy::Skip, Window::default());
        assert_eq!(at(&skip.fire), [(T0 + 6_000, false)]);
        let two = plan_fires(
            &c,
            utc(),
            T0,
            now,
            MisfirePolicy::CatchUp { max: 2 },
            Window::default(),
        );
        assert_eq!(at(&two.fire), [(T0 + 4_000, true), (T0 + 6_000, false)]);
    }

    #[test]
    fn a_few_late_slots_without_a_backlog_all_fire() {
        // The loop was held up 1.5 s: two per-second slots are overdue, neither missed.
        let c = cron("* * * * * *");
        let p = plan_fires(
            &c,
            utc(),
            T0,
            T0 + 1_500,
            MisfirePolicy::Skip,
            Window::default(),
        );
        assert_eq!(at(&p.fire), [(T0, false), (T0 + 1_000, false)]);
        assert_eq!(p.misfired, None);
    }

    #[test]
    fn catch_up_with_fewer_missed_than_n_runs_them_all() {
        let p = plan(
            T0,
            T0 + 2 * MIN + 30_000,
            MisfirePolicy::CatchUp { max: 10 },
        );
        assert_eq!(
            at(&p.fire),
            [(T0, true), (T0 + MIN, true), (T0 + 2 * MIN, true)]
        );
        assert_eq!(p.misfired, None);
    }

    #[test]
    fn only_skip_and_replace_read_the_unfinished_runs() {
        for overlap in [
            OverlapPolicy::Allow,
            OverlapPolicy::Queue,
            OverlapPolicy::Skip,
            OverlapPolicy::Replace,
        ] {
            let reads = overlap_reads_unfinished(overlap);
            // A policy that does not read them decides the same with any count.
            if !reads {
                assert_eq!(on_fire(overlap, 0), on_fire(overlap, 7), "{overlap:?}");
            } else {
                assert_ne!(on_fire(overlap, 0), on_fire(overlap, 7), "{overlap:?}");
            }
            assert_eq!(
                reads,
                matches!(overlap, OverlapPolicy::Skip | OverlapPolicy::Replace)
            );
        }
    }

    #[test]
    fn a_span_is_described_with_readable_instants() {
        let span = SlotSpan {
            first: 1_767_225_600_000,
            last: 1_767_225_600_000 + 10 * HOUR,
            count: 11,
            at_least: false,
        };
        assert_eq!(
            span.describe(),
            "11 slots from 2026-01-01T00:00:00Z to 2026-01-01T10:00:00Z"
        );
        let one = SlotSpan {
            count: 1,
            last: span.first,
            ..span
        };
        assert_eq!(one.describe(), "1 slot at 2026-01-01T00:00:00Z");
    }

    #[test]
    fn a_long_downtime_is_counted_boundedly_and_the_latest_slot_found_fast() {
        // A per-second schedule down for 30 days: 2.6 million missed slots.
        let every_second = cron("* * * * * *");
        let now = T0 + 30 * 24 * HOUR + 30_000;
        let p = plan_fires(
            &every_second,
            utc(),
            T0,
            now,
            MisfirePolicy::CatchUp { max: 2 },
            Window::default(),
        );
        // The latest slot (now, exactly) is due; with it, the latest two.
        assert_eq!(at(&p.fire), [(now - 1_000, true), (now, false)]);
        let dropped = p.misfired.unwrap();
        assert!(dropped.at_least);
        assert_eq!(dropped.count, COUNT_CAP);
        assert_eq!(dropped.first, T0);
        assert!(dropped.describe().starts_with("at least 10000 slots from"));
        assert!(!dropped.describe().contains(&dropped.first.to_string()));
    }

    #[test]
    fn slots_before_the_start_never_fire() {
        let window = Window {
            start_at: Some(T0 + 5 * MIN),
            end_at: None,
        };
        let p = plan_fires(
            &cron("* * * * *"),
            utc(),
            T0,
            T0 + 5 * MIN + 1_000,
            MisfirePolicy::CatchUp { max: 100 },
            window,
        );
        assert_eq!(at(&p.fire), [(T0 + 5 * MIN, false)]);
        assert_eq!(p.outside_window.map(|s| s.count), Some(5));
    }

    #[test]
    fn a_slot_past_the_end_ends_the_schedule() {
        let window = Window {
            start_at: None,
            end_at: Some(T0 + MIN),
        };
        let p = plan_fires(
            &cron("* * * * *"),
            utc(),
            T0 + MIN,
            T0 + MIN + 1_000,
            MisfirePolicy::FireOnce,
            window,
        );
        assert_eq!(at(&p.fire), [(T0 + MIN, false)]);
        // The end has not passed yet: the next slot is stored and judged when it comes.
        assert_eq!(p.next_fire_at, Some(T0 + 2 * MIN));
        let p = plan_fires(
            &cron("* * * * *"),
            utc(),
            T0 + 2 * MIN,
            T0 + 2 * MIN + 1_000,
            MisfirePolicy::FireOnce,
            window,
        );
        assert!(p.fire.is_empty());
        assert_eq!(
            p.outside_window.map(|s| (s.first, s.count)),
            Some((T0 + 2 * MIN, 1))
        );
        assert_eq!(p.next_fire_at, None);
    }

    #[test]
    fn upcoming_respects_the_window() {
        let window = Window {
            start_at: Some(T0 + 10 * MIN),
            end_at: Some(T0 + 12 * MIN),
        };
        let slots = upcoming(&cron("* * * * *"), utc(), T0, window, 5);
        assert_eq!(slots, [T0 + 10 * MIN, T0 + 11 * MIN, T0 + 12 * MIN]);
        assert_eq!(
            first_slot(&cron("* * * * *"), utc(), T0 + 12 * MIN, window),
            None
        );
    }

    #[test]
    fn resume_keeps_the_slots_the_policy_keeps() {
        let c = cron("* * * * *");
        let now = T0 + 10 * MIN + 30_000;
        let (plan, next) = resume_point(
            &c,
            utc(),
            T0,
            now,
            MisfirePolicy::CatchUp { max: 2 },
            Window::default(),
        );
        assert_eq!(next, Some(T0 + 9 * MIN));
        assert_eq!(plan.misfired.map(|s| s.count), Some(9));
        // The loop, picking up from there, fires exactly the kept slots.
        let again = plan_fires(
            &c,
            utc(),
            next.unwrap(),
            now,
            MisfirePolicy::CatchUp { max: 2 },
            Window::default(),
        );
        assert_eq!(
            at(&again.fire),
            [(T0 + 9 * MIN, true), (T0 + 10 * MIN, true)]
        );
        assert_eq!(again.misfired, None);
        let (_, next) = resume_point(&c, utc(), T0, now, MisfirePolicy::Skip, Window::default());
        assert_eq!(next, Some(T0 + 11 * MIN));
    }

    #[test]
    fn on_resume_a_slot_within_the_grace_passed_while_paused_too() {
        let c = cron("* * * * * *");
        // Paused from T0; resumed 1.5 s after T0 + 10 s.
        let now = T0 + 11_500;
        let (plan, next) = resume_point(&c, utc(), T0, now, MisfirePolicy::Skip, Window::default());
        assert!(plan.fire.is_empty());
        assert_eq!(
            plan.misfired.map(|s| (s.first, s.last, s.count)),
            Some((T0, T0 + 11_000, 12))
        );
        assert_eq!(next, Some(T0 + 12_000));
        let (plan, next) = resume_point(
            &c,
            utc(),
            T0,
            now,
            MisfirePolicy::FireOnce,
            Window::default(),
        );
        assert_eq!(next, Some(T0 + 11_000));
        // The loop then fires just that one slot (due now).
        let again = plan_fires(
            &c,
            utc(),
            T0 + 11_000,
            now,
            MisfirePolicy::FireOnce,
            Window::default(),
        );
        assert_eq!(at(&again.fire), [(T0 + 11_000, false)]);
        assert_eq!(plan.misfired.map(|s| s.count), Some(11));
        let (_, next) = resume_point(
            &c,
            utc(),
            T0,
            now,
            MisfirePolicy::CatchUp { max: 3 },
            Window::default(),
        );
        assert_eq!(next, Some(T0 + 9_000));
        let again = plan_fires(
            &c,
            utc(),
            T0 + 9_000,
            now,
            MisfirePolicy::CatchUp { max: 3 },
            Window::default(),
        );
        assert_eq!(again.fire.len(), 3);
    }

    #[test]
    fn overlap_matrix() {
        use OverlapPolicy::*;
        for policy in OverlapPolicy::ALL {
            assert_eq!(on_fire(policy, 0), FireDecision::Create);
        }
        assert_eq!(on_fire(Allow, 2), FireDecision::Create);
        assert_eq!(on_fire(Queue, 1), FireDecision::Create);
        assert_eq!(on_fire(Skip, 1), FireDecision::Skip);
        assert_eq!(on_fire(Replace, 1), FireDecision::Replace);
    }

    fn load(active: u32, active_same_key: u32, queued_ahead: u32) -> RunLoad {
        RunLoad {
            active,
            active_same_key,
            queued_ahead,
        }
    }

    #[test]
    fn start_or_queue_matrix() {
        let limits = |overlap, max_active_runs, per_key| RunLimits {
            overlap,
            max_active_runs,
            max_runs_per_key: per_key,
        };
        let allow = limits(OverlapPolicy::Allow, 0, None);
        assert_eq!(start_or_queue(allow, true, load(5, 5, 0)), Admission::Start);
        assert_eq!(
            start_or_queue(allow, true, load(0, 0, 1)),
            Admission::Queue(QueueReason::Behind(1))
        );
        let capped = limits(OverlapPolicy::Allow, 2, None);
        assert_eq!(
            start_or_queue(capped, false, load(1, 1, 0)),
            Admission::Start
        );
        assert_eq!(
            start_or_queue(capped, false, load(2, 2, 0)),
            Admission::Queue(QueueReason::MaxActiveRuns(2))
        );
        // Overlap queue: scheduled fires wait for the active run; manual triggers do not.
        let queue = limits(OverlapPolicy::Queue, 0, None);
        assert_eq!(
            start_or_queue(queue, true, load(1, 1, 0)),
            Admission::Queue(QueueReason::Overlap)
        );
        assert_eq!(
            start_or_queue(queue, false, load(1, 1, 0)),
            Admission::Start
        );
        // Keyed: the same key is capped, another key is not.
        let keyed = limits(OverlapPolicy::Allow, 0, Some(1));
        assert_eq!(
            start_or_queue(keyed, false, load(1, 1, 0)),
            Admission::Queue(QueueReason::PerKey(1))
        );
        assert_eq!(
            start_or_queue(keyed, false, load(1, 0, 0)),
            Admission::Start
        );
    }

    #[test]
    fn backfill_lists_every_slot_in_order_and_refuses_too_many() {
        let c = cron("0 * * * *");
        let slots = backfill_slots(&c, utc(), T0, T0 + 3 * HOUR, 10).unwrap();
        assert_eq!(slots, [T0, T0 + HOUR, T0 + 2 * HOUR, T0 + 3 * HOUR]);
        assert_eq!(
            backfill_slots(&c, utc(), T0, T0 + 3 * HOUR, 3),
            Err(BackfillError::TooMany { max: 3 })
        );
        assert_eq!(
            backfill_slots(&c, utc(), T0 + 1, T0, 3),
            Err(BackfillError::Reversed {
                from: T0 + 1,
                to: T0
            })
        );
        assert_eq!(backfill_slots(&c, utc(), T0 + 1, T0 + 2, 3), Ok(vec![]));
    }

    /// America/New_York, spring forward 2026-03-08 02:00 EST → 03:00 EDT (07:00Z).
    #[test]
    fn backfill_across_spring_forward_fires_the_gap_slot_once() {
        let ny = parse_timezone("America/New_York").unwrap();
        let c = cron("30 * * * *");
        // 2026-03-08T05:00Z (00:00 EST) to 2026-03-08T09:00Z (05:00 EDT).
        let from = 1_772_946_000_000;
        let to = from + 4 * HOUR;
        let slots = backfill_slots(&c, ny, from, to, 100).unwrap();
        // 00:30 EST, 01:30 EST, 02:30 (gap) → 03:00 EDT, 03:30 EDT, 04:30 EDT.
        let expected = [
            from + 30 * MIN,            // 05:30Z
            from + HOUR + 30 * MIN,     // 06:30Z
            from + 2 * HOUR,            // 07:00Z = 03:00 EDT, the gap's slot
            from + 2 * HOUR + 30 * MIN, // 07:30Z = 03:30 EDT
            from + 3 * HOUR + 30 * MIN, // 08:30Z = 04:30 EDT
        ];
        assert_eq!(slots, expected);
    }

    /// America/New_York, fall back 2026-11-01 02:00 EDT → 01:00 EST (06:00Z).
    #[test]
    fn backfill_across_fall_back_fires_the_repeated_hour_once() {
        let ny = parse_timezone("America/New_York").unwrap();
        let c = cron("30 * * * *");
        // 2026-11-01T04:00Z (00:00 EDT) to 2026-11-01T08:00Z (03:00 EST).
        let from = 1_793_505_600_000;
        let to = from + 4 * HOUR;
        let slots = backfill_slots(&c, ny, from, to, 100).unwrap();
        // 00:30 EDT (04:30Z), 01:30 EDT (05:30Z), 01:30 EST skipped, 02:30 EST (07:30Z).
        assert_eq!(
            slots,
            [
                from + 30 * MIN,
                from + HOUR + 30 * MIN,
                from + 3 * HOUR + 30 * MIN
            ]
        );
    }
}
