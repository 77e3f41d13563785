//! Self-fencing: a worker cut off from every live scheduler kills its running attempts before a
//! scheduler could count it dead and retry those attempts on another worker; an outage of the
//! schedulers themselves kills nothing.
//!
//! The scheduler tells the worker its threshold in `Registered.worker_dead_after_ms`: after that
//! much silence from the worker it counts the worker dead, and its attempts may be retried
//! elsewhere. The worker fences after
//!
//! ```text
//! delay = min(self_fence_after, worker_dead_after × 3/4)
//! ```
//!
//! during which no node could have been hearing from it and judging it: measured from the later
//! of its last contact and, for each address, the last time a connection to it was actively
//! refused (the earliest such moment over all addresses counts). The addresses judged are those
//! of the latest pass over the endpoints (a host name counts as each address it resolves to,
//! see `endpoints`), so a changed record changes the set: an address that appears has never
//! refused, and an endpoint that did not resolve in that pass proves nothing, so while one does
//! not, refusals do not stop the count. A refused connection means no
//! node listens there; a node that starts later judges no worker dead until the threshold has
//! passed from its own start (the scheduler's `backstop`), so the time before the refusal cannot
//! count against the worker. A scheduler outage of any length therefore kills nothing as long as
//! each endpoint keeps refusing, while a silent partition (connections time out, or a proxy
//! accepts and drops them) fences in time. A worker with running attempts (or ends not yet
//! acknowledged) tries every endpoint at least every quarter of the delay (see `lib.rs`), so a
//! refusal is never older than that, and a node that comes back hears from the worker well
//! within the threshold it gives workers from its start.
//!
//! The last threshold learned is kept across reconnects, because the fence matters exactly when
//! no scheduler can be asked (just `self_fence_after` when no scheduler has sent a threshold).
//! Lost contact is measured from the last moment the worker had a working stream (see below for
//! which frames count), not from when the reconnect loop noticed the break, so time spent
//! detecting the break counts against the delay.
//!
//! The margin is the remaining quarter of the threshold (5 s with the default 20 s threshold).
//! It must absorb:
//! - the fence check's tick (at most a tenth of the delay, capped at 500 ms);
//! - the kill itself: SIGTERM, then SIGKILL after `kill_grace` (5 s by default) for a task that
//!   ignores SIGTERM, so with the defaults such a task is gone only at the threshold itself
//!   (a warning is logged when `kill_grace` does not fit in the margin);
//! - frames the transport accepted but that never reached the scheduler. After a clean break
//!   (node exit, connection reset) that is nothing. In a silent network partition the stream
//!   stays up until HTTP/2 keepalive (one heartbeat interval between pings, one to answer)
//!   notices. A scheduler that acknowledges heartbeats (`HeartbeatAck`; `ax-scheduler` does)
//!   removes that doubt: once an ack has arrived on a stream, only frames received count as
//!   contact. On a stream without acks, frames sent after the handshake count too.
//!
//! Beyond the margin, the scheduler's start lock still stops a retry from starting beside a
//! survivor. An attempt of a task with `self_fence: false` (`Dispatch.keep_when_cut_off`) is
//! never fenced: its task accepts that a retry may run beside it.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::attempts::Attempts;

/// The fraction of the scheduler's dead-worker threshold after which the worker fences.
const FENCE_NUMERATOR: u32 = 3;
const FENCE_DENOMINATOR: u32 = 4;

/// When the worker last had a working stream, when each address last refused a connection,
/// and the scheduler's threshold it learned.
#[derive(Debug)]
pub(crate) struct Liveness {
    base: Instant,
    /// Milliseconds after `base` of the last contact.
    last_contact_ms: AtomicU64,
    refusals: Mutex<Refusals>,
    /// The scheduler's `worker_dead_after_ms`; 0 until one was learned.
    dead_after_ms: AtomicU32,
}

/// The addresses judged, each with the milliseconds after `base` of its last refused
/// connection (0 if none).
#[derive(Debug, Default)]
struct Refusals {
    judged: HashMap<SocketAddr, u64>,
    /// Some endpoint did not resolve in the latest pass: nodes may listen behind it.
    unresolved: bool,
}

impl Liveness {
    /// Judges no address until [`Liveness::judge`] is given some: until then no refusal counts.
    pub(crate) fn new() -> Self {
        Liveness {
            base: Instant::now(),
            last_contact_ms: AtomicU64::new(0),
            refusals: Mutex::new(Refusals::default()),
            dead_after_ms: AtomicU32::new(0),
        }
    }

    /// As [`Liveness::new`], with the last contact `unheard` before now: the count of an
    /// earlier process of this worker, taken over.
    pub(crate) fn unheard_since_start(unheard: Duration) -> Self {
        let now = Instant::now();
        Liveness {
            base: now.checked_sub(unheard).unwrap_or(now),
            ..Liveness::new()
        }
    }

    fn refusals(&self) -> std::sync::MutexGuard<'_, Refusals> {
        // Whole after any panic (single inserts and reads), so a poisoned lock is still usable.
        self.refusals
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The addresses of a new pass over the endpoints, and whether some endpoint did not
    /// resolve. An address kept from the last pass keeps its last refusal; a new one has none.
    pub(crate) fn judge(&self, addresses: impl IntoIterator<Item = SocketAddr>, unresolved: bool) {
        let mut refusals = self.refusals();
        let judged = addresses
            .into_iter()
            .map(|address| {
                let refused = refusals.judged.get(&address).copied().unwrap_or(0);
                (address, refused)
            })
            .collect();
        *refusals = Refusals { judged, unresolved };
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Records that a stream just worked: a frame was received or handed to the transport.
    pub(crate) fn touch(&self) {
        self.last_contact_ms
            .fetch_max(self.now_ms(), Ordering::Relaxed);
    }

    /// Records that `address` refused a connection just now: no node listens there. An address
    /// no longer judged changes nothing.
    pub(crate) fn refused(&self, address: SocketAddr) {
        let now = self.now_ms();
        if let Some(refused) = self.refusals().judged.get_mut(&address) {
            *refused = (*refused).max(now);
        }
    }

    /// For how long some node may have been up and not hearing from this worker: since the
    /// last contact, or since the last refusal of the address refused longest ago, whichever
    /// is later (just the last contact while no address is judged or an endpoint did not
    /// resolve).
    pub(crate) fn unheard_for(&self) -> Duration {
        let contact = self.last_contact_ms.load(Ordering::Relaxed);
        let oldest_refusal = {
            let refusals = self.refusals();
            if refusals.unresolved {
                0
            } else {
                refusals.judged.values().copied().min().unwrap_or(0)
            }
        };
        let since = Duration::from_millis(contact.max(oldest_refusal));
        self.base.elapsed().saturating_sub(since)
    }

    /// Keeps the scheduler's dead-worker threshold; 0 (a scheduler that sends none) keeps the
    /// last one.
    pub(crate) fn learn_dead_after(&self, dead_after_ms: u32) {
        if dead_after_ms != 0 {
            self.dead_after_ms.store(dead_after_ms, Ordering::Relaxed);
        }
    }

    pub(crate) fn dead_after(&self) -> Option<Duration> {
        match self.dead_after_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(u64::from(ms))),
        }
    }
}

/// The self-fence delay: the configured one, shortened to 3/4 of the scheduler's threshold.
pub(crate) fn effective_delay(configured: Duration, dead_after: Option<Duration>) -> Duration {
    match dead_after {
        Some(dead_after) => configured.min(dead_after * FENCE_NUMERATOR / FENCE_DENOMINATOR),
        None => configured,
    }
}

/// Warns when the kill grace does not fit in the margin the scheduler's threshold leaves.
pub(crate) fn check_margin(configured: Duration, dead_after: Duration, kill_grace: Duration) {
    let delay = effective_delay(configured, Some(dead_after));
    let margin = dead_after.saturating_sub(delay);
    if kill_grace >= margin {
        tracing::warn!(
            dead_after_ms = dead_after.as_millis() as u64,
            fence_after_ms = delay.as_millis() as u64,
            kill_grace_ms = kill_grace.as_millis() as u64,
            "the kill grace exceeds the self-fencing margin: a task ignoring SIGTERM may outlive \
             the scheduler's dead-worker threshold"
        );
    }
}

/// Kills the running attempts once no node may have heard from this worker for the effective
/// delay. Fences once per outage.
pub(crate) async fn self_fence(
    attempts: Arc<Attempts>,
    liveness: Arc<Liveness>,
    configured: Duration,
    stop: CancellationToken,
) {
    let mut fenced = false;
    loop {
        let delay = effective_delay(configured, liveness.dead_after());
        let tick = (delay / 10).clamp(Duration::from_millis(10), Duration::from_millis(500));
        tokio::select! {
            () = tokio::time::sleep(tick) => {}
            () = stop.cancelled() => return,
        }
        if attempts.link().is_some() {
            fenced = false;
            continue;
        }
        let silent = liveness.unheard_for();
        if fenced || silent < delay {
            continue;
        }
        fenced = true;
        let reason = format!(
            "killed by the worker: cut off from the schedulers for {} ms (self-fencing after {} ms)",
            silent.as_millis(),
            delay.as_millis()
        );
        let asked = attempts.fence_all(&reason);
        if asked > 0 {
            tracing::warn!(
                asked,
                silent_ms = silent.as_millis() as u64,
                fence_after_ms = delay.as_millis() as u64,
                "no scheduler reachable; self-fencing running attempts"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn address(text: &str) -> SocketAddr {
        text.parse().expect("an address")
    }

    #[test]
    fn the_scheduler_threshold_shortens_the_delay_and_is_kept() {
        let configured = Duration::from_secs(60);
        let liveness = Liveness::new();
        assert_eq!(
            effective_delay(configured, liveness.dead_after()),
            configured
        );
        liveness.learn_dead_after(2000);
        assert_eq!(
            effective_delay(configured, liveness.dead_after()),
            Duration::from_millis(1500)
        );
        // A scheduler that sends 0 leaves the threshold learned before in place.
        liveness.learn_dead_after(0);
        assert_eq!(liveness.dead_after(), Some(Duration::from_secs(2)));
        // A configured delay shorter than 3/4 of the threshold wins.
        assert_eq!(
            effective_delay(Duration::from_secs(1), Some(Duration::from_secs(20))),
            Duration::from_secs(1)
        );
    }

    #[tokio::test]
    async fn contact_is_measured_from_the_last_touch() {
        let liveness = Liveness::new();
        tokio::time::sleep(Duration::from_millis(30)).await;
        liveness.touch();
        assert!(liveness.unheard_for() < Duration::from_millis(30));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let silent = liveness.unheard_for();
        assert!(silent >= Duration::from_millis(49), "{silent:?}");
    }

    /// A node that refuses connections is down: nobody there judges the worker, so the time
    /// before the refusal does not count. With two addresses, both must have refused.
    #[tokio::test]
    async fn a_refused_connection_restarts_the_count_once_every_address_refused() {
        let (a, b) = (address("10.0.0.1:7070"), address("10.0.0.2:7070"));
        let liveness = Liveness::new();
        liveness.judge([a, b], false);
        liveness.touch();
        tokio::time::sleep(Duration::from_millis(60)).await;
        liveness.refused(a);
        // Address b may be up and cut off from us: the count still runs from the contact.
        assert!(liveness.unheard_for() >= Duration::from_millis(59));
        liveness.refused(b);
        assert!(liveness.unheard_for() < Duration::from_millis(30));
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(liveness.unheard_for() >= Duration::from_millis(39));
        // An address not judged changes nothing.
        liveness.refused(address("10.0.0.5:7070"));
        assert!(liveness.unheard_for() >= Duration::from_millis(39));
    }

    /// The set judged follows the endpoints' resolution: a new address has never refused, a
    /// kept one keeps its refusal, and an endpoint that did not resolve may hide live nodes.
    #[tokio::test]
    async fn refusals_follow_the_addresses_of_the_latest_pass() {
        let (a, b, c) = (
            address("10.0.0.1:7070"),
            address("10.0.0.2:7070"),
            address("[fd00::3]:7070"),
        );
        let liveness = Liveness::new();
        liveness.touch();
        tokio::time::sleep(Duration::from_millis(60)).await;
        // Nothing judged yet: no refusal can count.
        liveness.refused(a);
        assert!(liveness.unheard_for() >= Duration::from_millis(59));
        liveness.judge([a, b], false);
        liveness.refused(a);
        liveness.refused(b);
        assert!(liveness.unheard_for() < Duration::from_millis(30));
        // The record grows: c has not refused, so the count runs from the contact again.
        liveness.judge([a, b, c], false);
        assert!(liveness.unheard_for() >= Duration::from_millis(59));
        liveness.refused(c);
        assert!(liveness.unheard_for() < Duration::from_millis(30));
        // The record shrinks: the refusals of what stays still count.
        liveness.judge([b, c], false);
        assert!(liveness.unheard_for() < Duration::from_millis(30));
        // A name that did not resolve proves nothing about the nodes behind it.
        liveness.judge([b, c], true);
        assert!(liveness.unheard_for() >= Duration::from_millis(59));
        // Nothing resolving at all proves nothing either.
        liveness.judge([], false);
        assert!(liveness.unheard_for() >= Duration::from_millis(59));
    }
}
