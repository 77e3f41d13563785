//! What the worker knows about its attempts, shared by the connection and the attempt runners.
//!
//! Everything a scheduler must eventually see (an `AttemptStarted`, log batches, an
//! `AttemptFinished`) is recorded here first and only then sent, if a stream is up. When a stream
//! breaks, the next connection replays whatever the old one may have lost, so a reconnect loses
//! nothing that is still in memory. A record remembers the connection ("epoch") it was last handed
//! to, which is how a replay avoids sending an item twice on one stream.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use ax_proto::v1::{
    AttemptFinished, AttemptRef, AttemptStarted, LogBatch, WorkerMessage, worker_message::Body,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How many finished attempt keys are remembered for duplicate detection after their reports are
/// dropped. A scheduler redispatches an attempt within seconds, so a large window is plenty.
const SEEN_CAPACITY: usize = 100_000;

/// Bytes charged per retained log line on top of its text, for the protobuf framing.
const LINE_OVERHEAD: usize = 16;

/// One attempt of one instance: the unit of deduplication and fencing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttemptKey {
    pub instance_id: i64,
    pub attempt: u32,
}

impl fmt::Display for AttemptKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.instance_id, self.attempt)
    }
}

impl From<&AttemptRef> for AttemptKey {
    fn from(r: &AttemptRef) -> Self {
        AttemptKey {
            instance_id: r.instance_id,
            attempt: r.attempt,
        }
    }
}

/// What the connection asks of a running attempt.
#[derive(Debug, Clone)]
pub enum Control {
    /// Kill the process group and report CANCELLED.
    Cancel { reason: String },
    /// Kill the process group and report nothing more: the scheduler no longer considers this
    /// attempt current (a refused report or a stale attempt after a reconnect).
    Kill,
    /// Kill the process group and report FAILED: the worker lost every scheduler for so long
    /// that the scheduler may already consider the attempt lost (self-fencing).
    Fence { reason: String },
}

/// The outgoing half of the current stream.
#[derive(Debug, Clone)]
pub struct Link {
    pub epoch: u64,
    pub tx: mpsc::Sender<WorkerMessage>,
    /// Cancelled when the connection ends, so a sender blocked on a full channel of a dead stream
    /// gives up; what it was sending stays recorded here and is replayed on the next stream.
    pub closed: CancellationToken,
}

impl Link {
    /// Sends one message; returns false if the stream is gone.
    pub async fn send(&self, message: WorkerMessage) -> bool {
        tokio::select! {
            result = self.tx.send(message) => result.is_ok(),
            () = self.closed.cancelled() => false,
        }
    }
}

/// The outcome of offering a dispatch to the worker.
#[derive(Debug)]
pub enum Admission {
    Accepted(mpsc::UnboundedReceiver<Control>),
    Duplicate,
    Rejected(String),
}

#[derive(Debug)]
struct RetainedBatch {
    batch: LogBatch,
    last_seq: u64,
    bytes: usize,
    /// A worker-wide counter, so that the oldest batch can be found when memory runs out.
    order: u64,
    sent_on: Option<u64>,
}

#[derive(Debug)]
struct FinishedReport {
    message: AttemptFinished,
    sent_on: Option<u64>,
    first_sent_at: Option<Instant>,
}

#[derive(Debug, Default)]
struct AttemptEntry {
    control: Option<mpsc::UnboundedSender<Control>>,
    started: Option<(AttemptStarted, Option<u64>)>,
    logs: VecDeque<RetainedBatch>,
    finished: Option<FinishedReport>,
    /// Set when the scheduler refused this attempt: it is killed and nothing more is reported.
    forgotten: bool,
}

impl AttemptEntry {
    fn running(&self) -> bool {
        self.finished.is_none()
    }
}

/// A bounded set of attempt keys, oldest forgotten first.
#[derive(Debug, Default)]
struct SeenSet {
    order: VecDeque<AttemptKey>,
    keys: HashSet<AttemptKey>,
}

impl SeenSet {
    fn insert(&mut self, key: AttemptKey) {
        if self.keys.insert(key) {
            self.order.push_back(key);
            while self.order.len() > SEEN_CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.keys.remove(&old);
                }
            }
        }
    }
}

#[derive(Debug, Default)]
struct State {
    link: Option<Link>,
    attempts: HashMap<AttemptKey, AttemptEntry>,
    seen: SeenSet,
    retained_bytes: usize,
    next_order: u64,
    dropped_batches: u64,
    draining: bool,
}

/// The worker's attempts, shared by the connection and the runners.
#[derive(Debug)]
pub struct Attempts {
    state: Mutex<State>,
    max_retained_bytes: usize,
}

impl Attempts {
    pub fn new(max_retained_bytes: usize) -> Self {
        Attempts {
            state: Mutex::new(State::default()),
            max_retained_bytes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock leaves plain data behind, still consistent enough to
        // report and drain, so a poisoned lock is used as is.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Admits a dispatch unless it is a duplicate, the worker is draining, or it is full.
    pub fn admit(&self, key: AttemptKey, capacity: u32) -> Admission {
        let mut state = self.lock();
        if state.attempts.contains_key(&key) || state.seen.keys.contains(&key) {
            return Admission::Duplicate;
        }
        if state.draining {
            return Admission::Rejected("worker is draining".into());
        }
        let running = state
            .attempts
            .values()
            .filter(|entry| entry.running())
            .count();
        if running >= capacity as usize {
            return Admission::Rejected(format!("worker is at capacity ({capacity})"));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        state.seen.insert(key);
        state.attempts.insert(
            key,
            AttemptEntry {
                control: Some(tx),
                ..AttemptEntry::default()
            },
        );
        Admission::Accepted(rx)
    }

    /// Undoes an admission whose acceptance could not be sent: the process was not started, and
    /// the scheduler may dispatch the attempt again.
    pub fn unadmit(&self, key: AttemptKey) {
        let mut state = self.lock();
        Self::remove(&mut state, key);
        if state.seen.keys.remove(&key) {
            state.seen.order.retain(|seen| *seen != key);
        }
    }

    pub fn running(&self) -> Vec<AttemptRef> {
        let state = self.lock();
        let mut refs: Vec<AttemptRef> = state
            .attempts
            .iter()
            .filter(|(_, entry)| entry.running() && !entry.forgotten)
            .map(|(key, _)| AttemptRef {
                instance_id: key.instance_id,
                attempt: key.attempt,
            })
            .collect();
        refs.sort_by_key(|r| (r.instance_id, r.attempt));
        refs
    }

    pub fn running_count(&self) -> usize {
        self.lock()
            .attempts
            .values()
            .filter(|entry| entry.running())
            .count()
    }

    pub fn set_draining(&self) {
        self.lock().draining = true;
    }

    pub fn draining(&self) -> bool {
        self.lock().draining
    }

    /// The current stream, for messages that are not worth replaying (heartbeats).
    pub fn link(&self) -> Option<Link> {
        self.lock().link.clone()
    }

    /// Records that the attempt's process started; returns the stream to send it on, if any.
    pub fn started(
        &self,
        key: AttemptKey,
        message: AttemptStarted,
    ) -> Option<(Link, WorkerMessage)> {
        let mut state = self.lock();
        let link = state.link.clone();
        let entry = state.attempts.get_mut(&key)?;
        if entry.forgotten {
            return None;
        }
        let epoch = link.as_ref().map(|link| link.epoch);
        entry.started = Some((message, epoch));
        Some((link?, wrap(Body::Started(message))))
    }

    /// Records a log batch until the scheduler acknowledges it; returns the stream to send it on.
    pub fn logs(&self, key: AttemptKey, batch: LogBatch) -> Option<(Link, WorkerMessage)> {
        let mut state = self.lock();
        let link = state.link.clone();
        let order = state.next_order;
        state.next_order += 1;
        let entry = state.attempts.get_mut(&key)?;
        if entry.forgotten {
            return None;
        }
        let bytes: usize = batch
            .lines
            .iter()
            .map(|line| line.text.len() + LINE_OVERHEAD)
            .sum();
        let last_seq = batch.first_seq + batch.lines.len() as u64 - 1;
        entry.logs.push_back(RetainedBatch {
            batch: batch.clone(),
            last_seq,
            bytes,
            order,
            sent_on: link.as_ref().map(|link| link.epoch),
        });
        state.retained_bytes += bytes;
        self.enforce_memory_limit(&mut state);
        Some((link?, wrap(Body::Logs(batch))))
    }

    /// Drops the oldest unacknowledged batches while more than the limit is retained. Those lines
    /// are lost if the stream they were sent on broke; keeping them on disk is future work.
    fn enforce_memory_limit(&self, state: &mut State) {
        while state.retained_bytes > self.max_retained_bytes {
            let oldest = state
                .attempts
                .iter()
                .filter_map(|(key, entry)| entry.logs.front().map(|batch| (batch.order, *key)))
                .min();
            let Some((_, key)) = oldest else { break };
            let Some(batch) = state
                .attempts
                .get_mut(&key)
                .and_then(|entry| entry.logs.pop_front())
            else {
                break;
            };
            state.retained_bytes -= batch.bytes;
            state.dropped_batches += 1;
            tracing::warn!(
                instance = key.instance_id,
                attempt = key.attempt,
                first_seq = batch.batch.first_seq,
                last_seq = batch.last_seq,
                limit_bytes = self.max_retained_bytes,
                "unacknowledged log lines exceed the memory limit; dropping the oldest batch \
                 (lines are lost if its stream broke)"
            );
        }
    }

    /// Records how the attempt ended; returns the stream to send the report on.
    pub fn finished(
        &self,
        key: AttemptKey,
        message: AttemptFinished,
    ) -> Option<(Link, WorkerMessage)> {
        let mut state = self.lock();
        let link = state.link.clone();
        let entry = state.attempts.get_mut(&key)?;
        entry.control = None;
        if entry.forgotten {
            Self::remove(&mut state, key);
            return None;
        }
        entry.finished = Some(FinishedReport {
            message: message.clone(),
            sent_on: link.as_ref().map(|link| link.epoch),
            first_sent_at: link.as_ref().map(|_| Instant::now()),
        });
        Some((link?, wrap(Body::Finished(message))))
    }

    fn remove(state: &mut State, key: AttemptKey) {
        if let Some(entry) = state.attempts.remove(&key) {
            state.retained_bytes -= entry.logs.iter().map(|batch| batch.bytes).sum::<usize>();
        }
    }

    /// Asks a running attempt to stop; returns false if it is not running here.
    pub fn cancel(&self, key: AttemptKey, reason: String) -> bool {
        let state = self.lock();
        match state
            .attempts
            .get(&key)
            .and_then(|entry| entry.control.as_ref())
        {
            Some(control) => control.send(Control::Cancel { reason }).is_ok(),
            None => false,
        }
    }

    /// Forgets an attempt the scheduler no longer considers current: a running process is killed
    /// and its reports are dropped; a finished one's retained report and logs are dropped.
    pub fn forget(&self, key: AttemptKey, kill: bool) {
        let mut state = self.lock();
        let Some(entry) = state.attempts.get_mut(&key) else {
            return;
        };
        match &entry.control {
            Some(control) if kill => {
                entry.forgotten = true;
                let _ = control.send(Control::Kill);
                let freed: usize = entry.logs.drain(..).map(|batch| batch.bytes).sum();
                state.retained_bytes -= freed;
            }
            // Without kill the process is left alone; its later reports will be refused again.
            Some(_) => {}
            None => Self::remove(&mut state, key),
        }
    }

    /// Asks every running attempt to fence itself; returns how many were asked.
    pub fn fence_all(&self, reason: &str) -> usize {
        let state = self.lock();
        state
            .attempts
            .values()
            .filter_map(|entry| entry.control.as_ref())
            .filter(|control| {
                control
                    .send(Control::Fence {
                        reason: reason.to_string(),
                    })
                    .is_ok()
            })
            .count()
    }

    /// The scheduler stored every line up to `seq`.
    pub fn ack(&self, key: AttemptKey, seq: u64) {
        let mut state = self.lock();
        let Some(entry) = state.attempts.get_mut(&key) else {
            return;
        };
        let mut freed = 0;
        while entry
            .logs
            .front()
            .is_some_and(|batch| batch.last_seq <= seq)
        {
            if let Some(batch) = entry.logs.pop_front() {
                freed += batch.bytes;
            }
        }
        state.retained_bytes -= freed;
    }

    /// Drops the finished reports that were sent longer than `retention` ago. Until then a report
    /// is replayed on every new stream, because a report sent just before a stream broke may never
    /// have arrived; the scheduler treats a repeated report of a terminal attempt as a no-op.
    pub fn prune(&self, retention: Duration) {
        let mut state = self.lock();
        let now = Instant::now();
        let expired: Vec<AttemptKey> = state
            .attempts
            .iter()
            .filter(|(_, entry)| {
                entry
                    .finished
                    .as_ref()
                    .and_then(|report| report.first_sent_at)
                    .is_some_and(|sent| now.duration_since(sent) >= retention)
            })
            .map(|(key, _)| *key)
            .collect();
        for key in expired {
            Self::remove(&mut state, key);
        }
    }

    /// Collects what the stream `link` has not seen yet (in per-attempt order: started, logs,
    /// finished) and marks it as sent on it. When there is nothing left, installs `link` as the
    /// current stream, in the same critical section, so no runner's message slips in between.
    pub fn replay_or_install(&self, link: &Link) -> Vec<WorkerMessage> {
        let mut state = self.lock();
        let epoch = link.epoch;
        let now = Instant::now();
        let mut out = Vec::new();
        for entry in state.attempts.values_mut() {
            if entry.forgotten {
                continue;
            }
            if let Some((started, sent_on)) = &mut entry.started
                && *sent_on != Some(epoch)
            {
                *sent_on = Some(epoch);
                out.push(wrap(Body::Started(*started)));
            }
            for batch in entry
                .logs
                .iter_mut()
                .filter(|batch| batch.sent_on != Some(epoch))
            {
                batch.sent_on = Some(epoch);
                out.push(wrap(Body::Logs(batch.batch.clone())));
            }
            if let Some(report) = &mut entry.finished
                && report.sent_on != Some(epoch)
            {
                report.sent_on = Some(epoch);
                report.first_sent_at.get_or_insert(now);
                out.push(wrap(Body::Finished(report.message.clone())));
            }
        }
        if out.is_empty() {
            state.link = Some(link.clone());
        }
        out
    }

    /// Removes `epoch`'s stream as the current one.
    pub fn detach(&self, epoch: u64) {
        let mut state = self.lock();
        if state.link.as_ref().is_some_and(|link| link.epoch == epoch) {
            state.link = None;
        }
    }

    /// True when nothing runs and every finished report was handed to some stream.
    pub fn all_reported(&self) -> bool {
        let state = self.lock();
        state.attempts.values().all(|entry| {
            entry
                .finished
                .as_ref()
                .is_some_and(|report| report.sent_on.is_some())
        })
    }

    /// True when every retained log line has been acknowledged.
    pub fn all_acked(&self) -> bool {
        self.lock()
            .attempts
            .values()
            .all(|entry| entry.logs.is_empty())
    }

    /// Bytes of log lines kept until acknowledged.
    #[cfg(test)]
    pub fn retained_bytes(&self) -> usize {
        self.lock().retained_bytes
    }
}

fn wrap(body: Body) -> WorkerMessage {
    WorkerMessage { body: Some(body) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_proto::v1::{LogLine, LogStream};

    fn key(attempt: u32) -> AttemptKey {
        AttemptKey {
            instance_id: 7,
            attempt,
        }
    }

    fn batch(first_seq: u64, lines: usize, width: usize) -> LogBatch {
        LogBatch {
            instance_id: 7,
            attempt: 1,
            first_seq,
            lines: (0..lines)
                .map(|_| LogLine {
                    stream: LogStream::Stdout as i32,
                    text: "x".repeat(width),
                })
                .collect(),
            sent_at_ms: 0,
        }
    }

    fn link(epoch: u64) -> (Link, mpsc::Receiver<WorkerMessage>) {
        let (tx, rx) = mpsc::channel(16);
        (
            Link {
                epoch,
                tx,
                closed: CancellationToken::new(),
            },
            rx,
        )
    }

    #[test]
    fn admission_dedupes_and_respects_capacity_and_draining() {
        let attempts = Attempts::new(1 << 20);
        assert!(matches!(attempts.admit(key(1), 1), Admission::Accepted(_)));
        assert!(matches!(attempts.admit(key(1), 1), Admission::Duplicate));
        assert!(matches!(attempts.admit(key(2), 1), Admission::Rejected(_)));
        attempts.finished(key(1), AttemptFinished::default());
        attempts.forget(key(1), false);
        // The report is gone, but the attempt is still remembered as seen.
        assert!(matches!(attempts.admit(key(1), 1), Admission::Duplicate));
        attempts.set_draining();
        assert!(matches!(attempts.admit(key(3), 1), Admission::Rejected(_)));
    }

    #[test]
    fn replay_sends_unacknowledged_items_once_per_stream() {
        let attempts = Attempts::new(1 << 20);
        let _control = attempts.admit(key(1), 1);
        assert!(
            attempts
                .started(key(1), AttemptStarted::default())
                .is_none()
        );
        assert!(attempts.logs(key(1), batch(1, 2, 3)).is_none());
        assert!(attempts.logs(key(1), batch(3, 2, 3)).is_none());
        let (first, _rx) = link(1);
        assert_eq!(attempts.replay_or_install(&first).len(), 3);
        assert_eq!(attempts.replay_or_install(&first).len(), 0);
        assert!(attempts.logs(key(1), batch(5, 1, 3)).is_some());
        attempts.ack(key(1), 2);
        attempts.detach(1);
        let (second, _rx) = link(2);
        // Started again, batches 3..4 and 5; batch 1..2 was acknowledged.
        let replay = attempts.replay_or_install(&second);
        let seqs: Vec<u64> = replay
            .iter()
            .filter_map(|m| match &m.body {
                Some(Body::Logs(batch)) => Some(batch.first_seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [3, 5]);
        assert_eq!(replay.len(), 3);
    }

    #[test]
    fn memory_limit_drops_the_oldest_batches() {
        let attempts = Attempts::new(3 * (100 + LINE_OVERHEAD));
        let _control = attempts.admit(key(1), 1);
        for seq in 1..=5 {
            attempts.logs(key(1), batch(seq, 1, 100));
        }
        assert_eq!(attempts.retained_bytes(), 3 * (100 + LINE_OVERHEAD));
        let (first, _rx) = link(1);
        let seqs: Vec<u64> = attempts
            .replay_or_install(&first)
            .iter()
            .filter_map(|m| match &m.body {
                Some(Body::Logs(batch)) => Some(batch.first_seq),
                _ => None,
            })
            .collect();
        assert_eq!(seqs, [3, 4, 5]);
    }

    #[test]
    fn forgetting_a_running_attempt_kills_it_and_drops_its_reports() {
        let attempts = Attempts::new(1 << 20);
        let Admission::Accepted(mut control) = attempts.admit(key(1), 1) else {
            panic!()
        };
        attempts.logs(key(1), batch(1, 1, 10));
        attempts.forget(key(1), true);
        assert!(matches!(control.try_recv(), Ok(Control::Kill)));
        assert_eq!(attempts.retained_bytes(), 0);
        assert!(
            attempts
                .finished(key(1), AttemptFinished::default())
                .is_none()
        );
        assert!(attempts.all_reported());
        assert!(attempts.running().is_empty());
    }
}
