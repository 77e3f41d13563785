//! The workers connected to this node, fed by their streams.
//!
//! A worker is known by its id, and an id has one live stream: a new stream replaces the
//! entry (a new connection number) only when the old one is gone (`ax_core::worker_scope::
//! takeover`: its connection closed, the same process reconnecting, or silence), and the old
//! stream's end does not remove the new one. The attempts in flight on each worker are tracked
//! here from dispatch to their final report, so a worker's load is exact between heartbeats, and
//! a stream's frames about them need no store read to be known as its own. A worker this node
//! asked to move (`spread`) takes no dispatch for a while: it is about to leave, and a dispatch
//! sent behind the request would only be withdrawn.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId};
use ax_core::worker_scope::{HeldStream, Takeover, takeover};

use crate::to_worker::{Outbox, ToWorker};

#[derive(Debug, Clone)]
pub struct WorkerProfile {
    pub id: String,
    pub version: String,
    pub hostname: String,
    pub labels: BTreeMap<String, String>,
    pub capacity: u32,
    pub started_at: Millis,
    /// The apps whose tasks its token lets it run; `None`: every app.
    pub apps: Option<Arc<[String]>>,
    /// The worker process's incarnation (empty: none given): the same value on a new stream is
    /// the same process reconnecting.
    pub incarnation: String,
}

/// Who holds a stream, as its connection said.
#[derive(Debug, Clone, Default)]
pub struct StreamInfo {
    /// The stream's address.
    pub remote: String,
    /// The name of its token (empty without authentication).
    pub token: String,
}

/// A stream registered: its connection number, and the clock its frames keep.
#[derive(Debug, Clone)]
pub struct Connected {
    pub connection: u64,
    /// When a frame was last received on the stream (ms); the stream's loop sets it.
    pub last_heard: Arc<AtomicI64>,
    /// How the previous stream of the id was judged gone, when there was one.
    pub took_over: Option<Takeover>,
}

/// The live stream that kept a Register out.
#[derive(Debug, Clone)]
pub struct Held {
    pub remote: String,
    pub heard_ms_ago: Millis,
}

struct Entry {
    profile: WorkerProfile,
    connection: u64,
    stream: StreamInfo,
    last_heard: Arc<AtomicI64>,
    outbox: Outbox,
    /// Attempts in flight, each with when its instance became ready (ms; 0 when unknown: an
    /// attempt the worker re-attached) until its start is reported, for the start latency.
    in_flight: HashMap<(InstanceId, Attempt), Millis>,
    /// Slots planned for attempts whose claim has not committed yet: they count against the
    /// capacity, but are not in flight (the backstop must not judge them before the store has them).
    reserved: HashSet<(InstanceId, Attempt)>,
    last_heartbeat: Millis,
    /// When the worker registered on this stream.
    connected_at: Millis,
    draining: bool,
    /// Until when the worker is left out of dispatch, after it was asked to move.
    moving_until: Option<Instant>,
}

impl Entry {
    fn moving(&self) -> bool {
        self.moving_until
            .is_some_and(|until| until > Instant::now())
    }

    /// Attempts in flight and slots reserved.
    fn load(&self) -> u32 {
        (self.in_flight.len() + self.reserved.len()) as u32
    }

    fn view(&self) -> WorkerView {
        WorkerView {
            profile: self.profile.clone(),
            running: self.load(),
            last_heartbeat: self.last_heartbeat,
            connected_at: self.connected_at,
            draining: self.draining,
        }
    }
}

/// A worker as dispatch sees it.
#[derive(Debug, Clone)]
pub struct WorkerSlot {
    pub id: String,
    /// The stream the slot was read from: a dispatch planned on it goes to that stream only.
    pub connection: u64,
    pub labels: BTreeMap<String, String>,
    /// The apps whose tasks its token lets it run; `None`: every app.
    pub apps: Option<Arc<[String]>>,
    pub capacity: u32,
    pub running: u32,
    pub accepting: bool,
}

impl WorkerSlot {
    /// The slot as placement weighs it.
    pub fn candidate(&self) -> ax_core::placement::Candidate<'_> {
        ax_core::placement::Candidate {
            id: &self.id,
            labels: &self.labels,
            apps: self.apps.as_deref(),
            capacity: self.capacity,
            running: self.running,
            accepting: self.accepting,
        }
    }
}

/// A worker as operators see it.
#[derive(Debug, Clone)]
pub struct WorkerView {
    pub profile: WorkerProfile,
    pub running: u32,
    pub last_heartbeat: Millis,
    /// When the worker registered on its current stream here.
    pub connected_at: Millis,
    pub draining: bool,
}

#[derive(Default)]
pub struct Registry {
    workers: Mutex<HashMap<String, Entry>>,
    next_connection: AtomicU64,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.workers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a (re)connected worker with the attempts it already runs and returns what
    /// later calls from this stream must present; or, when the id already has a live stream
    /// here that is not gone (see the module doc; `silent_after_ms` is the silence that counts
    /// as gone), leaves that stream be and answers where it is.
    pub fn connect(
        &self,
        profile: WorkerProfile,
        stream: StreamInfo,
        outbox: Outbox,
        running: impl IntoIterator<Item = (InstanceId, Attempt)>,
        now: Millis,
        silent_after_ms: Millis,
    ) -> Result<Connected, Held> {
        let mut workers = self.lock();
        let took_over = match workers.get(&profile.id) {
            Some(held) => {
                let verdict = takeover(
                    &HeldStream {
                        incarnation: &held.profile.incarnation,
                        last_heard: held.last_heard.load(Ordering::Relaxed),
                        closed: held.outbox.is_closed(),
                    },
                    &profile.incarnation,
                    now,
                    silent_after_ms,
                );
                if let Takeover::Refused { heard_ms_ago } = verdict {
                    return Err(Held {
                        remote: held.stream.remote.clone(),
                        heard_ms_ago,
                    });
                }
                Some(verdict)
            }
            None => None,
        };
        let connection = self.next_connection.fetch_add(1, Ordering::Relaxed) + 1;
        let last_heard = Arc::new(AtomicI64::new(now));
        let entry = Entry {
            profile: profile.clone(),
            connection,
            stream,
            last_heard: Arc::clone(&last_heard),
            outbox,
            in_flight: running.into_iter().map(|key| (key, 0)).collect(),
            reserved: HashSet::new(),
            last_heartbeat: now,
            connected_at: now,
            draining: false,
            moving_until: None,
        };
        workers.insert(profile.id, entry);
        Ok(Connected {
            connection,
            last_heard,
            took_over,
        })
    }

    /// Whether the attempt was dispatched to the worker on `connection` (or re-attached by
    /// it) and is still in flight there: a frame about it is the stream's own.
    pub fn in_flight_on(
        &self,
        worker: &str,
        connection: u64,
        instance: InstanceId,
        attempt: Attempt,
    ) -> bool {
        self.lock().get(worker).is_some_and(|entry| {
            entry.connection == connection && entry.in_flight.contains_key(&(instance, attempt))
        })
    }

    /// Who holds the worker's stream here (its address and token), for refusals' audit rows.
    pub fn stream_info(&self, worker: &str) -> Option<StreamInfo> {
        self.lock().get(worker).map(|entry| entry.stream.clone())
    }

    /// Forgets the worker if `connection` is still its current stream.
    pub fn disconnect(&self, worker: &str, connection: u64) -> bool {
        let mut workers = self.lock();
        if workers
            .get(worker)
            .is_some_and(|entry| entry.connection == connection)
        {
            workers.remove(worker);
            true
        } else {
            false
        }
    }

    pub fn heartbeat(&self, worker: &str, connection: u64, draining: bool, now: Millis) {
        if let Some(entry) = self.lock().get_mut(worker)
            && entry.connection == connection
        {
            entry.last_heartbeat = now;
            entry.draining = draining;
        }
    }

    pub fn slots(&self) -> Vec<WorkerSlot> {
        let mut slots: Vec<WorkerSlot> = self
            .lock()
            .values()
            .map(|entry| WorkerSlot {
                id: entry.profile.id.clone(),
                connection: entry.connection,
                labels: entry.profile.labels.clone(),
                apps: entry.profile.apps.clone(),
                capacity: entry.profile.capacity,
                running: entry.load(),
                accepting: !entry.draining && !entry.moving(),
            })
            .collect();
        // A stable order keeps round robin and tie-breaking deterministic.
        slots.sort_by(|a, b| a.id.cmp(&b.id));
        slots
    }

    pub fn views(&self) -> Vec<WorkerView> {
        let mut views: Vec<WorkerView> = self.lock().values().map(Entry::view).collect();
        views.sort_by(|a, b| a.profile.id.cmp(&b.profile.id));
        views
    }

    pub fn view(&self, worker: &str) -> Option<WorkerView> {
        self.lock().get(worker).map(Entry::view)
    }

    /// Forgets every worker, dropping the outboxes of their streams so the streams end (on
    /// shutdown: the server waits for open streams before it stops).
    pub fn disconnect_all(&self) {
        self.lock().clear();
    }

    /// Reserves a slot on the worker for an attempt about to be claimed, when its stream is still
    /// `connection`, it takes attempts and has a free slot: plans made on an older view of the
    /// slots (the dispatcher's pass, a placement inside a transaction) never send past its
    /// capacity. `begin_attempt` turns the reservation into an attempt in flight; `release`
    /// gives it back.
    pub fn reserve(
        &self,
        worker: &str,
        connection: u64,
        instance: InstanceId,
        attempt: Attempt,
    ) -> bool {
        let mut workers = self.lock();
        let Some(entry) = workers.get_mut(worker) else {
            return false;
        };
        let free = entry.load() < entry.profile.capacity;
        if entry.connection != connection || entry.draining || entry.moving() || !free {
            return false;
        }
        entry.reserved.insert((instance, attempt))
    }

    /// Gives back a reservation whose claim did not happen.
    pub fn release(&self, worker: &str, instance: InstanceId, attempt: Attempt) {
        if let Some(entry) = self.lock().get_mut(worker) {
            entry.reserved.remove(&(instance, attempt));
        }
    }

    /// Records an attempt as in flight on the worker (in place of its reservation, if any) and
    /// returns its outbox, or `None` when the worker is gone or `connection` is no longer its
    /// stream. A worker that reconnected meanwhile
    /// registered without this attempt and had it withdrawn; sending it there would start an
    /// attempt the store already moved past.
    pub fn begin_attempt(
        &self,
        worker: &str,
        connection: u64,
        instance: InstanceId,
        attempt: Attempt,
        ready_at: Millis,
    ) -> Option<Outbox> {
        let mut workers = self.lock();
        let entry = workers.get_mut(worker)?;
        entry.reserved.remove(&(instance, attempt));
        if entry.connection != connection || entry.moving() {
            return None;
        }
        entry.in_flight.insert((instance, attempt), ready_at);
        Some(entry.outbox.clone())
    }

    /// When the attempt's instance became ready, the first time its start is reported here;
    /// `None` after that, or when unknown.
    pub fn take_ready_at(
        &self,
        worker: &str,
        instance: InstanceId,
        attempt: Attempt,
    ) -> Option<Millis> {
        let mut workers = self.lock();
        let ready = workers
            .get_mut(worker)?
            .in_flight
            .get_mut(&(instance, attempt))?;
        (*ready > 0).then(|| std::mem::take(ready))
    }

    /// The attempt is no longer in flight on the worker (it ended, or was rejected).
    pub fn end_attempt(&self, worker: &str, instance: InstanceId, attempt: Attempt) {
        if let Some(entry) = self.lock().get_mut(worker) {
            entry.in_flight.remove(&(instance, attempt));
            entry.reserved.remove(&(instance, attempt));
        }
    }

    /// The worker's current outbox, to tell it something.
    pub fn outbox(&self, worker: &str) -> Option<Outbox> {
        self.lock().get(worker).map(|entry| entry.outbox.clone())
    }

    /// Tells the worker, if it is connected here, to kill the attempt's process (waiting for
    /// room when its queue is full); false when it is not connected here.
    pub fn tell_cancel(
        &self,
        worker: &str,
        instance: InstanceId,
        attempt: Attempt,
        reason: &str,
    ) -> bool {
        let Some(outbox) = self.outbox(worker) else {
            return false;
        };
        outbox.tell_even_when_full(ToWorker::Cancel {
            instance,
            attempt,
            reason: reason.to_string(),
        })
    }

    /// Every attempt in flight on a worker connected here, with its worker.
    pub fn in_flight(&self) -> Vec<(String, InstanceId, Attempt)> {
        self.lock()
            .values()
            .flat_map(|entry| {
                entry
                    .in_flight
                    .keys()
                    .map(|(instance, attempt)| (entry.profile.id.clone(), *instance, *attempt))
            })
            .collect()
    }

    /// Leaves the worker out of dispatch for `hold` and returns its outbox, to ask it to move;
    /// `None` when `connection` is no longer its stream. A worker that does not follow the
    /// request takes dispatches again after `hold`.
    pub fn ask_to_move(&self, worker: &str, connection: u64, hold: Duration) -> Option<Outbox> {
        let mut workers = self.lock();
        let entry = workers
            .get_mut(worker)
            .filter(|entry| entry.connection == connection)?;
        entry.moving_until = Some(Instant::now() + hold);
        Some(entry.outbox.clone())
    }

    /// Whether the worker on `connection` was asked to move and may still be leaving.
    pub fn moving(&self, worker: &str, connection: u64) -> bool {
        self.lock()
            .get(worker)
            .is_some_and(|entry| entry.connection == connection && entry.moving())
    }

    /// The request to move could not be sent: the worker takes dispatches again.
    pub fn stay(&self, worker: &str, connection: u64) {
        if let Some(entry) = self.lock().get_mut(worker)
            && entry.connection == connection
        {
            entry.moving_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(id: &str) -> WorkerProfile {
        WorkerProfile {
            id: id.into(),
            version: "test".into(),
            hostname: "host".into(),
            labels: BTreeMap::new(),
            capacity: 2,
            started_at: 0,
            apps: None,
            incarnation: String::new(),
        }
    }

    /// `id` as the worker process `incarnation`.
    fn process(id: &str, incarnation: &str) -> WorkerProfile {
        WorkerProfile {
            incarnation: incarnation.into(),
            ..profile(id)
        }
    }

    fn stream(incarnation: &str) -> StreamInfo {
        StreamInfo {
            remote: format!("10.0.0.1:{}", incarnation.len()),
            token: "workers".into(),
        }
    }

    /// Connects `id` as process `incarnation` at `now`; panics when refused.
    fn join(registry: &Registry, id: &str, incarnation: &str, tx: &Outbox, now: Millis) -> u64 {
        registry
            .connect(
                process(id, incarnation),
                stream(incarnation),
                tx.clone(),
                [],
                now,
                1_000,
            )
            .expect("connected")
            .connection
    }

    #[test]
    fn a_reconnect_replaces_the_entry_and_the_old_stream_cannot_remove_it() {
        let registry = Registry::new();
        let (tx, _rx) = crate::to_worker::outbox(1);
        let old = join(&registry, "w1", "p1", &tx, 0);
        let new = registry
            .connect(
                process("w1", "p1"),
                stream("p1"),
                tx,
                [(InstanceId(7), Attempt(1))],
                1,
                1_000,
            )
            .expect("the same process takes over at once")
            .connection;
        assert!(!registry.disconnect("w1", old));
        assert_eq!(registry.slots()[0].running, 1, "re-attached attempt counts");
        assert!(registry.disconnect("w1", new));
        assert!(registry.slots().is_empty());
    }

    #[test]
    fn a_second_live_stream_for_an_id_is_refused_until_the_first_is_gone() {
        let registry = Registry::new();
        let (first_tx, first_rx) = crate::to_worker::outbox(1);
        let first = join(&registry, "w1", "p1", &first_tx, 10_000);
        let (tx, rx) = crate::to_worker::outbox(1);
        // Another process, while the first was heard 400 ms ago: refused, the first kept.
        let held = registry
            .connect(
                process("w1", "p2"),
                stream("p2"),
                tx.clone(),
                [],
                10_400,
                1_000,
            )
            .expect_err("refused");
        assert_eq!(
            (held.remote.as_str(), held.heard_ms_ago),
            ("10.0.0.1:2", 400)
        );
        assert_eq!(registry.slots()[0].connection, first);
        assert!(
            registry
                .begin_attempt("w1", first, InstanceId(1), Attempt(1), 0)
                .is_some()
        );
        assert!(registry.in_flight_on("w1", first, InstanceId(1), Attempt(1)));
        assert!(!registry.in_flight_on("w1", first, InstanceId(1), Attempt(2)));
        assert!(!registry.in_flight_on("w1", first + 1, InstanceId(1), Attempt(1)));
        assert!(!registry.in_flight_on("w2", first, InstanceId(1), Attempt(1)));
        // Silent past the bound: taken over.
        let taken = registry
            .connect(process("w1", "p2"), stream("p2"), tx, [], 11_000, 1_000)
            .expect("silent: gone");
        assert_eq!(taken.took_over, Some(Takeover::Silent { for_ms: 1_000 }));
        assert!(
            !registry.disconnect("w1", first),
            "the old stream cannot remove it"
        );
        drop((first_tx, first_rx));
        // A frame keeps a stream live; a closed one is gone at once.
        taken.last_heard.store(20_000, Ordering::Relaxed);
        let (tx3, _rx3) = crate::to_worker::outbox(1);
        assert!(
            registry
                .connect(
                    process("w1", "p3"),
                    stream("p3"),
                    tx3.clone(),
                    [],
                    20_100,
                    1_000
                )
                .is_err()
        );
        drop(rx);
        let third = registry
            .connect(process("w1", "p3"), stream("p3"), tx3, [], 20_100, 1_000)
            .expect("p2's stream is closed");
        assert_eq!(third.took_over, Some(Takeover::Closed));
    }

    #[test]
    fn in_flight_attempts_make_the_load() {
        let registry = Registry::new();
        let (tx, _rx) = crate::to_worker::outbox(1);
        let conn = join(&registry, "w1", "p1", &tx, 0);
        assert!(
            registry
                .begin_attempt("w1", conn, InstanceId(1), Attempt(1), 0)
                .is_some()
        );
        assert!(
            registry
                .begin_attempt("w1", conn, InstanceId(2), Attempt(1), 0)
                .is_some()
        );
        assert!(
            registry
                .begin_attempt("nobody", conn, InstanceId(3), Attempt(1), 0)
                .is_none()
        );
        // Planned on an older stream of the worker: not sent to the new one.
        assert!(
            registry
                .begin_attempt("w1", conn - 1, InstanceId(4), Attempt(1), 0)
                .is_none()
        );
        assert_eq!(registry.slots()[0].running, 2);
        registry.end_attempt("w1", InstanceId(1), Attempt(1));
        registry.heartbeat("w1", conn, true, 5);
        let slot = &registry.slots()[0];
        assert_eq!((slot.running, slot.accepting), (1, false));
    }

    #[test]
    fn a_worker_asked_to_move_takes_no_dispatch_until_it_stays_or_the_hold_ends() {
        let registry = Registry::new();
        let (tx, _rx) = crate::to_worker::outbox(1);
        let conn = join(&registry, "w1", "p1", &tx, 0);
        assert!(
            registry
                .ask_to_move("w1", conn + 1, Duration::from_secs(60))
                .is_none(),
            "an older stream's worker is not asked"
        );
        assert!(
            registry
                .ask_to_move("w1", conn, Duration::from_secs(60))
                .is_some()
        );
        assert!(!registry.slots()[0].accepting);
        assert!(
            registry
                .begin_attempt("w1", conn, InstanceId(1), Attempt(1), 0)
                .is_none()
        );
        assert!(registry.moving("w1", conn));
        registry.stay("w1", conn);
        assert!(registry.slots()[0].accepting);
        assert!(!registry.moving("w1", conn));
        // A hold that is over: dispatches go to the worker again.
        registry.ask_to_move("w1", conn, Duration::ZERO);
        assert!(registry.slots()[0].accepting);
        assert!(
            registry
                .begin_attempt("w1", conn, InstanceId(1), Attempt(1), 0)
                .is_some()
        );
    }
}
