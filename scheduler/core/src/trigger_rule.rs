//! Trigger rules: given how a task's direct upstreams ended, whether it runs, is SKIPPED or is
//! UPSTREAM_FAILED. The one place that says how SKIPPED and failures propagate.
//!
//! A rule is judged only once its verdict can no longer change: [`judge`] tries every way the
//! upstreams still going could end, and answers only when all of them give the same verdict.
//! So `one_success` runs at the first success, but is never skipped while an upstream may still
//! succeed; `all_success` is UPSTREAM_FAILED at the first failure, but waits while an upstream
//! was skipped and another may still fail (the failure would decide). The verdict once every
//! upstream ended, with S, F, K meaning "some upstream succeeded / failed / was skipped":
//!
//! | rule          | runs when                 | otherwise                               |
//! |---------------|---------------------------|-----------------------------------------|
//! | `all_success` | every upstream succeeded  | F: UPSTREAM_FAILED; else K: SKIPPED     |
//! | `all_done`    | every upstream ended      | (always runs)                           |
//! | `one_failed`  | F                         | SKIPPED                                 |
//! | `one_success` | S                         | F: UPSTREAM_FAILED; else SKIPPED        |
//! | `none_failed` | no F (skipped is fine)    | UPSTREAM_FAILED                         |
//! | `always`      | at once, with the roots   | (always runs)                           |
//!
//! "Failed" is FAILED, TIMEOUT, CANCELLED (one instance cancelled by a person) or
//! UPSTREAM_FAILED; "skipped" is SKIPPED. A task without upstreams runs (its `if:` aside).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::state::InstanceState;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerRule {
    #[default]
    AllSuccess,
    AllDone,
    OneFailed,
    OneSuccess,
    NoneFailed,
    /// Runs with the run's roots, whatever its upstreams do (as Airflow's `always`); its
    /// upstream edges only order the graph as drawn.
    Always,
}

impl TriggerRule {
    pub const ALL: [TriggerRule; 6] = [
        TriggerRule::AllSuccess,
        TriggerRule::AllDone,
        TriggerRule::OneFailed,
        TriggerRule::OneSuccess,
        TriggerRule::NoneFailed,
        TriggerRule::Always,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            TriggerRule::AllSuccess => "all_success",
            TriggerRule::AllDone => "all_done",
            TriggerRule::OneFailed => "one_failed",
            TriggerRule::OneSuccess => "one_success",
            TriggerRule::NoneFailed => "none_failed",
            TriggerRule::Always => "always",
        }
    }

    pub fn parse(text: &str) -> Option<TriggerRule> {
        Self::ALL.into_iter().find(|rule| rule.as_str() == text)
    }

    /// Whether a task under this rule starts with the run, like a task without upstreams.
    pub fn starts_with_run(self) -> bool {
        self == TriggerRule::Always
    }
}

impl fmt::Display for TriggerRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How one direct upstream ended, for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamEnd {
    Succeeded,
    Failed,
    Skipped,
}

impl UpstreamEnd {
    /// The end an upstream's instance state stands for; `None` while it may still change (no
    /// instance, PENDING, or WAITING, DISPATCHED, RUNNING).
    pub fn of(state: Option<InstanceState>) -> Option<UpstreamEnd> {
        match state? {
            InstanceState::Success => Some(UpstreamEnd::Succeeded),
            InstanceState::Failed
            | InstanceState::Timeout
            | InstanceState::Cancelled
            | InstanceState::UpstreamFailed => Some(UpstreamEnd::Failed),
            InstanceState::Skipped => Some(UpstreamEnd::Skipped),
            InstanceState::Waiting
            | InstanceState::Dispatched
            | InstanceState::Running
            | InstanceState::Pending => None,
        }
    }
}

/// A task's direct upstreams in a run, counted by how they ended; the rest are still going.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Upstreams {
    pub total: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub skipped: u32,
}

impl Upstreams {
    pub fn count(ends: impl IntoIterator<Item = Option<UpstreamEnd>>) -> Upstreams {
        let mut upstreams = Upstreams::default();
        for end in ends {
            upstreams.total += 1;
            match end {
                Some(UpstreamEnd::Succeeded) => upstreams.succeeded += 1,
                Some(UpstreamEnd::Failed) => upstreams.failed += 1,
                Some(UpstreamEnd::Skipped) => upstreams.skipped += 1,
                None => {}
            }
        }
        upstreams
    }

    pub fn going(self) -> u32 {
        self.total
            .saturating_sub(self.succeeded + self.failed + self.skipped)
    }
}

/// What becomes of a task once its rule is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Run,
    Skip,
    UpstreamFailed,
}

impl Verdict {
    /// The state of an instance the advance creates (or a PENDING one moves to) without running:
    /// `None` for [`Verdict::Run`].
    pub fn state(self) -> Option<InstanceState> {
        match self {
            Verdict::Run => None,
            Verdict::Skip => Some(InstanceState::Skipped),
            Verdict::UpstreamFailed => Some(InstanceState::UpstreamFailed),
        }
    }
}

/// The rule's verdict, or `None` while an upstream still going could change it.
pub fn judge(rule: TriggerRule, upstreams: Upstreams) -> Option<Verdict> {
    if upstreams.total == 0 || rule == TriggerRule::Always {
        return Some(Verdict::Run);
    }
    let now = (
        upstreams.succeeded > 0,
        upstreams.failed > 0,
        upstreams.skipped > 0,
    );
    let going = upstreams.going();
    if going == 0 {
        return Some(when_ended(rule, now));
    }
    // Its verdict is known from the start; what it waits for is the end of every upstream.
    if rule == TriggerRule::AllDone {
        return None;
    }
    // Every way the upstreams still going can end adds a non-empty set of ends (of at most
    // `going` kinds) to those seen; the rules look only at which kinds occur.
    let mut verdicts = (1u8..8)
        .filter(|kinds| kinds.count_ones() <= going)
        .map(|kinds| {
            let ended = (
                now.0 || kinds & 1 != 0,
                now.1 || kinds & 2 != 0,
                now.2 || kinds & 4 != 0,
            );
            when_ended(rule, ended)
        });
    let first = verdicts.next()?;
    verdicts.all(|v| v == first).then_some(first)
}

/// The verdict once every upstream ended: `(any succeeded, any failed, any skipped)`.
fn when_ended(rule: TriggerRule, (succeeded, failed, skipped): (bool, bool, bool)) -> Verdict {
    match rule {
        TriggerRule::AllSuccess if failed => Verdict::UpstreamFailed,
        TriggerRule::AllSuccess if skipped => Verdict::Skip,
        TriggerRule::AllSuccess => Verdict::Run,
        TriggerRule::AllDone | TriggerRule::Always => Verdict::Run,
        TriggerRule::OneFailed if failed => Verdict::Run,
        TriggerRule::OneFailed => Verdict::Skip,
        TriggerRule::OneSuccess if succeeded => Verdict::Run,
        TriggerRule::OneSuccess if failed => Verdict::UpstreamFailed,
        TriggerRule::OneSuccess => Verdict::Skip,
        TriggerRule::NoneFailed if failed => Verdict::UpstreamFailed,
        TriggerRule::NoneFailed => Verdict::Run,
    }
}

/// Why a task did not run, in words: the upstreams that decided it and the rule, e.g.
/// `upstream load was SKIPPED and trigger_rule is all_success`. `upstreams` are the task's
/// direct upstreams with their states (`None`: no instance).
pub fn not_run_reason(
    rule: TriggerRule,
    verdict: Verdict,
    upstreams: &[(&str, Option<InstanceState>)],
) -> String {
    let named = |wanted: UpstreamEnd| -> Vec<String> {
        upstreams
            .iter()
            .filter(|(_, state)| UpstreamEnd::of(*state) == Some(wanted))
            .map(|(name, state)| {
                let state = state.map_or("not run", InstanceState::as_str);
                format!("{name} was {state}")
            })
            .collect()
    };
    let deciding = match (rule, verdict) {
        (TriggerRule::OneFailed, _) => "no upstream failed".to_string(),
        (TriggerRule::OneSuccess, Verdict::Skip | Verdict::UpstreamFailed) => {
            "no upstream succeeded".to_string()
        }
        (_, Verdict::UpstreamFailed) => list("upstream", named(UpstreamEnd::Failed)),
        (_, Verdict::Skip) => list("upstream", named(UpstreamEnd::Skipped)),
        (_, Verdict::Run) => "its upstreams allow it".to_string(),
    };
    format!("{deciding} and trigger_rule is {rule}")
}

/// `upstream a was FAILED`, `upstreams a was FAILED, b was TIMEOUT`, at most three named.
fn list(noun: &str, items: Vec<String>) -> String {
    const SHOWN: usize = 3;
    let more = items.len().saturating_sub(SHOWN);
    let plural = if items.len() > 1 { "s" } else { "" };
    let mut text = format!(
        "{noun}{plural} {}",
        items
            .iter()
            .take(SHOWN)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    if more > 0 {
        text.push_str(&format!(" (and {more} more)"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::TriggerRule::*;
    use super::Verdict::*;
    use super::*;

    fn ups(succeeded: u32, failed: u32, skipped: u32, going: u32) -> Upstreams {
        Upstreams {
            total: succeeded + failed + skipped + going,
            succeeded,
            failed,
            skipped,
        }
    }

    /// Upstreams (succeeded, failed, skipped, going) and the verdict of each rule, in the order
    /// of [`TriggerRule::ALL`].
    type Case = ((u32, u32, u32, u32), [Option<Verdict>; 6]);

    /// Every rule against the same upstream situations. `None`: the rule waits, because an
    /// upstream still going could change the verdict.
    const CASES: &[Case] = &[
        // all_success, all_done, one_failed, one_success, none_failed, always
        (
            (2, 0, 0, 0),
            [
                Some(Run),
                Some(Run),
                Some(Skip),
                Some(Run),
                Some(Run),
                Some(Run),
            ],
        ),
        (
            (1, 1, 0, 0),
            [
                Some(UpstreamFailed),
                Some(Run),
                Some(Run),
                Some(Run),
                Some(UpstreamFailed),
                Some(Run),
            ],
        ),
        (
            (0, 2, 0, 0),
            [
                Some(UpstreamFailed),
                Some(Run),
                Some(Run),
                Some(UpstreamFailed),
                Some(UpstreamFailed),
                Some(Run),
            ],
        ),
        (
            (1, 0, 1, 0),
            [
                Some(Skip),
                Some(Run),
                Some(Skip),
                Some(Run),
                Some(Run),
                Some(Run),
            ],
        ),
        (
            (0, 0, 2, 0),
            [
                Some(Skip),
                Some(Run),
                Some(Skip),
                Some(Skip),
                Some(Run),
                Some(Run),
            ],
        ),
        (
            (0, 1, 1, 0),
            [
                Some(UpstreamFailed),
                Some(Run),
                Some(Run),
                Some(UpstreamFailed),
                Some(UpstreamFailed),
                Some(Run),
            ],
        ),
        // Still going: only verdicts no later end can change.
        ((0, 0, 0, 2), [None, None, None, None, None, Some(Run)]),
        ((1, 0, 0, 1), [None, None, None, Some(Run), None, Some(Run)]),
        (
            (0, 1, 0, 1),
            [
                Some(UpstreamFailed),
                None,
                Some(Run),
                None,
                Some(UpstreamFailed),
                Some(Run),
            ],
        ),
        // A skip under all_success waits: a failure still to come would make it UPSTREAM_FAILED.
        ((0, 0, 1, 1), [None, None, None, None, None, Some(Run)]),
        ((1, 0, 1, 1), [None, None, None, Some(Run), None, Some(Run)]),
    ];

    #[test]
    fn every_rule_in_every_situation() {
        for ((s, f, k, g), verdicts) in CASES {
            for (rule, want) in TriggerRule::ALL.into_iter().zip(verdicts) {
                assert_eq!(
                    judge(rule, ups(*s, *f, *k, *g)),
                    *want,
                    "{rule} with {s} succeeded, {f} failed, {k} skipped, {g} going"
                );
            }
        }
    }

    #[test]
    fn a_task_without_upstreams_runs() {
        for rule in TriggerRule::ALL {
            assert_eq!(judge(rule, Upstreams::default()), Some(Run), "{rule}");
        }
    }

    /// apache/airflow#42581: `one_success` skipped before its upstream ran. A verdict given
    /// early must be the verdict for every way the rest can end.
    #[test]
    fn an_early_verdict_is_the_verdict_of_every_later_end() {
        let ends = [
            UpstreamEnd::Succeeded,
            UpstreamEnd::Failed,
            UpstreamEnd::Skipped,
        ];
        for rule in TriggerRule::ALL {
            for s in 0..3 {
                for f in 0..3 {
                    for k in 0..3 {
                        for g in 0..3 {
                            let Some(early) = judge(rule, ups(s, f, k, g)) else {
                                continue;
                            };
                            // Each of the `g` going upstreams ends one of three ways.
                            for way in 0..3u32.pow(g) {
                                let (mut s2, mut f2, mut k2) = (s, f, k);
                                let mut w = way;
                                for _ in 0..g {
                                    match ends[(w % 3) as usize] {
                                        UpstreamEnd::Succeeded => s2 += 1,
                                        UpstreamEnd::Failed => f2 += 1,
                                        UpstreamEnd::Skipped => k2 += 1,
                                    }
                                    w /= 3;
                                }
                                assert_eq!(
                                    judge(rule, ups(s2, f2, k2, 0)),
                                    Some(early),
                                    "{rule}: early verdict at ({s},{f},{k},{g}) changed"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn states_count_as_their_end() {
        use InstanceState as S;
        let counted = Upstreams::count(
            [
                Some(S::Success),
                Some(S::Failed),
                Some(S::Timeout),
                Some(S::Cancelled),
                Some(S::UpstreamFailed),
                Some(S::Skipped),
                Some(S::Running),
                Some(S::Pending),
                None,
            ]
            .map(UpstreamEnd::of),
        );
        assert_eq!(counted, ups(1, 4, 1, 3));
    }

    #[test]
    fn the_reason_names_the_deciding_upstreams_and_the_rule() {
        use InstanceState as S;
        assert_eq!(
            not_run_reason(
                AllSuccess,
                Skip,
                &[("extract", Some(S::Success)), ("load", Some(S::Skipped))]
            ),
            "upstream load was SKIPPED and trigger_rule is all_success"
        );
        assert_eq!(
            not_run_reason(
                NoneFailed,
                UpstreamFailed,
                &[("a", Some(S::Failed)), ("b", Some(S::Timeout))]
            ),
            "upstreams a was FAILED, b was TIMEOUT and trigger_rule is none_failed"
        );
        assert_eq!(
            not_run_reason(OneFailed, Skip, &[("a", Some(S::Success))]),
            "no upstream failed and trigger_rule is one_failed"
        );
    }

    #[test]
    fn rule_names_round_trip() {
        for rule in TriggerRule::ALL {
            assert_eq!(TriggerRule::parse(rule.as_str()), Some(rule));
        }
        assert_eq!(TriggerRule::parse("all"), None);
    }
}
