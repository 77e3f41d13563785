//! What a worker's credential lets it be: the worker ids it may register (an exact id, a prefix
//! pattern such as `etl-*`, or `*`), the apps whose tasks it may run and the labels it may
//! claim; and when a second stream for one worker id may take over from the first.
//!
//! A worker token carries a [`WorkerScope`]. A Register is refused when its id matches none of
//! the scope's patterns or when it claims a label the scope does not list
//! ([`WorkerScope::check_register`]); placement sends a worker only tasks of the apps its scope
//! allows (`placement::Candidate::may_serve`). Tokens made before scopes existed read as
//! [`WorkerScope::any`].
//!
//! One id has one live stream. A Register for an id that already has one takes over only when
//! the first is gone ([`takeover`]): its connection closed, the same worker process reconnecting
//! (the same incarnation, a nonce the process draws once at start), or the first silent for
//! [`SILENT_AFTER_HEARTBEATS`] heartbeat intervals. Anything else is refused, and the worker
//! tries again later.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::Millis;

/// Longest pattern (and worker id) accepted.
/// What each of a scope's lists may take in all, as stored.
const MAX_STORED_LIST: usize = 1_000;
const MAX_PATTERN: usize = 128;

/// A pattern of worker ids: an exact id, a prefix ending in `*` (`etl-*`), or `*` for any id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct IdPattern(String);

impl IdPattern {
    /// `*` only at the end; no spaces or control characters; 1 to 128 characters.
    pub fn parse(text: &str) -> Result<IdPattern, String> {
        let text = text.trim();
        if text.is_empty() || text.len() > MAX_PATTERN {
            return Err(format!(
                "worker id pattern {text:?}: 1 to {MAX_PATTERN} characters"
            ));
        }
        if text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || c == ',')
        {
            return Err(format!(
                "worker id pattern {text:?}: no spaces, commas or control characters"
            ));
        }
        if text.trim_end_matches('*').contains('*') || text.ends_with("**") {
            return Err(format!(
                "worker id pattern {text:?}: '*' may only end it (an id, a prefix such as etl-*, \
                 or * for any id)"
            ));
        }
        Ok(IdPattern(text.to_string()))
    }

    /// Whether the worker id `id` is one this pattern names, byte for byte.
    pub fn matches(&self, id: &str) -> bool {
        match self.0.strip_suffix('*') {
            Some(prefix) => id.starts_with(prefix),
            None => id == self.0,
        }
    }

    /// `*`: any id at all.
    pub fn is_any(&self) -> bool {
        self.0 == "*"
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for IdPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for IdPattern {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        IdPattern::parse(&text)
    }
}

impl From<IdPattern> for String {
    fn from(pattern: IdPattern) -> String {
        pattern.0
    }
}

/// What a worker token lets its holder be and run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerScope {
    /// The worker ids it may register; never empty.
    pub ids: Vec<IdPattern>,
    /// The apps whose tasks it may run; empty: every app.
    pub apps: BTreeSet<String>,
    /// The labels (key, value) it may claim; empty: any labels.
    pub labels: BTreeSet<(String, String)>,
}

/// Why a Register does not fit its token's scope, as the worker and the audit trail are told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterRefusal {
    /// The id matches none of the patterns.
    Id { id: String, patterns: String },
    /// The worker claims a label the scope does not list.
    Label {
        key: String,
        value: String,
        allowed: String,
    },
}

impl fmt::Display for RegisterRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RegisterRefusal::Id { id, patterns } => write!(
                f,
                "worker id {id:?} is not one this token may register (it allows {patterns})"
            ),
            RegisterRefusal::Label {
                key,
                value,
                allowed,
            } => write!(
                f,
                "label {key}={value} is not one this token may claim (it allows {allowed})"
            ),
        }
    }
}

impl WorkerScope {
    /// Any id, every app, any labels: a token made before scopes existed, or one made with
    /// `--worker-id '*'` and nothing else.
    pub fn any() -> WorkerScope {
        WorkerScope {
            ids: vec![IdPattern("*".into())],
            apps: BTreeSet::new(),
            labels: BTreeSet::new(),
        }
    }

    /// A scope from its parts as given on a command line: id patterns (at least one), app
    /// names, and `key=value` labels.
    pub fn parse(
        ids: &[String],
        apps: &[String],
        labels: &[String],
    ) -> Result<WorkerScope, String> {
        if ids.iter().all(|id| id.trim().is_empty()) {
            return Err(
                "a worker token names the worker ids it may register: give --worker-id PATTERN \
                 (an id, a prefix such as etl-*, or '*' for any id)"
                    .into(),
            );
        }
        let ids: Vec<IdPattern> = ids
            .iter()
            .filter(|id| !id.trim().is_empty())
            .map(|id| IdPattern::parse(id))
            .collect::<Result<BTreeSet<_>, _>>()?
            .into_iter()
            .collect();
        let apps: BTreeSet<String> = apps
            .iter()
            .map(|app| {
                let app = app.trim();
                if crate::spec::is_valid_name(app) {
                    Ok(app.to_string())
                } else {
                    Err(format!(
                        "app {app:?}: expected 1 to 64 of a-z, 0-9, '_', '.', '-', starting with \
                         a letter or digit"
                    ))
                }
            })
            .collect::<Result<_, _>>()?;
        let labels: BTreeSet<(String, String)> = labels
            .iter()
            .map(|label| parse_label(label))
            .collect::<Result<_, _>>()?;
        // The store keeps each list in a column of 1,024 characters.
        let id_text: usize = ids.iter().map(|id| id.as_str().len() + 1).sum();
        let app_text: usize = apps.iter().map(|app| app.len() + 1).sum();
        let label_text: usize = labels
            .iter()
            .map(|(key, value)| key.len() + value.len() + 2)
            .sum();
        for (what, length) in [
            ("worker ids", id_text),
            ("apps", app_text),
            ("labels", label_text),
        ] {
            if length > MAX_STORED_LIST {
                return Err(format!(
                    "a worker token's {what} take at most {MAX_STORED_LIST} characters in all \
                     ({length} given)"
                ));
            }
        }
        Ok(WorkerScope { ids, apps, labels })
    }

    /// Whether a worker registering as `id` with `labels` fits this scope.
    pub fn check_register(
        &self,
        id: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), RegisterRefusal> {
        if !self.ids.iter().any(|pattern| pattern.matches(id)) {
            return Err(RegisterRefusal::Id {
                id: id.to_string(),
                patterns: self.ids_text(),
            });
        }
        if self.labels.is_empty() {
            return Ok(());
        }
        for (key, value) in labels {
            if !self.labels.contains(&(key.clone(), value.clone())) {
                return Err(RegisterRefusal::Label {
                    key: key.clone(),
                    value: value.clone(),
                    allowed: self.labels_text(),
                });
            }
        }
        Ok(())
    }

    /// The apps it is limited to, or `None` for every app.
    pub fn app_limit(&self) -> Option<Vec<String>> {
        (!self.apps.is_empty()).then(|| self.apps.iter().cloned().collect())
    }

    /// The id patterns as people read them: `etl-*, w1`.
    pub fn ids_text(&self) -> String {
        let patterns: Vec<&str> = self.ids.iter().map(IdPattern::as_str).collect();
        patterns.join(", ")
    }

    /// The labels as people read them: `pool=gpu, zone=east`, or `any labels`.
    pub fn labels_text(&self) -> String {
        if self.labels.is_empty() {
            return "any labels".into();
        }
        self.label_list().join(", ")
    }

    /// The labels as `key=value` texts.
    pub fn label_list(&self) -> Vec<String> {
        self.labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect()
    }

    /// The whole scope in one line, for audit rows and `axctl token create`.
    pub fn describe(&self) -> String {
        let apps = if self.apps.is_empty() {
            "every app".to_string()
        } else {
            let apps: Vec<&str> = self.apps.iter().map(String::as_str).collect();
            format!("apps {}", apps.join(", "))
        };
        format!(
            "worker ids {}; {apps}; {}",
            self.ids_text(),
            if self.labels.is_empty() {
                "any labels".to_string()
            } else {
                format!("labels {}", self.labels_text())
            }
        )
    }
}

/// `key=value`, both sides non-empty once trimmed.
fn parse_label(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() && !value.trim().is_empty() => {
            Ok((key.trim().to_string(), value.trim().to_string()))
        }
        _ => Err(format!("label {text:?}: expected key=value")),
    }
}

/// How many of the node's heartbeat intervals a stream may be silent before a second stream
/// for its id takes over: a live worker sends a heartbeat every interval.
pub const SILENT_AFTER_HEARTBEATS: i64 = 2;

/// The stream a worker id already has, as a new Register for the id finds it.
#[derive(Debug, Clone, Copy)]
pub struct HeldStream<'a> {
    /// The incarnation its Register carried (empty: none).
    pub incarnation: &'a str,
    /// When a frame was last received on it.
    pub last_heard: Millis,
    /// Its connection is known to be closed.
    pub closed: bool,
}

/// Whether a new stream for an id takes over from the one it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// The held stream's connection is closed: the worker died or its connection was cut.
    Closed,
    /// The same worker process reconnects (its old stream went quiet on its side).
    SameProcess,
    /// The held stream has been silent this long, past the bound.
    Silent { for_ms: Millis },
    /// Refused: the held stream was heard this long ago, and it is not this process's.
    Refused { heard_ms_ago: Millis },
}

impl Takeover {
    pub fn is_refused(self) -> bool {
        matches!(self, Takeover::Refused { .. })
    }
}

/// Decides a Register carrying `incarnation` at `now` for an id that holds `held`; a stream
/// silent for `silent_after_ms` is gone.
pub fn takeover(
    held: &HeldStream<'_>,
    incarnation: &str,
    now: Millis,
    silent_after_ms: Millis,
) -> Takeover {
    if held.closed {
        return Takeover::Closed;
    }
    // An empty incarnation proves nothing: a worker that sends none is told apart by silence.
    if !incarnation.is_empty() && incarnation == held.incarnation {
        return Takeover::SameProcess;
    }
    let silent = now - held.last_heard;
    if silent >= silent_after_ms {
        return Takeover::Silent { for_ms: silent };
    }
    Takeover::Refused {
        heard_ms_ago: silent.max(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn patterns_match_exact_ids_prefixes_or_anything_byte_for_byte() {
        let exact = IdPattern::parse("w1").unwrap();
        assert!(exact.matches("w1"));
        for other in ["W1", "w1.", "w10", "w", ""] {
            assert!(!exact.matches(other), "{other}");
        }
        let prefix = IdPattern::parse("etl-*").unwrap();
        assert!(prefix.matches("etl-1") && prefix.matches("etl-"));
        assert!(!prefix.matches("ETL-1") && !prefix.matches("etl") && !prefix.matches("x-etl-1"));
        let any = IdPattern::parse("*").unwrap();
        assert!(any.is_any() && any.matches("anything") && !prefix.is_any());
        for bad in ["", "a b", "a,b", "*x", "e*tl", "etl-**", "\u{7}"] {
            assert!(IdPattern::parse(bad).is_err(), "{bad:?}");
        }
        assert!(
            IdPattern::parse(&"x".repeat(129))
                .unwrap_err()
                .contains("1 to 128")
        );
    }

    #[test]
    fn a_scope_needs_a_pattern_and_checks_its_apps_and_labels() {
        let error = WorkerScope::parse(&[], &[], &[]).unwrap_err();
        assert!(error.contains("--worker-id PATTERN"), "{error}");
        assert!(error.contains("'*'"), "{error}");
        assert!(
            WorkerScope::parse(&strings(&["w1"]), &strings(&["Sales!"]), &[])
                .unwrap_err()
                .contains("app \"Sales!\"")
        );
        assert!(
            WorkerScope::parse(&strings(&["w1"]), &[], &strings(&["gpu"]))
                .unwrap_err()
                .contains("key=value")
        );
        let scope = WorkerScope::parse(
            &strings(&["etl-*", "w1"]),
            &strings(&["sales", "finance"]),
            &strings(&["pool=gpu", "pool=cpu", "zone=east"]),
        )
        .unwrap();
        assert_eq!(scope.ids_text(), "etl-*, w1");
        assert_eq!(
            scope.describe(),
            "worker ids etl-*, w1; apps finance, sales; labels pool=cpu, pool=gpu, zone=east"
        );
        assert_eq!(
            scope.app_limit(),
            Some(strings(&["finance", "sales"])),
            "sorted"
        );
        assert_eq!(
            scope.check_register("etl-7", &labels(&[("pool", "gpu"), ("zone", "east")])),
            Ok(())
        );
        assert_eq!(scope.check_register("w1", &BTreeMap::new()), Ok(()));
        let refused = scope.check_register("w2", &BTreeMap::new()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "worker id \"w2\" is not one this token may register (it allows etl-*, w1)"
        );
        let refused = scope
            .check_register("w1", &labels(&[("pool", "prod-db")]))
            .unwrap_err();
        assert_eq!(
            refused.to_string(),
            "label pool=prod-db is not one this token may claim (it allows pool=cpu, \
             pool=gpu, zone=east)"
        );
        // Without a labels limit, any label goes; without apps, every app.
        let any = WorkerScope::any();
        assert_eq!(
            any.check_register("x", &labels(&[("pool", "prod-db")])),
            Ok(())
        );
        assert_eq!(any.app_limit(), None);
        assert_eq!(any.describe(), "worker ids *; every app; any labels");
    }

    #[test]
    fn a_scope_fits_the_columns_it_is_stored_in() {
        let many_apps: Vec<String> = (0..200).map(|n| format!("app-number-{n}")).collect();
        let err = WorkerScope::parse(&["w1".to_string()], &many_apps, &[])
            .expect_err("too many apps to store");
        assert!(err.contains("apps take at most 1000 characters"), "{err}");
        assert!(WorkerScope::parse(&["w1".to_string()], &many_apps[..50], &[]).is_ok());
    }

    #[test]
    fn a_scope_survives_its_stored_form() {
        let scope = WorkerScope::parse(
            &strings(&["etl-*"]),
            &strings(&["sales"]),
            &strings(&["pool=gpu"]),
        )
        .unwrap();
        let json = serde_json::to_string(&scope).unwrap();
        assert_eq!(serde_json::from_str::<WorkerScope>(&json).unwrap(), scope);
        // A pattern stored by hand that does not parse is refused on the way in.
        assert!(serde_json::from_str::<IdPattern>("\"a*b\"").is_err());
    }

    #[test]
    fn a_second_stream_takes_over_only_from_a_gone_one() {
        let held = HeldStream {
            incarnation: "abc",
            last_heard: 10_000,
            closed: false,
        };
        let bound = 1_000;
        assert_eq!(takeover(&held, "abc", 10_100, bound), Takeover::SameProcess);
        assert_eq!(
            takeover(&held, "other", 10_400, bound),
            Takeover::Refused { heard_ms_ago: 400 }
        );
        assert!(takeover(&held, "", 10_400, bound).is_refused());
        assert_eq!(
            takeover(&held, "other", 11_000, bound),
            Takeover::Silent { for_ms: 1_000 }
        );
        let closed = HeldStream {
            closed: true,
            ..held
        };
        assert_eq!(takeover(&closed, "other", 10_001, bound), Takeover::Closed);
        // A held stream without an incarnation is not matched by an empty one.
        let bare = HeldStream {
            incarnation: "",
            ..held
        };
        assert!(takeover(&bare, "", 10_001, bound).is_refused());
        // Clocks: a last frame "in the future" reads as just heard.
        assert_eq!(
            takeover(&held, "other", 9_000, bound),
            Takeover::Refused { heard_ms_ago: 0 }
        );
    }
}
