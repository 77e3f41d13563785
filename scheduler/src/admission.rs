//! Bounded admission: the node's estimate of the instances waiting, per app and in total, read
//! from the store every [`READ_EVERY`], and the check a request to create runs (an API trigger,
//! a backfill) passes before anything is created. The decision is `ax_core::admission`'s; the
//! store asks the same estimate, through [`WaitingBounds`], when it creates a run that is never
//! refused (a cron or dependency fire, a child run), to record that it went in past a bound.
//!
//! **Why an estimate.** Counting the WAITING instances for every trigger would add a range scan
//! to each of a thousand triggers a second, the very load the bound is there to shed. Instead a
//! node reads the counts four times a second (a count of the state index's WAITING range; once
//! the queue is past half the per-app bound, a count by app too, which looks up each waiting
//! instance's workflow: the bounds keep the queue near them, so that cost is bounded as well)
//! and adds, on top of the latest reading, the root instances of every run it admitted that the
//! reading may not have seen: those still being created when it began, and those created since
//! (less the root tasks placed on a worker in the creating transaction, which never wait).
//! A check is then a lock and two map lookups. Until the next reading the estimate does not see
//! the instances that started meanwhile (it errs high: a caller may be refused up to
//! [`READ_EVERY`] after the queue went back under the bound, and is told to come back after a
//! second anyway), nor what other nodes admitted and what fires, retries and advances added (it
//! errs low).
//!
//! **How far past a bound a cluster can go.** On one node, at most the root instances of one
//! run: every admission counts from its check until a reading that began after its run was
//! created, so concurrent triggers see each other and no reading loses one in flight.
//! With N nodes each judges by its own estimate, so within one reading interval each may admit up
//! to the room it saw: after a reading of `w` waiting under a bound `b`, the store can reach
//! `w + N × (b − w)`, that is at most `(N − 1) × (b − w)` past the bound, and never more than the
//! triggers the N nodes receive in [`READ_EVERY`] (at 1,000 triggers a second, 250 runs). Under
//! sustained overload the readings sit at the bound (`b − w` is what drained in one interval), so
//! the overshoot is what the workers took in one interval, per extra node. A bound is a ceiling on
//! latency, not an exact count; cron and dependency fires, which are never refused, can take the
//! queue past it by as much as they fire.
//!
//! A reading older than `ax_core::admission::STALE_AFTER_MS` (the store has not answered for ten
//! seconds) judges nothing: requests are admitted, and reach a store that answers them itself.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ax_core::Millis;
use ax_core::admission::{Bounds, Estimate, Origin, Past, Reading, Verdict, decide, read_by_app};
use ax_core::spec::TriggerKind;
use ax_store::{Store, WaitingBounds};
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::metrics::Metrics;

/// How often the node reads the instances waiting. A bound should be larger than what the
/// workers take in this time, or they may go idle between readings that refuse everything.
pub const READ_EVERY: Duration = Duration::from_millis(250);

/// A request refused: the bound it met and when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub past: Past,
    pub retry_after_ms: u64,
}

/// The node's bounds on waiting instances and its estimate of them.
pub struct Admission {
    bounds: Bounds,
    node_id: String,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    estimate: Mutex<Estimate>,
}

impl Admission {
    pub fn new(
        bounds: Bounds,
        node_id: String,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
    ) -> Admission {
        Admission {
            bounds,
            node_id,
            store,
            metrics,
            estimate: Mutex::new(Estimate::default()),
        }
    }

    fn estimate(&self) -> MutexGuard<'_, Estimate> {
        self.estimate
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Judges a request to create a run of `app`'s workflow whose root tasks are `instances`
    /// WAITING instances, at `now`. An admitted one counts at once, so that the requests
    /// arriving together see each other, and its [`Ticket`] says when its run was created; a
    /// refused one is counted in `ax_triggers_refused_total`.
    pub fn request(&self, app: &str, instances: u64, now: Millis) -> Result<Ticket<'_>, Refusal> {
        if !self.bounds.any() {
            return Ok(Ticket::none(self));
        }
        let mut estimate = self.estimate();
        match decide(&self.bounds, estimate.waiting(app), Origin::Request, now) {
            Verdict::Refuse {
                past,
                retry_after_ms,
            } => {
                drop(estimate);
                self.metrics.trigger_refused(app, past.bound);
                Err(Refusal {
                    past,
                    retry_after_ms,
                })
            }
            Verdict::Admit | Verdict::AdmitPast(_) => {
                estimate.admit(app, instances);
                Ok(Ticket {
                    admission: self,
                    app: app.to_string(),
                    instances,
                    settled: false,
                })
            }
        }
    }

    /// Reads the store every [`READ_EVERY`] until `cancel`; a node without bounds reads nothing.
    pub async fn run(self: Arc<Self>, cancel: CancellationToken) {
        if !self.bounds.any() {
            return;
        }
        let mut failing = false;
        loop {
            match self.read().await {
                Ok(()) => failing = false,
                // Logged once per outage: the reading goes stale and admits meanwhile.
                Err(err) if !failing => {
                    failing = true;
                    tracing::warn!(error = %err, "reading the instances waiting failed; admission goes by the last reading until it is stale");
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(READ_EVERY) => {}
                _ = cancel.cancelled() => return,
            }
        }
    }

    /// One reading of the store into the estimate.
    async fn read(&self) -> Result<(), ax_store::StoreError> {
        let mark = self.estimate().begin_reading();
        let at = now_ms();
        let mut counts = self.store.waiting_counts(false).await?;
        let by_app = read_by_app(&self.bounds, counts.total);
        if by_app {
            counts = self.store.waiting_counts(true).await?;
        }
        let reading = Reading {
            at,
            total: counts.total,
            by_app: by_app.then_some(counts.by_app),
        };
        self.estimate().read(reading, mark);
        Ok(())
    }
}

/// An admitted request, counted until it is settled: its run created with some root tasks
/// WAITING (those then count until a reading begins), or not. Dropped unsettled, it counts as
/// not created.
pub struct Ticket<'a> {
    admission: &'a Admission,
    app: String,
    instances: u64,
    settled: bool,
}

impl<'a> Ticket<'a> {
    /// A ticket of a node without bounds: it counts nothing.
    fn none(admission: &'a Admission) -> Ticket<'a> {
        Ticket {
            admission,
            app: String::new(),
            instances: 0,
            settled: true,
        }
    }

    /// The request is done, and left `waiting` instances WAITING (its runs' root tasks, less
    /// those placed on workers at once; 0 when it created nothing).
    pub fn settle(mut self, waiting: u64) {
        self.settle_once(waiting);
    }

    /// The request is done, and left as many instances waiting as it was admitted with (or none
    /// when it created nothing): the estimate errs high until the next reading.
    pub fn settle_all(self, created: bool) {
        let waiting = if created { self.instances } else { 0 };
        self.settle(waiting);
    }

    fn settle_once(&mut self, waiting: u64) {
        if !self.settled {
            self.settled = true;
            self.admission.estimate().settle(
                &self.app,
                self.instances,
                waiting.min(self.instances),
            );
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.settle_once(0);
    }
}

impl WaitingBounds for Admission {
    fn past_bound(&self, app: &str, trigger: TriggerKind, now: Millis) -> Option<Past> {
        if !self.bounds.any() {
            return None;
        }
        let waiting = self.estimate().waiting(app);
        match decide(&self.bounds, waiting, Origin::of(trigger), now) {
            Verdict::AdmitPast(past) => Some(past),
            Verdict::Admit | Verdict::Refuse { .. } => None,
        }
    }

    fn node_id(&self) -> &str {
        &self.node_id
    }
}
