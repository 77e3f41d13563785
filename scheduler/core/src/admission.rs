//! Bounded admission: whether a new run may join the WAITING queue, judged against bounds on the
//! instances waiting per app and in total.
//!
//! Past the knee, tasks become ready faster than the workers take them and wait; without a bound
//! every trigger joins the queue and queue → start latency grows with it. With bounds, a request
//! (an API trigger, a backfill) that finds its app's waiting instances, or the cluster's, at or
//! past the bound is refused with a hint of when to try again ([`Verdict::Refuse`]), and nothing
//! is created. A cron fire, a dependency fire and a child run are facts that happen exactly once:
//! they are never refused, and one admitted past a bound is said so in the decision log
//! ([`Verdict::AdmitPast`], [`past_detail`]).
//!
//! The counts are a node's [`Estimate`]: the latest reading of the store plus what the node
//! itself admitted that the reading may not have seen. Why an estimate is good enough, and how far a
//! cluster can go past a bound, is in the node's `admission.rs`.

use std::collections::HashMap;

use crate::Millis;
use crate::spec::TriggerKind;

/// A reading older than this is no evidence about the queue (the store has not answered for a
/// while): requests are admitted, and the store's own failure answers them if it is down.
pub const STALE_AFTER_MS: Millis = 10_000;

/// The shortest retry hint: a node's estimate changes at its next reading, a fraction of this.
pub const MIN_RETRY_AFTER_MS: u64 = 1_000;
/// The longest retry hint, however far past its bound the queue is.
pub const MAX_RETRY_AFTER_MS: u64 = 30_000;

/// The bounds on WAITING instances; `None` is no bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Instances waiting in the whole cluster.
    pub total: Option<u64>,
    /// Instances waiting of one app's workflows (workflows without an app are one app, "").
    pub per_app: Option<u64>,
}

impl Bounds {
    /// The defaults: a backlog of minutes at a few thousand starts a second, well past any
    /// burst ax handles without queueing, and one app may hold half of it.
    pub const DEFAULT: Bounds = Bounds {
        total: Some(10_000),
        per_app: Some(5_000),
    };

    /// No bound at all: every trigger is admitted, as before bounds existed.
    pub const NONE: Bounds = Bounds {
        total: None,
        per_app: None,
    };

    /// Whether any bound is set (a node without one reads nothing for admission).
    pub fn any(&self) -> bool {
        self.total.is_some() || self.per_app.is_some()
    }
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds::DEFAULT
    }
}

/// What the store said at `at`: WAITING instances in total and, when read, by app.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reading {
    pub at: Millis,
    pub total: u64,
    /// `None` when not read: each app then counts as the total, which it cannot exceed.
    pub by_app: Option<HashMap<String, u64>>,
}

/// Whether a reading needs the counts by app: with a per-app bound, once the total has reached
/// half of it. Below that no app is near its bound, and counting the total (the state index's
/// range alone) spares a lookup per waiting instance; taking the total for each app's count
/// then errs high by less than half the bound.
pub fn read_by_app(bounds: &Bounds, total: u64) -> bool {
    bounds.per_app.is_some_and(|bound| total >= bound / 2)
}

/// Instances in total and by app.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    total: u64,
    by_app: HashMap<String, u64>,
}

impl Counts {
    fn add(&mut self, app: &str, n: u64) {
        self.total = self.total.saturating_add(n);
        let by_app = self.by_app.entry(app.to_string()).or_default();
        *by_app = by_app.saturating_add(n);
    }

    fn remove(&mut self, app: &str, n: u64) {
        self.total = self.total.saturating_sub(n);
        if let Some(by_app) = self.by_app.get_mut(app) {
            *by_app = by_app.saturating_sub(n);
        }
    }

    fn app(&self, app: &str) -> u64 {
        self.by_app.get(app).copied().unwrap_or(0)
    }
}

/// What a node had created when a reading began; see [`Estimate::begin_reading`].
#[derive(Debug, Clone, Default)]
pub struct Mark(Counts);

/// A node's estimate of the instances waiting: its latest reading, plus the instances it
/// admitted whose runs are not created yet, plus those it created since that reading began.
/// A run created before a reading began is in the reading; one admitted and not yet created
/// when it began is counted on top, and may be counted twice (in the reading too) until the
/// next one: the estimate errs high, never low, about the node's own admissions.
#[derive(Debug, Clone, Default)]
pub struct Estimate {
    reading: Option<Reading>,
    /// Admitted, their runs being created.
    pending: Counts,
    /// Created since the node started.
    created: Counts,
    /// `created` as it was when the current reading began.
    at_reading: Counts,
}

/// The instances waiting as a node estimates them, for one app.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// When the reading under the estimate was taken.
    pub read_at: Millis,
    pub total: u64,
    pub app: u64,
}

impl Estimate {
    /// What the node has created so far: pass it to [`Estimate::read`] with the reading that
    /// begins now.
    pub fn begin_reading(&self) -> Mark {
        Mark(self.created.clone())
    }

    /// Takes a new reading, begun when `mark` was taken: only what was created after that, and
    /// what is still being created, counts on top of it.
    pub fn read(&mut self, reading: Reading, mark: Mark) {
        self.reading = Some(reading);
        self.at_reading = mark.0;
    }

    /// Counts `instances` this node just admitted for `app` (a new run's root tasks), from
    /// now on, while their run is being created.
    pub fn admit(&mut self, app: &str, instances: u64) {
        self.pending.add(app, instances);
    }

    /// The run admitted with `instances` for `app` was created with `waiting` of them WAITING
    /// (0 when it was not created, an existing run was returned for its key, or its root tasks
    /// were placed on workers at once): those count on top of the readings that began before
    /// now, and only those.
    pub fn settle(&mut self, app: &str, instances: u64, waiting: u64) {
        self.pending.remove(app, instances);
        self.created.add(app, waiting);
    }

    /// The estimate for `app`, or `None` before the first reading.
    pub fn waiting(&self, app: &str) -> Option<Waiting> {
        let reading = self.reading.as_ref()?;
        let on_top = |pending: u64, created: u64, at_reading: u64| {
            pending.saturating_add(created.saturating_sub(at_reading))
        };
        Some(Waiting {
            read_at: reading.at,
            total: reading.total.saturating_add(on_top(
                self.pending.total,
                self.created.total,
                self.at_reading.total,
            )),
            app: reading
                .by_app
                .as_ref()
                .map_or(reading.total, |by_app| {
                    by_app.get(app).copied().unwrap_or(0)
                })
                .saturating_add(on_top(
                    self.pending.app(app),
                    self.created.app(app),
                    self.at_reading.app(app),
                )),
        })
    }
}

/// Where a new run comes from, as admission sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Someone asked (an API trigger, a backfill): refused past a bound, and asked again later.
    Request,
    /// A fact that happens once (a cron slot, an upstream's success, a parent's task): never
    /// refused.
    Fact,
}

impl Origin {
    /// The origin of a run with this trigger.
    pub fn of(trigger: TriggerKind) -> Origin {
        match trigger {
            TriggerKind::Manual | TriggerKind::Api => Origin::Request,
            // A backfill request is judged once, before its first slot; its slots then go in
            // like the cron slots they stand for.
            TriggerKind::Cron
            | TriggerKind::Dependency
            | TriggerKind::Backfill
            | TriggerKind::Parent => Origin::Fact,
        }
    }
}

/// Which bound was met.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bound {
    /// The app's own (`per_app`).
    App,
    /// The cluster's (`total`).
    Total,
}

impl Bound {
    /// Its name in answers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            Bound::App => "app",
            Bound::Total => "total",
        }
    }
}

/// A bound met: which, the estimate of what waits under it, and the bound's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Past {
    pub bound: Bound,
    pub waiting: u64,
    pub limit: u64,
}

/// What admission says about one new run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Within the bounds (or no bound, or no fresh reading).
    Admit,
    /// A fact admitted past a bound: its run is created, with a decision saying so.
    AdmitPast(Past),
    /// A request refused: nothing is created; try again after `retry_after_ms`.
    Refuse { past: Past, retry_after_ms: u64 },
}

/// Judges a new run of `app`'s workflow from `origin` against `bounds`, by the estimate
/// `waiting` (`None`: no reading yet) at `now`. The app's bound is looked at first: it is the
/// one its caller can act on. A bound is met when the estimate has reached it, so a run whose
/// root tasks take the queue past the bound is admitted while there was room for one more.
pub fn decide(bounds: &Bounds, waiting: Option<Waiting>, origin: Origin, now: Millis) -> Verdict {
    let Some(waiting) = waiting.filter(|w| now - w.read_at <= STALE_AFTER_MS) else {
        return Verdict::Admit;
    };
    let past = [
        (Bound::App, bounds.per_app, waiting.app),
        (Bound::Total, bounds.total, waiting.total),
    ]
    .into_iter()
    .find_map(|(bound, limit, waiting)| {
        let limit = limit?;
        (waiting >= limit).then_some(Past {
            bound,
            waiting,
            limit,
        })
    });
    match (past, origin) {
        (None, _) => Verdict::Admit,
        (Some(past), Origin::Fact) => Verdict::AdmitPast(past),
        (Some(past), Origin::Request) => Verdict::Refuse {
            past,
            retry_after_ms: retry_after_ms(&past),
        },
    }
}

/// How long a refused caller should wait: a second at the bound, longer the further past it the
/// queue is (a queue twice the bound needs about twice as long to drain below it), at most
/// [`MAX_RETRY_AFTER_MS`].
pub fn retry_after_ms(past: &Past) -> u64 {
    let limit = past.limit.max(1);
    let scaled = MIN_RETRY_AFTER_MS.saturating_mul(past.waiting) / limit;
    scaled.clamp(MIN_RETRY_AFTER_MS, MAX_RETRY_AFTER_MS)
}

/// How an app is named to people: workflows without an app share the app "".
fn app_name(app: &str) -> String {
    if app.is_empty() {
        "the workflows without an app".into()
    } else {
        format!("app {app:?}")
    }
}

/// The refusal's message. The total bound's count is the sum of every app's: a caller whose
/// token is scoped to one app (`count_visible` false) is told the bound, never the count, so
/// it learns nothing of other apps' queues beyond "the cluster is full".
pub fn refusal_message(
    workflow: &str,
    app: &str,
    past: &Past,
    retry_after_ms: u64,
    count_visible: bool,
) -> String {
    let why = match past.bound {
        Bound::App => format!(
            "{} instances of {} are waiting, at or past the bound of {} per app",
            past.waiting,
            app_name(app),
            past.limit
        ),
        Bound::Total if count_visible => format!(
            "{} instances are waiting in the cluster, at or past its bound of {}",
            past.waiting, past.limit
        ),
        Bound::Total => format!(
            "the instances waiting in the cluster are at or past its bound of {}",
            past.limit
        ),
    };
    format!(
        "workflow {workflow:?} not triggered: {why}; nothing was created, try again in {}",
        crate::humane_duration(i64::try_from(retry_after_ms).unwrap_or(i64::MAX))
    )
}

/// The detail of an `admitted_over_bound` decision. Decisions are shown to whoever may see the
/// workflow, so the total bound's count, which spans every app, is left out as in a refusal.
pub fn past_detail(trigger: TriggerKind, app: &str, past: &Past) -> String {
    let what = match trigger {
        TriggerKind::Cron => "a cron fire",
        TriggerKind::Dependency => "a dependency fire",
        TriggerKind::Parent => "a run_workflow task's child run",
        TriggerKind::Backfill => "a slot of an admitted backfill",
        TriggerKind::Manual | TriggerKind::Api => "a trigger",
    };
    let bound = match past.bound {
        Bound::App => format!(
            "{} instances of {} were waiting (bound {} per app)",
            past.waiting,
            app_name(app),
            past.limit
        ),
        Bound::Total => format!(
            "the instances waiting in the cluster were at its bound of {}",
            past.limit
        ),
    };
    format!("admitted past the bound on waiting instances: {bound}; {what} is never refused")
}

/// The policy of clients that are refused for load (axctl, the Python SDK): the wait before the
/// try after `refusals` refusals (1-based), given the node's hint. Exponential from half a
/// second to 30 s, jittered down to half (`unit_random` in [0, 1) from the caller), and never
/// sooner than the hint, itself stretched by up to a quarter so that callers refused together do
/// not all come back at the hinted instant.
pub fn client_retry_delay_ms(refusals: u32, hint_ms: u64, unit_random: f64) -> u64 {
    const BASE_MS: u64 = 500;
    let r = unit_random.clamp(0.0, 1.0);
    let exponent = refusals.saturating_sub(1).min(16);
    let full = BASE_MS
        .saturating_mul(1u64 << exponent)
        .min(MAX_RETRY_AFTER_MS);
    let backoff = (full as f64 * (0.5 + 0.5 * r)) as u64;
    let hinted = (hint_ms as f64 * (1.0 + 0.25 * r)) as u64;
    backoff.max(hinted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: Millis = 1_000_000;

    fn reading(total: u64, apps: &[(&str, u64)]) -> Reading {
        Reading {
            at: NOW,
            total,
            by_app: Some(apps.iter().map(|(a, n)| (a.to_string(), *n)).collect()),
        }
    }

    fn estimate(total: u64, apps: &[(&str, u64)]) -> Estimate {
        let mut estimate = Estimate::default();
        let mark = estimate.begin_reading();
        estimate.read(reading(total, apps), mark);
        estimate
    }

    const BOUNDS: Bounds = Bounds {
        total: Some(100),
        per_app: Some(40),
    };

    #[test]
    fn within_the_bounds_everything_is_admitted() {
        let e = estimate(99, &[("etl", 39)]);
        for origin in [Origin::Request, Origin::Fact] {
            assert_eq!(
                decide(&BOUNDS, e.waiting("etl"), origin, NOW),
                Verdict::Admit
            );
        }
    }

    #[test]
    fn a_request_at_its_apps_bound_is_refused_and_a_fact_admitted_past_it() {
        let e = estimate(50, &[("etl", 40)]);
        let past = Past {
            bound: Bound::App,
            waiting: 40,
            limit: 40,
        };
        assert_eq!(
            decide(&BOUNDS, e.waiting("etl"), Origin::Request, NOW),
            Verdict::Refuse {
                past,
                retry_after_ms: 1_000
            }
        );
        assert_eq!(
            decide(&BOUNDS, e.waiting("etl"), Origin::Fact, NOW),
            Verdict::AdmitPast(past)
        );
        // Another app's queue is its own.
        assert_eq!(
            decide(&BOUNDS, e.waiting("web"), Origin::Request, NOW),
            Verdict::Admit
        );
    }

    #[test]
    fn the_total_bound_holds_for_every_app_and_the_apps_own_is_named_first() {
        let e = estimate(130, &[("etl", 45), ("web", 10)]);
        let verdict = |app| decide(&BOUNDS, e.waiting(app), Origin::Request, NOW);
        assert!(matches!(
            verdict("web"),
            Verdict::Refuse {
                past: Past {
                    bound: Bound::Total,
                    waiting: 130,
                    limit: 100
                },
                ..
            }
        ));
        assert!(matches!(
            verdict("etl"),
            Verdict::Refuse {
                past: Past {
                    bound: Bound::App,
                    waiting: 45,
                    ..
                },
                ..
            }
        ));
    }

    #[test]
    fn what_the_node_admits_counts_until_a_reading_that_began_after_its_run_was_created() {
        let mut e = estimate(30, &[("etl", 30)]);
        for _ in 0..9 {
            e.admit("etl", 1);
            e.settle("etl", 1, 1);
        }
        assert_eq!(
            decide(&BOUNDS, e.waiting("etl"), Origin::Request, NOW),
            Verdict::Admit
        );
        // Admitted and still being created: it counts.
        e.admit("etl", 1);
        assert!(matches!(
            decide(&BOUNDS, e.waiting("etl"), Origin::Request, NOW),
            Verdict::Refuse { .. }
        ));
        // A reading that began while it was being created may not see it: it stays on top,
        // with what is created after the reading began. Once created before a reading began,
        // the reading has it.
        let mark = e.begin_reading();
        e.admit("etl", 5);
        e.settle("etl", 5, 5);
        e.read(reading(39, &[("etl", 39)]), mark);
        assert_eq!(e.waiting("etl").map(|w| (w.app, w.total)), Some((45, 45)));
        e.settle("etl", 1, 1);
        let mark = e.begin_reading();
        e.read(reading(45, &[("etl", 45)]), mark);
        assert_eq!(e.waiting("etl").map(|w| (w.app, w.total)), Some((45, 45)));
        // A run not created (an existing one returned for its key), or whose tasks were placed
        // at once, leaves nothing behind.
        e.admit("web", 2);
        assert_eq!(e.waiting("web").map(|w| (w.app, w.total)), Some((2, 47)));
        e.settle("web", 2, 0);
        assert_eq!(e.waiting("web").map(|w| (w.app, w.total)), Some((0, 45)));
    }

    #[test]
    fn no_reading_or_a_stale_one_admits_and_no_bound_admits_everything() {
        assert_eq!(decide(&BOUNDS, None, Origin::Request, NOW), Verdict::Admit);
        let e = estimate(1_000, &[("etl", 1_000)]);
        assert!(matches!(
            decide(
                &BOUNDS,
                e.waiting("etl"),
                Origin::Request,
                NOW + STALE_AFTER_MS
            ),
            Verdict::Refuse { .. }
        ));
        assert_eq!(
            decide(
                &BOUNDS,
                e.waiting("etl"),
                Origin::Request,
                NOW + STALE_AFTER_MS + 1
            ),
            Verdict::Admit
        );
        assert_eq!(
            decide(&Bounds::NONE, e.waiting("etl"), Origin::Request, NOW),
            Verdict::Admit
        );
        let only_total = Bounds {
            total: Some(2_000),
            per_app: None,
        };
        assert_eq!(
            decide(&only_total, e.waiting("etl"), Origin::Request, NOW),
            Verdict::Admit
        );
    }

    #[test]
    fn by_app_is_read_from_half_the_per_app_bound_and_each_app_is_the_total_without_it() {
        assert!(!read_by_app(&BOUNDS, 19));
        assert!(read_by_app(&BOUNDS, 20));
        let only_total = Bounds {
            total: Some(100),
            per_app: None,
        };
        assert!(!read_by_app(&only_total, 1_000));
        let mut e = Estimate::default();
        let mark = e.begin_reading();
        e.read(
            Reading {
                at: NOW,
                total: 19,
                by_app: None,
            },
            mark,
        );
        e.admit("web", 1);
        assert_eq!(e.waiting("etl").map(|w| (w.app, w.total)), Some((19, 20)));
        assert_eq!(e.waiting("web").map(|w| (w.app, w.total)), Some((20, 20)));
    }

    #[test]
    fn the_hint_grows_with_how_far_past_the_bound_and_is_capped() {
        let past = |waiting| Past {
            bound: Bound::Total,
            waiting,
            limit: 1_000,
        };
        assert_eq!(retry_after_ms(&past(1_000)), 1_000);
        assert_eq!(retry_after_ms(&past(2_500)), 2_500);
        assert_eq!(retry_after_ms(&past(1_000_000)), MAX_RETRY_AFTER_MS);
        let zero = Past {
            bound: Bound::App,
            waiting: 0,
            limit: 0,
        };
        assert_eq!(retry_after_ms(&zero), MIN_RETRY_AFTER_MS);
    }

    #[test]
    fn only_requests_are_refused_by_trigger() {
        assert_eq!(Origin::of(TriggerKind::Api), Origin::Request);
        assert_eq!(Origin::of(TriggerKind::Manual), Origin::Request);
        for fact in [
            TriggerKind::Cron,
            TriggerKind::Dependency,
            TriggerKind::Parent,
            TriggerKind::Backfill,
        ] {
            assert_eq!(Origin::of(fact), Origin::Fact);
        }
    }

    #[test]
    fn a_scoped_caller_learns_the_total_bound_but_not_the_clusters_count() {
        let total = Past {
            bound: Bound::Total,
            waiting: 12_345,
            limit: 10_000,
        };
        let seen = refusal_message("load", "etl", &total, 2_000, true);
        assert!(
            seen.contains("12345 instances are waiting in the cluster"),
            "{seen}"
        );
        assert!(seen.contains("try again in 2s"), "{seen}");
        let scoped = refusal_message("load", "etl", &total, 2_000, false);
        assert!(!scoped.contains("12345"), "{scoped}");
        assert!(scoped.contains("bound of 10000"), "{scoped}");
        let detail = past_detail(TriggerKind::Cron, "etl", &total);
        assert!(!detail.contains("12345"), "{detail}");
        assert!(detail.contains("a cron fire is never refused"), "{detail}");
        let app = Past {
            bound: Bound::App,
            waiting: 41,
            limit: 40,
        };
        let own = refusal_message("load", "", &app, 1_000, false);
        assert!(
            own.contains("41 instances of the workflows without an app are waiting"),
            "{own}"
        );
    }

    #[test]
    fn clients_back_off_exponentially_within_jitter_and_never_before_the_hint() {
        assert_eq!(client_retry_delay_ms(1, 0, 0.0), 250);
        assert_eq!(client_retry_delay_ms(1, 0, 1.0), 500);
        assert_eq!(client_retry_delay_ms(4, 0, 1.0), 4_000);
        assert_eq!(client_retry_delay_ms(40, 0, 1.0), MAX_RETRY_AFTER_MS);
        // The hint is a floor, stretched by the same draw.
        assert_eq!(client_retry_delay_ms(1, 1_000, 0.0), 1_000);
        assert_eq!(client_retry_delay_ms(1, 1_000, 1.0), 1_250);
        assert_eq!(client_retry_delay_ms(6, 1_000, 0.0), 8_000);
    }
}
