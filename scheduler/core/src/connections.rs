//! The node's connection limits as decisions: how many connections it holds at once (within
//! its open-file limit), when a connection is closed (no first request within the deadline,
//! idle past the timeout, a close that the peer does not finish), and which connection makes
//! room for a new one when the node is full (the one quiet the longest; never one with a
//! request open, so a worker's stream or an open event stream is never the one cut).
//!
//! Instants are milliseconds on the node's monotonic clock (since its listener started), not
//! wall-clock `Millis`: a clock step must not close or keep a connection.

/// The most connections a node holds at once unless told otherwise (and its open-file limit
/// allows).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 10_000;

/// Open files the node keeps for itself whatever its connections hold: the store's pool (a
/// SQLite connection holds three files), Redis, webhooks, the listeners, the runtime. A node
/// under a larger limit keeps an eighth of it.
pub const RESERVED_FILES: u64 = 64;

/// Never fewer connections than this, even under an open-file limit too low to run a node well.
pub const MIN_CONNECTIONS: usize = 8;

/// The open files a node keeps out of its connections' reach under `open_file_limit`.
pub fn reserved_files(open_file_limit: u64) -> u64 {
    RESERVED_FILES.max(open_file_limit / 8)
}

/// How many connections the node holds at once: `requested`, lowered to what its open-file
/// limit leaves after [`reserved_files`] (a connection is one file). `None` means the limit is
/// unknown or unlimited.
pub fn connection_cap(requested: u32, open_file_limit: Option<u64>) -> usize {
    let requested = requested as usize;
    match open_file_limit {
        None => requested,
        Some(limit) => {
            let room = limit.saturating_sub(reserved_files(limit));
            requested.min(usize::try_from(room).unwrap_or(usize::MAX))
        }
    }
    .max(MIN_CONNECTIONS)
}

/// The open-file limit that holds `requested` connections and the reserve: what the node raises
/// its soft limit to when the hard limit allows.
pub fn open_files_wanted(requested: u32) -> u64 {
    let requested = u64::from(requested);
    // reserved_files(L) is at most L/8 past the minimum: L = requested * 8/7 leaves requested.
    (requested + RESERVED_FILES).max(requested.div_ceil(7) * 8)
}

/// The timeouts a connection is held to, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// From accept to the first request (a complete HTTP/1 request head or an HTTP/2 stream's
    /// headers), the TLS handshake included.
    pub first_request_ms: u64,
    /// How long a connection that served requests may stay open with none open.
    pub idle_ms: u64,
    /// How long a connection being closed gracefully (HTTP/2 GOAWAY, HTTP/1 after its
    /// response) may take before it is dropped, when no request is open on it.
    pub close_grace_ms: u64,
}

/// What is known of one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionView {
    pub opened_ms: u64,
    /// It has had a request.
    pub served: bool,
    /// Requests whose response has not ended (an open stream is an open request).
    pub open_requests: usize,
    /// When its last open request ended (its accept, before any).
    pub quiet_since_ms: u64,
    /// When a graceful close began.
    pub closing_since_ms: Option<u64>,
}

/// Why a connection is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// No first request within [`Timeouts::first_request_ms`].
    FirstRequestTimeout,
    /// No open request for [`Timeouts::idle_ms`].
    Idle,
}

impl CloseReason {
    pub fn as_str(self) -> &'static str {
        match self {
            CloseReason::FirstRequestTimeout => "first_request_timeout",
            CloseReason::Idle => "idle",
        }
    }
}

/// What to do with a connection now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Leave it; look again at `until_ms` (or sooner, if something happens).
    Keep { until_ms: u64 },
    /// Begin a graceful close.
    Close(CloseReason),
    /// Its graceful close took too long with nothing open: drop it.
    Drop,
}

/// Judges a connection at `now_ms`.
pub fn judge(view: &ConnectionView, now_ms: u64, timeouts: &Timeouts) -> Verdict {
    if let Some(since) = view.closing_since_ms {
        let until_ms = since.saturating_add(timeouts.close_grace_ms);
        if now_ms < until_ms {
            return Verdict::Keep { until_ms };
        }
        if view.open_requests == 0 {
            return Verdict::Drop;
        }
        // A request that came in before the peer saw the close is served to its end.
        return Verdict::Keep {
            until_ms: now_ms.saturating_add(timeouts.close_grace_ms.max(1)),
        };
    }
    // A request counted open before its connection reads as served is served all the same.
    if !view.served && view.open_requests == 0 {
        let until_ms = view.opened_ms.saturating_add(timeouts.first_request_ms);
        if now_ms >= until_ms {
            return Verdict::Close(CloseReason::FirstRequestTimeout);
        }
        return Verdict::Keep { until_ms };
    }
    if view.open_requests > 0 {
        // Nothing to time while a request is open; look again when it could have gone idle.
        return Verdict::Keep {
            until_ms: now_ms.saturating_add(timeouts.idle_ms),
        };
    }
    let until_ms = view.quiet_since_ms.saturating_add(timeouts.idle_ms);
    if now_ms >= until_ms {
        return Verdict::Close(CloseReason::Idle);
    }
    Verdict::Keep { until_ms }
}

/// Which connection makes room for a new one when the node is full: among those with no open
/// request and not already closing, the one quiet the longest (ties: the older id). `None` when
/// every connection has a request open: the new connection is then refused.
pub fn quietest<K: Copy + Ord>(
    connections: impl IntoIterator<Item = (K, ConnectionView)>,
) -> Option<K> {
    connections
        .into_iter()
        .filter(|(_, view)| view.open_requests == 0 && view.closing_since_ms.is_none())
        .min_by_key(|(key, view)| (view.quiet_since_ms, *key))
        .map(|(key, _)| key)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUTS: Timeouts = Timeouts {
        first_request_ms: 10_000,
        idle_ms: 300_000,
        close_grace_ms: 1_000,
    };

    fn fresh(opened_ms: u64) -> ConnectionView {
        ConnectionView {
            opened_ms,
            served: false,
            open_requests: 0,
            quiet_since_ms: opened_ms,
            closing_since_ms: None,
        }
    }

    #[test]
    fn the_cap_leaves_room_for_the_node_under_its_open_file_limit() {
        assert_eq!(connection_cap(10_000, None), 10_000);
        assert_eq!(connection_cap(10_000, Some(1_024)), 1_024 - 128);
        assert_eq!(connection_cap(10_000, Some(256)), 256 - 64);
        assert_eq!(connection_cap(100, Some(1_024)), 100);
        assert_eq!(connection_cap(10_000, Some(1_048_576)), 10_000);
        // A limit too low to run a node well still serves a few.
        assert_eq!(connection_cap(10_000, Some(20)), MIN_CONNECTIONS);
        assert_eq!(connection_cap(0, None), MIN_CONNECTIONS);
    }

    #[test]
    fn the_wanted_open_file_limit_holds_the_requested_connections() {
        for requested in [1, 100, 448, 1_000, 10_000, 100_000] {
            let wanted = open_files_wanted(requested);
            assert!(
                connection_cap(requested, Some(wanted)) >= requested as usize,
                "{requested}: {wanted}"
            );
        }
    }

    #[test]
    fn a_connection_without_a_first_request_is_closed_at_the_deadline() {
        let view = fresh(1_000);
        assert_eq!(
            judge(&view, 1_000, &TIMEOUTS),
            Verdict::Keep { until_ms: 11_000 }
        );
        assert_eq!(
            judge(&view, 11_000, &TIMEOUTS),
            Verdict::Close(CloseReason::FirstRequestTimeout)
        );
        // Its first request, still open at the deadline, keeps it.
        let busy = ConnectionView {
            open_requests: 1,
            served: true,
            ..view
        };
        assert!(matches!(
            judge(&busy, 50_000, &TIMEOUTS),
            Verdict::Keep { .. }
        ));
    }

    #[test]
    fn an_open_request_is_never_idle_and_a_quiet_connection_is_closed_after_the_timeout() {
        let stream = ConnectionView {
            served: true,
            open_requests: 1,
            quiet_since_ms: 0,
            ..fresh(0)
        };
        // A worker's stream, hours old with nothing else on its connection.
        assert_eq!(
            judge(&stream, 10_000_000, &TIMEOUTS),
            Verdict::Keep {
                until_ms: 10_300_000
            }
        );
        let idle = ConnectionView {
            open_requests: 0,
            quiet_since_ms: 5_000,
            ..stream
        };
        assert_eq!(
            judge(&idle, 6_000, &TIMEOUTS),
            Verdict::Keep { until_ms: 305_000 }
        );
        assert_eq!(
            judge(&idle, 305_000, &TIMEOUTS),
            Verdict::Close(CloseReason::Idle)
        );
    }

    #[test]
    fn a_graceful_close_is_dropped_after_its_grace_unless_a_request_is_open() {
        let closing = ConnectionView {
            closing_since_ms: Some(20_000),
            ..fresh(0)
        };
        assert_eq!(
            judge(&closing, 20_000, &TIMEOUTS),
            Verdict::Keep { until_ms: 21_000 }
        );
        assert_eq!(judge(&closing, 21_000, &TIMEOUTS), Verdict::Drop);
        let answering = ConnectionView {
            served: true,
            open_requests: 1,
            ..closing
        };
        assert_eq!(
            judge(&answering, 21_000, &TIMEOUTS),
            Verdict::Keep { until_ms: 22_000 }
        );
    }

    #[test]
    fn room_is_made_by_the_connection_quiet_the_longest_never_a_busy_one() {
        let idle_since = |at: u64| ConnectionView {
            served: true,
            quiet_since_ms: at,
            ..fresh(0)
        };
        let busy = ConnectionView {
            open_requests: 2,
            ..fresh(0)
        };
        let closing = ConnectionView {
            closing_since_ms: Some(1),
            ..fresh(0)
        };
        let connections = [
            (1, busy),
            (2, idle_since(500)),
            (3, fresh(300)),
            (4, closing),
            (5, fresh(900)),
        ];
        assert_eq!(quietest(connections), Some(3));
        assert_eq!(quietest([(1, busy), (4, closing)]), None);
        assert_eq!(quietest([(7, fresh(5)), (6, fresh(5))]), Some(6));
    }
}
