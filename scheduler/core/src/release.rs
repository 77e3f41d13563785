//! Releases of ax and the version policy between a node and the store's schema
//! (docs/operations.md, "Version policy").
//!
//! A *version* in the policy is a release series: `0.2` while the major version is 0 (every
//! 0.2.x), the major version from 1.0 on. Nodes and workers of adjacent versions interoperate,
//! and migrations expand then contract: a schema migrated by version N still serves nodes of
//! N-1, and only N+1 may drop what N-1 needed. The store records which release migrated it and
//! the oldest release that may still run on it; [`judge_schema`] decides from that record
//! whether a node may start.

use std::cmp::Ordering;
use std::fmt;

/// A release number, `MAJOR.MINOR.PATCH` (a pre-release or build suffix is kept for display and
/// ignored in comparisons: `0.3.0-rc.1` runs where `0.3.0` does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// Whatever followed the patch number (`-rc.1`, `+build`), as written.
    pub suffix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a release number (MAJOR.MINOR.PATCH)")]
pub struct BadRelease(pub String);

impl Release {
    pub fn parse(text: &str) -> Result<Release, BadRelease> {
        let bad = || BadRelease(text.to_string());
        let text = text.trim();
        let end = text.find(['-', '+']).unwrap_or(text.len());
        let (numbers, suffix) = text.split_at(end);
        let mut parts = numbers.split('.');
        let mut next = || -> Result<u64, BadRelease> {
            let part = parts.next().ok_or_else(bad)?;
            if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse().map_err(|_| bad())
        };
        let (major, minor, patch) = (next()?, next()?, next()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Release {
            major,
            minor,
            patch,
            suffix: suffix.to_string(),
        })
    }

    /// The release series this one belongs to: the version of the policy.
    pub fn series(&self) -> Series {
        if self.major == 0 {
            Series {
                major: 0,
                minor: Some(self.minor),
            }
        } else {
            Series {
                major: self.major,
                minor: None,
            }
        }
    }

    fn key(&self) -> (u64, u64, u64) {
        (self.major, self.minor, self.patch)
    }
}

impl PartialOrd for Release {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Release {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key().cmp(&other.key())
    }
}

impl fmt::Display for Release {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}.{}.{}{}",
            self.major, self.minor, self.patch, self.suffix
        )
    }
}

/// A version of the policy: `0.2` (every 0.2.x) or, from 1.0 on, `1` (every 1.x.y).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Series {
    pub major: u64,
    /// Set while the major version is 0.
    pub minor: Option<u64>,
}

impl Series {
    /// The version after this one.
    pub fn next(self) -> Series {
        match self.minor {
            Some(minor) => Series {
                major: 0,
                minor: Some(minor + 1),
            },
            None => Series {
                major: self.major + 1,
                minor: None,
            },
        }
    }

    /// The version before this one, if any (`0.0` has none, nor has `1`: 1.0 follows whatever
    /// the last 0.x was, which the policy cannot name).
    pub fn previous(self) -> Option<Series> {
        match self.minor {
            Some(0) => None,
            Some(minor) => Some(Series {
                major: 0,
                minor: Some(minor - 1),
            }),
            None if self.major <= 1 => None,
            None => Some(Series {
                major: self.major - 1,
                minor: None,
            }),
        }
    }

    /// The first release of the series.
    pub fn first(self) -> Release {
        Release {
            major: self.major,
            minor: self.minor.unwrap_or(0),
            patch: 0,
            suffix: String::new(),
        }
    }
}

impl fmt::Display for Series {
    /// As the releases it holds are written: `0.2.x`, `1.x`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.minor {
            Some(minor) => write!(f, "{}.{minor}.x", self.major),
            None => write!(f, "{}.x", self.major),
        }
    }
}

/// What the store records about its schema: the newest release that migrated it, the highest
/// migration applied then, and the oldest release that may still run on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaRelease {
    pub release: Release,
    pub migration: i64,
    pub oldest_release: Release,
}

/// The oldest release that may run on a schema migrated by `release`: the first release of the
/// version before it (the release itself when there is none).
pub fn oldest_compatible(release: &Release) -> Release {
    release
        .series()
        .previous()
        .map_or_else(|| release.series().first(), Series::first)
}

/// Whether a node of release `node` may start on a store whose schema is `schema` (`None`: a
/// new database, or one no release has recorded itself in yet).
///
/// It refuses a schema that a version more than one ahead migrated (its oldest release is newer
/// than the node: what the node needs may have been dropped), and a schema older than the
/// oldest release the node's own migrations leave running (`oldest`): migrating it would
/// contract under nodes that may still run the version before that, so upgrades go one version
/// at a time. The refusal names both versions and what to do.
pub fn judge_schema(
    schema: Option<&SchemaRelease>,
    node: &Release,
    oldest: &Release,
) -> Result<(), String> {
    let Some(schema) = schema else {
        return Ok(());
    };
    if schema.oldest_release > *node {
        return Err(format!(
            "the store's schema is of ax {} (migration {}); this node is ax {node} and runs on \
             schemas of {} or {}: upgrade this node",
            schema.release,
            schema.migration,
            node.series(),
            node.series().next()
        ));
    }
    if schema.release < *oldest {
        return Err(format!(
            "the store's schema is of ax {} (migration {}); this node is ax {node} and upgrades \
             schemas of {} or later: upgrade the cluster to {} first (one version at a time)",
            schema.release,
            schema.migration,
            oldest.series(),
            oldest.series()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(text: &str) -> Release {
        Release::parse(text).expect("a release")
    }

    fn schema(release: &str, migration: i64) -> SchemaRelease {
        SchemaRelease {
            release: r(release),
            migration,
            oldest_release: oldest_compatible(&r(release)),
        }
    }

    #[test]
    fn releases_parse_compare_and_show_as_written() {
        assert_eq!(r("0.2.0").to_string(), "0.2.0");
        assert_eq!(r("0.3.0-rc.1").to_string(), "0.3.0-rc.1");
        assert!(r("0.2.10") > r("0.2.9"));
        assert!(r("0.10.0") > r("0.9.3"));
        assert!(r("1.0.0") > r("0.99.0"));
        assert_eq!(r("0.3.0-rc.1").cmp(&r("0.3.0")), Ordering::Equal);
        for bad in ["", "0.2", "0.2.0.1", "v0.2.0", "0.x.0", "0..1", "unknown"] {
            assert!(Release::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_version_is_the_minor_series_before_1_0_and_the_major_after() {
        assert_eq!(r("0.2.7").series().to_string(), "0.2.x");
        assert_eq!(r("0.2.7").series().next().to_string(), "0.3.x");
        assert_eq!(r("1.4.0").series().to_string(), "1.x");
        assert_eq!(r("1.4.0").series().next().to_string(), "2.x");
        assert_eq!(oldest_compatible(&r("0.2.0")), r("0.1.0"));
        assert_eq!(oldest_compatible(&r("0.2.5")), r("0.1.0"));
        assert_eq!(oldest_compatible(&r("0.0.3")), r("0.0.0"));
        assert_eq!(oldest_compatible(&r("2.1.0")), r("1.0.0"));
        assert_eq!(oldest_compatible(&r("1.0.0")), r("1.0.0"));
    }

    #[test]
    fn a_node_runs_on_its_own_version_and_the_next_one_and_refuses_further_ahead() {
        let node = r("0.2.0");
        let oldest = oldest_compatible(&node);
        assert_eq!(judge_schema(None, &node, &oldest), Ok(()));
        for ok in ["0.1.0", "0.2.0", "0.2.3", "0.3.0", "0.3.9"] {
            assert_eq!(
                judge_schema(Some(&schema(ok, 22)), &node, &oldest),
                Ok(()),
                "{ok}"
            );
        }
        assert_eq!(
            judge_schema(Some(&schema("0.4.0", 23)), &node, &oldest),
            Err(
                "the store's schema is of ax 0.4.0 (migration 23); this node is ax 0.2.0 and \
                 runs on schemas of 0.2.x or 0.3.x: upgrade this node"
                    .into()
            )
        );
    }

    #[test]
    fn a_node_refuses_to_skip_a_version_when_it_upgrades() {
        let node = r("0.4.0");
        let oldest = oldest_compatible(&node);
        assert_eq!(
            judge_schema(Some(&schema("0.3.2", 30)), &node, &oldest),
            Ok(())
        );
        assert_eq!(
            judge_schema(Some(&schema("0.2.0", 22)), &node, &oldest),
            Err(
                "the store's schema is of ax 0.2.0 (migration 22); this node is ax 0.4.0 and \
                 upgrades schemas of 0.3.x or later: upgrade the cluster to 0.3.x first (one \
                 version at a time)"
                    .into()
            )
        );
    }
}
