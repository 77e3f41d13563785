//! Which failed authentications become audit rows. Every failure is worth knowing of, but a
//! flood of them (a misconfigured client retrying, or an attack from many addresses) must not
//! become a flood of rows: per minute, the first failure of each (address, reason, token name)
//! is a row of its own, up to [`FailureAudit::rows_per_window`]; the repeats are counted and
//! written as one summary row per kind when the minute ends, for the most frequent kinds up to
//! the same bound, and everything past that as one row that counts failures and addresses. So
//! a minute under any attack writes at most about twice the bound, and no failure goes
//! uncounted.

use std::collections::{HashMap, HashSet};

use crate::Millis;

/// One kind of failure: from where, why, and the token name when the token was known.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FailureKind {
    /// The caller's IP address, as text (empty when unknown).
    pub address: String,
    pub reason: String,
    pub token: String,
}

/// What to write for one failure, or at the end of a window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditRow {
    /// The first failure of its kind in the window.
    First(FailureKind),
    /// `count` more failures of this kind in the window that started at `since`.
    Repeated {
        kind: FailureKind,
        count: u64,
        since: Millis,
    },
    /// Failures of kinds past the window's bound: how many, from how many addresses.
    Overflow {
        failures: u64,
        addresses: u64,
        since: Millis,
    },
}

/// Counts failures per kind within fixed windows.
#[derive(Debug)]
pub struct FailureAudit {
    window_ms: Millis,
    rows_per_window: usize,
    started: Millis,
    /// Each kind seen in the window: whether its first failure was written, and its repeats.
    kinds: HashMap<FailureKind, Seen>,
    written: usize,
    overflow_failures: u64,
    overflow_addresses: HashSet<String>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Seen {
    repeats: u64,
}

impl FailureAudit {
    pub fn new(window_ms: Millis, rows_per_window: usize) -> Self {
        FailureAudit {
            window_ms,
            rows_per_window,
            started: 0,
            kinds: HashMap::new(),
            written: 0,
            overflow_failures: 0,
            overflow_addresses: HashSet::new(),
        }
    }

    pub fn rows_per_window(&self) -> usize {
        self.rows_per_window
    }

    /// Records a failure at `now`; answers the rows to write now: the previous window's
    /// summaries if it has ended, then this failure's own row if it is the first of its kind.
    pub fn record(&mut self, kind: FailureKind, now: Millis) -> Vec<AuditRow> {
        let mut rows = self.close_if_ended(now);
        if self.kinds.is_empty() && self.overflow_failures == 0 {
            self.started = now;
        }
        match self.kinds.get_mut(&kind) {
            Some(seen) => seen.repeats += 1,
            None if self.written < self.rows_per_window => {
                self.kinds.insert(kind.clone(), Seen::default());
                self.written += 1;
                rows.push(AuditRow::First(kind));
            }
            None => {
                self.overflow_failures += 1;
                self.overflow_addresses.insert(kind.address);
            }
        }
        rows
    }

    /// The summaries of a window that has ended by `now` (nothing while it lasts).
    pub fn close_if_ended(&mut self, now: Millis) -> Vec<AuditRow> {
        if now < self.started.saturating_add(self.window_ms) {
            return Vec::new();
        }
        self.close()
    }

    /// Ends the window at once (shutdown): its summaries.
    pub fn close(&mut self) -> Vec<AuditRow> {
        let since = self.started;
        let mut repeated: Vec<(FailureKind, u64)> = self
            .kinds
            .drain()
            .filter(|(_, seen)| seen.repeats > 0)
            .map(|(kind, seen)| (kind, seen.repeats))
            .collect();
        // The most frequent kinds get rows of their own; ties in a stable order.
        repeated.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.address.cmp(&b.0.address)));
        let mut overflow_failures = std::mem::take(&mut self.overflow_failures);
        let mut overflow_addresses = std::mem::take(&mut self.overflow_addresses);
        let mut rows = Vec::new();
        for (index, (kind, count)) in repeated.into_iter().enumerate() {
            if index < self.rows_per_window {
                rows.push(AuditRow::Repeated { kind, count, since });
            } else {
                overflow_failures += count;
                overflow_addresses.insert(kind.address);
            }
        }
        if overflow_failures > 0 {
            rows.push(AuditRow::Overflow {
                failures: overflow_failures,
                addresses: overflow_addresses.len() as u64,
                since,
            });
        }
        self.written = 0;
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(address: &str) -> FailureKind {
        FailureKind {
            address: address.into(),
            reason: "unknown token".into(),
            token: String::new(),
        }
    }

    #[test]
    fn the_first_failure_of_a_kind_is_a_row_and_its_repeats_one_summary() {
        let mut audit = FailureAudit::new(60_000, 100);
        assert_eq!(
            audit.record(kind("10.0.0.1"), 1_000),
            vec![AuditRow::First(kind("10.0.0.1"))]
        );
        for at in 1_001..1_020 {
            assert_eq!(audit.record(kind("10.0.0.1"), at), vec![]);
        }
        assert_eq!(audit.close_if_ended(60_999), vec![], "the window lasts");
        assert_eq!(
            audit.close_if_ended(61_000),
            vec![AuditRow::Repeated {
                kind: kind("10.0.0.1"),
                count: 19,
                since: 1_000
            }]
        );
        // The next window starts afresh with the next failure.
        assert_eq!(
            audit.record(kind("10.0.0.1"), 90_000),
            vec![AuditRow::First(kind("10.0.0.1"))]
        );
        assert_eq!(audit.close(), vec![], "no repeats, no summary");
    }

    #[test]
    fn a_failure_after_the_window_writes_the_summary_first() {
        let mut audit = FailureAudit::new(60_000, 100);
        audit.record(kind("a"), 0);
        audit.record(kind("a"), 1);
        let rows = audit.record(kind("b"), 70_000);
        assert_eq!(
            rows,
            vec![
                AuditRow::Repeated {
                    kind: kind("a"),
                    count: 1,
                    since: 0
                },
                AuditRow::First(kind("b")),
            ]
        );
    }

    #[test]
    fn a_flood_from_many_addresses_writes_a_bounded_number_of_rows_and_counts_every_failure() {
        // 250 addresses, 19 failures each, within one window (the finding: 4,750 rows).
        let mut audit = FailureAudit::new(60_000, 100);
        let mut rows = Vec::new();
        for round in 0..19 {
            for address in 0..250 {
                rows.extend(audit.record(kind(&format!("10.0.{address}.1")), 1_000 + round));
            }
        }
        rows.extend(audit.close());
        assert!(rows.len() <= 201, "{} rows", rows.len());
        let counted: u64 = rows
            .iter()
            .map(|row| match row {
                AuditRow::First(_) => 1,
                AuditRow::Repeated { count, .. } => *count,
                AuditRow::Overflow { failures, .. } => *failures,
            })
            .sum();
        assert_eq!(counted, 250 * 19, "every failure is counted");
        let Some(AuditRow::Overflow { addresses, .. }) = rows.last() else {
            panic!("an overflow row: {:?}", rows.last());
        };
        assert_eq!(*addresses, 150, "the addresses past the bound");
    }
}
