//! What the worker knows about its attempts, shared by the connection and the attempt runners.
//!
//! Everything a scheduler must eventually see (an `AttemptStarted`, log batches, an
//! `AttemptFinished`) is recorded here first and only then sent, if a stream is up. Log batches
//! are recorded by their attempt's runner and sent by its log shipper (`runner`), so a task's
//! output is read at the pipe's speed, not the stream's. When a stream
//! breaks, the next connection replays whatever the old one may have lost, so a reconnect loses
//! nothing that is still recorded. A record remembers the connection ("epoch") it was last handed
//! to, which is how a replay avoids sending an item twice on one stream.
//!
//! Unacknowledged log batches are kept in memory up to a bound across all attempts. A batch that
//! does not fit sends its attempt into spill mode: the attempt's batches in memory move to its
//! spill file (see `spill`), and every later batch of the attempt is appended there too, so that
//! the file always holds the attempt's oldest unacknowledged lines in order. Once the scheduler
//! acknowledges the whole file it is deleted and the attempt returns to memory.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ax_proto::v1::{
    AttemptFinished, AttemptRef, AttemptStarted, WorkerMessage, worker_message::Body,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ends::{EndJournal, EndRecord, JournalError, KeptBatch};
use crate::logs::LogFrame;
use crate::outgoing::Outgoing;
use crate::spill::{LogStats, SpillError, SpillFile};

/// How many finished attempt keys are remembered for duplicate detection after their reports are
/// dropped. A scheduler redispatches an attempt within seconds, so a large window is plenty.
const SEEN_CAPACITY: usize = 100_000;

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
    pub tx: mpsc::Sender<Outgoing>,
    /// Cancelled when the connection ends, so a sender blocked on a full channel of a dead stream
    /// gives up; what it was sending stays recorded here and is replayed on the next stream.
    pub closed: CancellationToken,
}

impl Link {
    /// Sends one message; returns false if the stream is gone.
    pub async fn send(&self, message: impl Into<Outgoing>) -> bool {
        tokio::select! {
            result = self.tx.send(message.into()) => result.is_ok(),
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

/// One item of a replay on a new stream.
#[derive(Debug)]
pub enum Replay {
    Message(Outgoing),
    /// Send the unsent batches of this attempt's spill file with [`Attempts::take_unsent`].
    Spilled(AttemptKey),
}

#[derive(Debug)]
struct RetainedBatch {
    frame: LogFrame,
    sent_on: Option<u64>,
}

impl RetainedBatch {
    fn bytes(&self) -> usize {
        self.frame.bytes.len()
    }
}

#[derive(Debug)]
struct FinishedReport {
    message: AttemptFinished,
    sent_on: Option<u64>,
    first_sent_at: Option<Instant>,
    /// When it was last handed to a stream: an end unanswered on a live stream for
    /// [`END_RESEND_AFTER`] is sent on it again ([`Attempts::ends_to_resend`]).
    last_sent_at: Option<Instant>,
    /// The scheduler stored it (FinishedAck): never resent.
    acked: bool,
}

/// How long an end may go unanswered (neither acknowledged nor refused) on a live stream before
/// it is sent on that stream again. A node answers every end it stores or refuses within its
/// report batch (milliseconds; seconds through a database's commit stall), so an end unanswered
/// this long was lost inside the node; waiting for the stream to break would leave its attempt
/// RUNNING for as long as the stream lives. A repeated end is acknowledged as the one stored.
pub(crate) const END_RESEND_AFTER: Duration = Duration::from_secs(15);

#[derive(Debug, Default)]
struct AttemptEntry {
    control: Option<mpsc::UnboundedSender<Control>>,
    started: Option<(AttemptStarted, Option<u64>)>,
    /// Unacknowledged batches in memory, oldest first; empty while `spill` is set.
    logs: VecDeque<RetainedBatch>,
    /// The attempt's oldest unacknowledged batches on disk, when memory ran out.
    spill: Option<SpillFile>,
    finished: Option<FinishedReport>,
    /// Set when the scheduler refused this attempt: it is killed and nothing more is reported.
    forgotten: bool,
    /// Its process is held outside the worker (`held`), and outlives it.
    held: bool,
    /// The last line the scheduler acknowledged.
    acked_seq: u64,
}

impl AttemptEntry {
    fn running(&self) -> bool {
        self.finished.is_none()
    }

    /// Ended, and the scheduler has both its report and its lines: nothing is left to keep.
    fn settled(&self) -> bool {
        self.finished.as_ref().is_some_and(|report| report.acked)
            && self.logs.is_empty()
            && self.spill.is_none()
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
    /// Running attempts, and finished ones until their report is pruned (minutes: thousands of
    /// entries on a busy worker), so nothing on a per-task path may walk it.
    attempts: HashMap<AttemptKey, AttemptEntry>,
    /// How many of `attempts` are running.
    running: usize,
    /// The attempts that have a spill file.
    spilling: HashSet<AttemptKey>,
    /// The worker stops without waiting for its running held attempts: its next process takes
    /// them back.
    handing_over: bool,
    seen: SeenSet,
    retained_bytes: usize,
    /// The newest stream that replayed or was installed.
    newest_epoch: u64,
    draining: bool,
    /// Ends acknowledged within [`RECENT_ENDS_KEPT`], oldest first, offered again to every new
    /// stream ([`Attempts::unacknowledged`], [`Attempts::replay_or_install`]).
    recent_ends: VecDeque<RecentEnd>,
}

/// How long an acknowledged end is offered again to the next stream. A node acknowledges an end
/// once its database server committed it; a member of a multi-primary cluster that dies a moment
/// later may take such a commit with it (seen with Galera under kill -9: the other members never
/// had it), and the node the worker registers with next would end the attempt lost and run it
/// again. Offered again, the end is stored if it is missing, and acknowledged as a duplicate if
/// not. Kept in memory only.
const RECENT_ENDS_KEPT: Duration = Duration::from_secs(30);
/// At most this many recent ends are kept (a busy worker's last few seconds).
const RECENT_ENDS_MAX: usize = 2_048;

#[derive(Debug)]
struct RecentEnd {
    acked_at: Instant,
    key: AttemptKey,
    message: AttemptFinished,
    sent_on: Option<u64>,
}

impl State {
    fn prune_recent_ends(&mut self, now: Instant) {
        while self.recent_ends.front().is_some_and(|end| {
            now.duration_since(end.acked_at) >= RECENT_ENDS_KEPT
                || self.recent_ends.len() > RECENT_ENDS_MAX
        }) {
            self.recent_ends.pop_front();
        }
    }
}

/// The worker's attempts, shared by the connection and the runners.
#[derive(Debug)]
pub struct Attempts {
    state: Mutex<State>,
    max_retained_bytes: usize,
    max_spilled_bytes: u64,
    spill_dir: PathBuf,
    stats: Arc<LogStats>,
    /// Where ends are kept until settled; `None` in tests that do not restart.
    journal: Option<EndJournal>,
}

impl Attempts {
    pub fn new(
        max_retained_bytes: usize,
        max_spilled_bytes: u64,
        spill_dir: PathBuf,
        stats: Arc<LogStats>,
    ) -> Self {
        Attempts {
            state: Mutex::new(State::default()),
            max_retained_bytes,
            max_spilled_bytes,
            spill_dir,
            stats,
            journal: None,
        }
    }

    /// Keeps every end in `journal` until it is settled.
    pub(crate) fn with_journal(mut self, journal: EndJournal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Takes back the ends an earlier process under this worker id kept in its journal: each is
    /// a finished attempt whose started, unacknowledged lines and end are sent on the next
    /// stream, as if this process had run it.
    pub(crate) fn restore(&self, records: Vec<EndRecord>) {
        let mut guard = self.lock();
        let state = &mut *guard;
        for record in records {
            let key = record.key();
            let Some(finished) = record.finished else {
                continue;
            };
            let spill = if record.spill_path.is_empty() {
                None
            } else {
                match SpillFile::reopen(PathBuf::from(&record.spill_path), &record.spilled) {
                    Ok(spill) => Some(spill),
                    Err(error) => {
                        tracing::warn!(%key, %error, "cannot reopen the spill file kept with an end; its lines are lost");
                        None
                    }
                }
            };
            let logs: VecDeque<RetainedBatch> = record
                .batches
                .into_iter()
                .map(|batch| RetainedBatch {
                    frame: LogFrame {
                        first_seq: batch.first_seq,
                        last_seq: batch.last_seq,
                        bytes: batch.frame,
                    },
                    sent_on: None,
                })
                .collect();
            state.retained_bytes += logs.iter().map(RetainedBatch::bytes).sum::<usize>();
            if spill.is_some() {
                state.spilling.insert(key);
            }
            state.seen.insert(key);
            state.attempts.insert(
                key,
                AttemptEntry {
                    control: None,
                    started: record.started.map(|started| (started, None)),
                    logs,
                    spill,
                    finished: Some(FinishedReport {
                        message: finished,
                        sent_on: None,
                        first_sent_at: None,
                        last_sent_at: None,
                        acked: false,
                    }),
                    forgotten: false,
                    held: false,
                    acked_seq: 0,
                },
            );
        }
        self.stats.set_retained(state.retained_bytes);
    }

    /// Keeps `report` with what else the attempt still owes a scheduler (its started and its
    /// unacknowledged lines) in the ends journal; the answer comes once it is on disk. `None`
    /// when there is no journal or the attempt is not here any more.
    pub(crate) fn keep_end(
        &self,
        key: AttemptKey,
        report: &AttemptFinished,
    ) -> Option<tokio::sync::oneshot::Receiver<Result<(), JournalError>>> {
        let journal = self.journal.as_ref()?;
        let (record, spill_file) = {
            let state = self.lock();
            let entry = state.attempts.get(&key)?;
            if entry.forgotten {
                return None;
            }
            let (spilled, spill_file) = match &entry.spill {
                Some(spill) => {
                    let (index, file) = spill.index();
                    (index, Some((spill.path().to_path_buf(), file)))
                }
                None => (Vec::new(), None),
            };
            let record = EndRecord {
                instance_id: key.instance_id,
                attempt: key.attempt,
                settled: false,
                started: entry.started.as_ref().map(|(started, _)| *started),
                finished: Some(report.clone()),
                batches: entry
                    .logs
                    .iter()
                    .map(|batch| KeptBatch {
                        first_seq: batch.frame.first_seq,
                        last_seq: batch.frame.last_seq,
                        frame: batch.frame.bytes.clone(),
                    })
                    .collect(),
                spill_path: spill_file
                    .as_ref()
                    .map(|(path, _)| path.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                spilled,
            };
            (record, spill_file)
        };
        // The spilled lines must be on disk before the end that points at them.
        if let Some((path, file)) = spill_file
            && let Err(error) = file.and_then(|file| file.sync_data())
        {
            tracing::warn!(%key, path = %path.display(), %error, "cannot sync the spill file of an ending attempt");
        }
        Some(journal.append(&record))
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
        if state.running >= capacity as usize {
            return Admission::Rejected(format!("worker is at capacity ({capacity})"));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        state.seen.insert(key);
        state.running += 1;
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
        self.remove(&mut state, key);
        if state.seen.keys.remove(&key) {
            state.seen.order.retain(|seen| *seen != key);
        }
    }

    /// Attempts whose process runs now (Register.running).
    pub fn running(&self) -> Vec<AttemptRef> {
        self.refs(|entry| entry.running())
    }

    /// Attempts that ended here whose report the scheduler has neither acknowledged nor
    /// refused, and those acknowledged within [`RECENT_ENDS_KEPT`] (Register.finished): their
    /// reports follow on the next stream.
    pub fn unacknowledged(&self) -> Vec<AttemptRef> {
        let mut refs =
            self.refs(|entry| entry.finished.as_ref().is_some_and(|report| !report.acked));
        let mut state = self.lock();
        state.prune_recent_ends(Instant::now());
        refs.extend(state.recent_ends.iter().map(|end| AttemptRef {
            instance_id: end.key.instance_id,
            attempt: end.key.attempt,
        }));
        refs.sort_by_key(|r| (r.instance_id, r.attempt));
        refs.dedup_by_key(|r| (r.instance_id, r.attempt));
        refs
    }

    /// The attempts not forgotten that `keep` selects, in (instance, attempt) order.
    fn refs(&self, keep: impl Fn(&AttemptEntry) -> bool) -> Vec<AttemptRef> {
        let state = self.lock();
        let mut refs: Vec<AttemptRef> = state
            .attempts
            .iter()
            .filter(|(_, entry)| !entry.forgotten && keep(entry))
            .map(|(key, _)| AttemptRef {
                instance_id: key.instance_id,
                attempt: key.attempt,
            })
            .collect();
        refs.sort_by_key(|r| (r.instance_id, r.attempt));
        refs
    }

    /// The scheduler stored the attempt's end (FinishedAck): its report is not resent, and the
    /// attempt is forgotten once its lines are acknowledged too (it stays known as seen, so a
    /// repeated dispatch is still a duplicate).
    pub fn finished_acked(&self, key: AttemptKey) {
        let mut state = self.lock();
        let Some(entry) = state.attempts.get_mut(&key) else {
            return;
        };
        let Some(report) = entry.finished.as_mut() else {
            return;
        };
        report.acked = true;
        let message = report.message.clone();
        if entry.settled() {
            self.remove(&mut state, key);
        }
        let now = Instant::now();
        state.recent_ends.push_back(RecentEnd {
            acked_at: now,
            key,
            message,
            sent_on: None,
        });
        state.prune_recent_ends(now);
    }

    pub fn running_count(&self) -> usize {
        self.lock().running
    }

    /// Running attempts a stopping worker waits for: all of them, but for held ones when it
    /// hands them over.
    pub fn awaited_count(&self) -> usize {
        let state = self.lock();
        if !state.handing_over {
            return state.running;
        }
        state
            .attempts
            .values()
            .filter(|entry| awaited(&state, entry) && entry.running())
            .count()
    }

    pub fn set_draining(&self) {
        self.lock().draining = true;
    }

    /// Drains, leaving running held attempts to the worker's next process.
    pub fn set_handing_over(&self) {
        let mut state = self.lock();
        state.draining = true;
        state.handing_over = true;
    }

    /// Marks a running attempt as held (its process outlives the worker).
    pub(crate) fn hold(&self, key: AttemptKey) {
        if let Some(entry) = self.lock().attempts.get_mut(&key) {
            entry.held = true;
        }
    }

    /// The last line of the attempt the scheduler acknowledged (0: none, or not here).
    pub(crate) fn acked_seq(&self, key: AttemptKey) -> u64 {
        self.lock()
            .attempts
            .get(&key)
            .map_or(0, |entry| entry.acked_seq)
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

    /// Records a log batch until the scheduler acknowledges it, in memory while it fits and in
    /// the attempt's spill file otherwise; the attempt's shipper sends it with
    /// [`Attempts::take_unsent`]. Returns false when the batch was not kept (a forgotten attempt,
    /// or a spill file that cannot be written).
    pub fn logs(&self, key: AttemptKey, frame: LogFrame) -> bool {
        let mut guard = self.lock();
        let state = &mut *guard;
        let Some(entry) = state.attempts.get_mut(&key) else {
            return false;
        };
        if entry.forgotten {
            return false;
        }
        let bytes = frame.bytes.len();
        if entry.spill.is_none() && state.retained_bytes + bytes <= self.max_retained_bytes {
            entry.logs.push_back(RetainedBatch {
                frame,
                sent_on: None,
            });
            state.retained_bytes += bytes;
            self.stats.set_retained(state.retained_bytes);
            return true;
        }
        if entry.spill.is_none() {
            match self.start_spill(key, entry, state.newest_epoch) {
                Ok(freed) => {
                    state.spilling.insert(key);
                    state.retained_bytes -= freed;
                    self.stats.set_retained(state.retained_bytes);
                }
                Err(error) => {
                    self.drop_batch(
                        key,
                        &frame,
                        &error,
                        "unacknowledged log lines exceed the memory limit and cannot be spilled",
                    );
                    return false;
                }
            }
        }
        let Some(spill) = entry.spill.as_mut() else {
            return false;
        };
        match spill.append(&frame) {
            Ok(()) => {
                self.stats.count_spilled();
                true
            }
            Err(error) => {
                self.drop_batch(key, &frame, &error, "writing to the spill file failed");
                false
            }
        }
    }

    /// Whether `key`'s runner may read and record more lines: false once the spill files hold
    /// the worker's budget of unacknowledged bytes and the attempt's next batch would go to disk.
    /// (One batch may overshoot the budget.)
    pub fn has_log_room(&self, key: AttemptKey) -> bool {
        let state = self.lock();
        let in_memory = state
            .attempts
            .get(&key)
            .is_some_and(|entry| entry.spill.is_none());
        if in_memory && state.retained_bytes < self.max_retained_bytes {
            return true;
        }
        let spilled: u64 = state
            .spilling
            .iter()
            .filter_map(|key| state.attempts.get(key)?.spill.as_ref())
            .map(SpillFile::unacked_bytes)
            .sum();
        spilled < self.max_spilled_bytes
    }

    /// Counts and reports a batch the worker could neither keep in memory nor spill.
    fn drop_batch(
        &self,
        key: AttemptKey,
        frame: &LogFrame,
        error: &dyn std::fmt::Display,
        why: &str,
    ) {
        self.stats.count_error();
        self.stats.count_dropped();
        tracing::warn!(
            instance = key.instance_id,
            attempt = key.attempt,
            first_seq = frame.first_seq,
            last_seq = frame.last_seq,
            %error,
            "{why}; dropping the batch"
        );
    }

    /// Puts an attempt into spill mode: creates its spill file and moves its batches in memory
    /// there, keeping what the newest stream already saw marked as sent on it. Returns the bytes
    /// freed in memory. On failure nothing changes.
    fn start_spill(
        &self,
        key: AttemptKey,
        entry: &mut AttemptEntry,
        newest_epoch: u64,
    ) -> Result<usize, SpillError> {
        let mut spill = SpillFile::create(&self.spill_dir, key)?;
        // The batches the newest stream saw are a prefix: a replay hands over everything unsent
        // before the stream is installed, and only then do runners send directly.
        let sent_prefix = entry
            .logs
            .iter()
            .take_while(|retained| retained.sent_on == Some(newest_epoch))
            .count();
        for (index, retained) in entry.logs.iter().enumerate() {
            if let Err(error) = spill.append(&retained.frame) {
                if let Err(error) = spill.delete() {
                    tracing::warn!(%error, "deleting a half-written spill file failed");
                }
                return Err(error);
            }
            self.stats.count_spilled();
            if index + 1 == sent_prefix {
                spill.mark_all_sent(newest_epoch);
            }
        }
        tracing::info!(
            instance = key.instance_id,
            attempt = key.attempt,
            path = %spill.path().display(),
            limit_bytes = self.max_retained_bytes,
            "unacknowledged log lines exceed the memory limit; spilling this attempt's lines to disk"
        );
        entry.spill = Some(spill);
        Ok(entry.logs.drain(..).map(|retained| retained.bytes()).sum())
    }

    /// The next log batch of `key` that stream `epoch` has not seen (in memory or in its spill
    /// file), marked as sent on it; `None` when there is none, or when `epoch` is not the newest
    /// stream (a shipper still holding a dead one must not mark batches as sent on it).
    pub fn take_unsent(&self, key: AttemptKey, epoch: u64) -> Option<Outgoing> {
        let mut guard = self.lock();
        let state = &mut *guard;
        if epoch != state.newest_epoch {
            return None;
        }
        let entry = state.attempts.get_mut(&key)?;
        if entry.forgotten {
            return None;
        }
        if entry.spill.is_none() {
            // The batches sent on `epoch` are a prefix: a replay hands over everything before the
            // stream is installed, and shippers send in order after that.
            let retained = entry
                .logs
                .iter_mut()
                .find(|retained| retained.sent_on != Some(epoch))?;
            retained.sent_on = Some(epoch);
            return Some(Outgoing::Encoded(retained.frame.bytes.clone()));
        }
        loop {
            let spill = entry.spill.as_mut()?;
            match spill.next_unsent(epoch) {
                Ok(Some(bytes)) => return Some(Outgoing::Encoded(bytes)),
                Ok(None) => return None,
                Err(error) => {
                    self.stats.count_error();
                    self.stats.count_dropped();
                    tracing::warn!(
                        instance = key.instance_id,
                        attempt = key.attempt,
                        %error,
                        "reading the spill file failed; dropping the batch"
                    );
                    if spill.is_empty() {
                        if let Some(spill) = entry.spill.take() {
                            state.spilling.remove(&key);
                            self.delete_spill(spill);
                        }
                        return None;
                    }
                }
            }
        }
    }

    fn delete_spill(&self, spill: SpillFile) {
        if let Err(error) = spill.delete() {
            self.stats.count_error();
            tracing::warn!(%error, "deleting a spill file failed");
        }
    }

    /// Records how the attempt ended; returns the stream to send the report on.
    pub fn finished(
        &self,
        key: AttemptKey,
        message: AttemptFinished,
    ) -> Option<(Link, WorkerMessage)> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let link = state.link.clone();
        let entry = state.attempts.get_mut(&key)?;
        entry.control = None;
        if entry.forgotten {
            self.remove(state, key);
            return None;
        }
        if entry.finished.is_none() {
            state.running -= 1;
        }
        let sent_at = link.as_ref().map(|_| Instant::now());
        entry.finished = Some(FinishedReport {
            message: message.clone(),
            sent_on: link.as_ref().map(|link| link.epoch),
            first_sent_at: sent_at,
            last_sent_at: sent_at,
            acked: false,
        });
        tracing::debug!(instance = key.instance_id, attempt = key.attempt, stream = ?link.as_ref().map(|link| link.epoch), "attempt ended");
        Some((link?, wrap(Body::Finished(message))))
    }

    fn remove(&self, state: &mut State, key: AttemptKey) {
        if let Some(journal) = &self.journal {
            journal.settle(key);
        }
        if let Some(entry) = state.attempts.remove(&key) {
            if entry.running() {
                state.running -= 1;
            }
            state.retained_bytes -= entry.logs.iter().map(RetainedBatch::bytes).sum::<usize>();
            self.stats.set_retained(state.retained_bytes);
            if let Some(spill) = entry.spill {
                state.spilling.remove(&key);
                self.delete_spill(spill);
            }
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
                let freed: usize = entry.logs.drain(..).map(|batch| batch.bytes()).sum();
                let spill = entry.spill.take();
                state.retained_bytes -= freed;
                self.stats.set_retained(state.retained_bytes);
                if let Some(spill) = spill {
                    state.spilling.remove(&key);
                    self.delete_spill(spill);
                }
            }
            // Without kill the process is left alone; its later reports will be refused again.
            Some(_) => {}
            None => self.remove(&mut state, key),
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
        entry.acked_seq = entry.acked_seq.max(seq);
        let mut freed = 0;
        while entry
            .logs
            .front()
            .is_some_and(|batch| batch.frame.last_seq <= seq)
        {
            if let Some(batch) = entry.logs.pop_front() {
                freed += batch.bytes();
            }
        }
        let spill_done = entry.spill.as_mut().is_some_and(|spill| spill.ack(seq));
        let acked_spill = if spill_done { entry.spill.take() } else { None };
        let settled = entry.settled();
        state.retained_bytes -= freed;
        self.stats.set_retained(state.retained_bytes);
        if let Some(spill) = acked_spill {
            state.spilling.remove(&key);
            tracing::info!(
                instance = key.instance_id,
                attempt = key.attempt,
                "every spilled log line is acknowledged; deleting the spill file"
            );
            self.delete_spill(spill);
        }
        if settled {
            self.remove(&mut state, key);
        }
    }

    /// Drops the finished reports that were sent longer than `retention` ago. Until then (or
    /// until the scheduler acknowledges it) a report is replayed on every new stream, because a
    /// report sent just before a stream broke may never have arrived; the scheduler treats a
    /// repeated report of a terminal attempt as a no-op.
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
            self.remove(&mut state, key);
        }
    }

    /// Collects what the stream `link` has not seen yet (in per-attempt order: started, logs,
    /// spilled logs, finished) and marks it as sent on it, except spilled batches, which the
    /// caller reads one at a time with [`Attempts::take_unsent`]. When there is nothing left,
    /// installs `link` as the current stream, in the same critical section, so no runner's message
    /// slips in between.
    pub fn replay_or_install(&self, link: &Link) -> Vec<Replay> {
        let mut state = self.lock();
        let epoch = link.epoch;
        state.newest_epoch = state.newest_epoch.max(epoch);
        let now = Instant::now();
        let mut out = Vec::new();
        for (key, entry) in &mut state.attempts {
            if entry.forgotten {
                continue;
            }
            if let Some((started, sent_on)) = &mut entry.started
                && *sent_on != Some(epoch)
            {
                *sent_on = Some(epoch);
                out.push(Replay::Message(wrap(Body::Started(*started)).into()));
            }
            for batch in entry
                .logs
                .iter_mut()
                .filter(|batch| batch.sent_on != Some(epoch))
            {
                batch.sent_on = Some(epoch);
                out.push(Replay::Message(Outgoing::Encoded(
                    batch.frame.bytes.clone(),
                )));
            }
            if entry
                .spill
                .as_ref()
                .is_some_and(|spill| spill.has_unsent(epoch))
            {
                out.push(Replay::Spilled(*key));
            }
            if let Some(report) = &mut entry.finished
                && report.sent_on != Some(epoch)
                && !report.acked
            {
                report.sent_on = Some(epoch);
                report.first_sent_at.get_or_insert(now);
                report.last_sent_at = Some(now);
                out.push(Replay::Message(
                    wrap(Body::Finished(report.message.clone())).into(),
                ));
            }
        }
        // Acknowledged ends go again once to each new stream.
        state.prune_recent_ends(now);
        for end in &mut state.recent_ends {
            if end.sent_on.is_none_or(|sent| sent < epoch) {
                end.sent_on = Some(epoch);
                out.push(Replay::Message(
                    wrap(Body::Finished(end.message.clone())).into(),
                ));
            }
        }
        if out.is_empty() {
            state.link = Some(link.clone());
        }
        out
    }

    /// The ends handed to the live stream `epoch` that it has left unanswered (neither
    /// acknowledged nor refused) for `after` or longer, as of `now`, marked as sent again at
    /// `now`: the caller sends them on that stream. Without this an end lost inside a node (a
    /// report it took and never stored nor refused) would wait for the stream to break, however
    /// long it lives, its attempt RUNNING meanwhile. Nothing while `epoch` is not the installed
    /// stream: a replay on the next one sends what is unacknowledged anyway.
    pub fn ends_to_resend(&self, epoch: u64, now: Instant, after: Duration) -> Vec<WorkerMessage> {
        let mut state = self.lock();
        if state.link.as_ref().is_none_or(|link| link.epoch != epoch) {
            return Vec::new();
        }
        let mut due: Vec<(AttemptKey, WorkerMessage)> = state
            .attempts
            .iter_mut()
            .filter(|(_, entry)| !entry.forgotten)
            .filter_map(|(key, entry)| {
                let report = entry.finished.as_mut()?;
                let unanswered = !report.acked
                    && report.sent_on == Some(epoch)
                    && report
                        .last_sent_at
                        .is_some_and(|sent| now.saturating_duration_since(sent) >= after);
                if !unanswered {
                    return None;
                }
                report.last_sent_at = Some(now);
                Some((*key, wrap(Body::Finished(report.message.clone()))))
            })
            .collect();
        due.sort_by_key(|(key, _)| *key);
        due.into_iter().map(|(_, message)| message).collect()
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
        state
            .attempts
            .values()
            .filter(|entry| awaited(&state, entry))
            .all(|entry| {
                entry
                    .finished
                    .as_ref()
                    .is_some_and(|report| report.acked || report.sent_on.is_some())
            })
    }

    /// True when every retained log line and every end has been acknowledged: a worker that
    /// drains waits for this (up to its flush timeout), so its successor under the same id does
    /// not find an end the scheduler never stored.
    pub fn all_acked(&self) -> bool {
        let state = self.lock();
        state
            .attempts
            .values()
            .filter(|entry| awaited(&state, entry))
            .all(|entry| {
                entry.logs.is_empty()
                    && entry.spill.is_none()
                    && entry.finished.as_ref().is_none_or(|report| report.acked)
            })
    }

    /// Bytes of log lines kept in memory until acknowledged.
    #[cfg(test)]
    pub fn retained_bytes(&self) -> usize {
        self.lock().retained_bytes
    }
}

/// Whether a stopping worker waits for `entry`: not for a running held attempt it hands over.
fn awaited(state: &State, entry: &AttemptEntry) -> bool {
    !(state.handing_over && entry.held && entry.running())
}

fn wrap(body: Body) -> WorkerMessage {
    WorkerMessage { body: Some(body) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_proto::v1::{LogBatch, LogLine, LogStream};
    use prost::Message;

    fn key(attempt: u32) -> AttemptKey {
        AttemptKey {
            instance_id: 7,
            attempt,
        }
    }

    fn batch(first_seq: u64, lines: usize, width: usize) -> LogFrame {
        LogFrame::of(&LogBatch {
            instance_id: 7,
            attempt: 1,
            first_seq,
            lines: (0..lines)
                .map(|_| LogLine {
                    stream: LogStream::Stdout as i32,
                    text: "x".repeat(width),
                })
                .collect(),
            ..LogBatch::default()
        })
    }

    /// Retained bytes of one batch of one 100-byte line.
    fn one() -> usize {
        batch(1, 1, 100).bytes.len()
    }

    fn attempts(max_retained_bytes: usize) -> (Attempts, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let attempts = Attempts::new(
            max_retained_bytes,
            u64::MAX,
            dir.path().join("spill"),
            Arc::new(LogStats::default()),
        );
        (attempts, dir)
    }

    /// The messages of a replay that holds no spilled attempt.
    fn messages(replay: Vec<Replay>) -> Vec<Outgoing> {
        replay
            .into_iter()
            .map(|item| match item {
                Replay::Message(message) => message,
                Replay::Spilled(key) => panic!("unexpected spill of {key}"),
            })
            .collect()
    }

    fn log_seqs(messages: &[Outgoing]) -> Vec<u64> {
        messages
            .iter()
            .map(|outgoing| match outgoing {
                Outgoing::Message(message) => message.clone(),
                Outgoing::Encoded(bytes) => WorkerMessage::decode(bytes.as_ref()).unwrap(),
            })
            .filter_map(|m| match m.body {
                Some(Body::Logs(batch)) => Some(batch.first_seq),
                _ => None,
            })
            .collect()
    }

    /// Everything of `key`'s logs that stream `epoch` has not seen, as its shipper takes it.
    fn drain(attempts: &Attempts, key: AttemptKey, epoch: u64) -> Vec<Outgoing> {
        std::iter::from_fn(|| attempts.take_unsent(key, epoch)).collect()
    }

    fn link(epoch: u64) -> (Link, mpsc::Receiver<Outgoing>) {
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
        let (attempts, _dir) = attempts(1 << 20);
        assert!(matches!(attempts.admit(key(1), 1), Admission::Accepted(_)));
        assert!(matches!(attempts.admit(key(1), 1), Admission::Duplicate));
        assert!(matches!(attempts.admit(key(2), 1), Admission::Rejected(_)));
        attempts.finished(key(1), AttemptFinished::default());
        attempts.forget(key(1), false);
        // The report is gone, but the attempt is still remembered as seen.
        assert!(matches!(attempts.admit(key(1), 1), Admission::Duplicate));
        // A finished attempt no longer takes a slot.
        assert_eq!(attempts.running_count(), 0);
        assert!(matches!(attempts.admit(key(2), 1), Admission::Accepted(_)));
        assert_eq!(attempts.running_count(), 1);
        attempts.unadmit(key(2));
        assert_eq!(attempts.running_count(), 0);
        attempts.set_draining();
        assert!(matches!(attempts.admit(key(3), 1), Admission::Rejected(_)));
    }

    #[test]
    fn replay_sends_unacknowledged_items_once_per_stream() {
        let (attempts, _dir) = attempts(1 << 20);
        let _control = attempts.admit(key(1), 1);
        assert!(
            attempts
                .started(key(1), AttemptStarted::default())
                .is_none()
        );
        assert!(attempts.logs(key(1), batch(1, 2, 3)));
        assert!(attempts.logs(key(1), batch(3, 2, 3)));
        let (first, _rx) = link(1);
        assert_eq!(attempts.replay_or_install(&first).len(), 3);
        assert_eq!(attempts.replay_or_install(&first).len(), 0);
        assert!(drain(&attempts, key(1), 1).is_empty());
        // A batch recorded once the stream is up goes out through the shipper, once.
        assert!(attempts.logs(key(1), batch(5, 1, 3)));
        assert_eq!(log_seqs(&drain(&attempts, key(1), 1)), [5]);
        attempts.ack(key(1), 2);
        attempts.detach(1);
        let (second, _rx) = link(2);
        // Started again, batches 3..4 and 5; batch 1..2 was acknowledged.
        let replay = messages(attempts.replay_or_install(&second));
        assert_eq!(log_seqs(&replay), [3, 5]);
        assert_eq!(replay.len(), 3);
        // A shipper still holding the old stream gets nothing more.
        assert!(attempts.logs(key(1), batch(6, 1, 3)));
        assert!(attempts.take_unsent(key(1), 1).is_none());
        assert_eq!(log_seqs(&drain(&attempts, key(1), 2)), [6]);
    }

    #[test]
    fn a_finished_report_is_resent_and_listed_until_acknowledged() {
        let (attempts, _dir) = attempts(1 << 20);
        let _control = attempts.admit(key(1), 1);
        assert!(attempts.logs(key(1), batch(1, 2, 3)));
        let report = AttemptFinished {
            instance_id: 7,
            attempt: 1,
            log_lines: 2,
            ..AttemptFinished::default()
        };
        assert!(attempts.finished(key(1), report).is_none());
        assert!(attempts.running().is_empty());
        let listed = |attempts: &Attempts| {
            attempts
                .unacknowledged()
                .iter()
                .map(AttemptKey::from)
                .collect::<Vec<_>>()
        };
        assert_eq!(listed(&attempts), [key(1)]);
        let (first, _rx) = link(1);
        // The batch and the report.
        assert_eq!(attempts.replay_or_install(&first).len(), 2);
        attempts.detach(1);
        // Not acknowledged: listed and sent again on the next stream.
        assert_eq!(listed(&attempts), [key(1)]);
        let (second, _rx) = link(2);
        assert_eq!(attempts.replay_or_install(&second).len(), 2);
        attempts.detach(2);
        // Acknowledged: its lines are resent until acked; the end is offered once more to each
        // new stream for a while (a cluster member that died after the commit may have taken
        // it along), and listed with the unacknowledged ones.
        attempts.finished_acked(key(1));
        assert!(attempts.all_reported());
        assert_eq!(listed(&attempts), [key(1)]);
        let (third, _rx) = link(3);
        let replay = messages(attempts.replay_or_install(&third));
        assert_eq!(log_seqs(&replay), [1]);
        assert_eq!(replay.len(), 2);
        assert!(attempts.replay_or_install(&third).is_empty());
        // Once its lines are acknowledged too nothing of it is kept but the recent end, and a
        // repeated dispatch is still a duplicate; a second acknowledgement adds nothing.
        attempts.ack(key(1), 2);
        attempts.finished_acked(key(1));
        assert!(attempts.all_acked());
        assert_eq!(attempts.lock().attempts.len(), 0);
        assert_eq!(attempts.lock().recent_ends.len(), 1);
        assert!(matches!(attempts.admit(key(1), 1), Admission::Duplicate));
        attempts.detach(3);
        let (fourth, _rx) = link(4);
        assert_eq!(messages(attempts.replay_or_install(&fourth)).len(), 1);
        // Past the time it is kept, it goes.
        attempts
            .lock()
            .prune_recent_ends(Instant::now() + RECENT_ENDS_KEPT);
        assert!(listed(&attempts).is_empty());
    }

    /// An end the live stream leaves unanswered (a node took it and neither stored nor refused
    /// it) is sent on that stream again after [`END_RESEND_AFTER`], and again each time as long
    /// as it goes unanswered; never once acknowledged, never for a stream that is not the
    /// installed one, and never for an attempt the scheduler refused.
    #[test]
    fn an_end_unanswered_on_a_live_stream_is_sent_on_it_again() {
        let (attempts, _dir) = attempts(1 << 20);
        let _one = attempts.admit(key(1), 2);
        let _two = attempts.admit(key(2), 2);
        let (live, _rx) = link(1);
        assert!(attempts.replay_or_install(&live).is_empty(), "installed");
        let base = Instant::now();
        let report = |attempt: u32| AttemptFinished {
            instance_id: 7,
            attempt,
            exit_code: Some(0),
            finished_at_ms: 1_000 + i64::from(attempt),
            ..AttemptFinished::default()
        };
        let (sent_on, _) = attempts.finished(key(1), report(1)).expect("sent at once");
        assert_eq!(sent_on.epoch, 1);
        let after = END_RESEND_AFTER;
        let due = |at: Duration| attempts.ends_to_resend(1, base + at, after);
        let finished_of = |messages: Vec<WorkerMessage>| -> Vec<AttemptFinished> {
            messages
                .into_iter()
                .map(|message| match message.body {
                    Some(Body::Finished(finished)) => finished,
                    other => panic!("expected an end, got {other:?}"),
                })
                .collect()
        };
        // Answered in time, nothing is sent again.
        assert!(due(Duration::from_secs(1)).is_empty());
        // Unanswered past the delay: the very same report goes again, once per delay.
        let again = finished_of(due(after + Duration::from_secs(1)));
        assert_eq!(again, [report(1)]);
        assert!(due(after + Duration::from_secs(2)).is_empty());
        assert_eq!(
            finished_of(due(2 * after + Duration::from_secs(2))),
            [report(1)]
        );
        // Another stream than the installed one gets nothing (the next one's replay sends it).
        assert!(
            attempts
                .ends_to_resend(2, base + 10 * after, after)
                .is_empty()
        );
        // Once acknowledged, never again; a refused attempt's end neither.
        attempts.finished_acked(key(1));
        assert!(due(10 * after).is_empty());
        attempts.finished(key(2), report(2)).expect("sent at once");
        attempts.forget(key(2), false);
        assert!(due(20 * after).is_empty());
    }

    /// An end reported while no stream was up goes with the next stream's replay, and is sent on
    /// that stream again if it leaves it unanswered.
    #[test]
    fn an_end_replayed_on_a_new_stream_is_sent_again_if_unanswered() {
        let (attempts, _dir) = attempts(1 << 20);
        let _one = attempts.admit(key(1), 1);
        assert!(
            attempts
                .finished(key(1), AttemptFinished::default())
                .is_none()
        );
        let base = Instant::now();
        // Not handed to any stream yet: the replay's to send.
        assert!(
            attempts
                .ends_to_resend(1, base + 10 * END_RESEND_AFTER, END_RESEND_AFTER)
                .is_empty()
        );
        let (next, _rx) = link(1);
        assert_eq!(messages(attempts.replay_or_install(&next)).len(), 1);
        assert!(attempts.replay_or_install(&next).is_empty(), "installed");
        let later = Instant::now() + END_RESEND_AFTER;
        assert_eq!(attempts.ends_to_resend(1, later, END_RESEND_AFTER).len(), 1);
    }

    #[test]
    fn past_the_memory_bound_batches_spill_and_come_back_in_order() {
        let one = one();
        let (attempts, dir) = attempts(3 * one);
        let spill_dir = dir.path().join("spill");
        let _control = attempts.admit(key(1), 1);
        let (first, _rx) = link(1);
        assert!(attempts.replay_or_install(&first).is_empty());
        for seq in 1..=3 {
            assert!(attempts.logs(key(1), batch(seq, 1, 100)));
        }
        assert_eq!(log_seqs(&drain(&attempts, key(1), 1)), [1, 2, 3]);
        assert_eq!(attempts.retained_bytes(), 3 * one);
        // The fourth batch does not fit: the attempt's batches move to disk, and only the new one
        // is still to be sent on the current stream.
        assert!(attempts.logs(key(1), batch(4, 1, 100)));
        assert_eq!(attempts.retained_bytes(), 0);
        assert_eq!(log_seqs(&drain(&attempts, key(1), 1)), [4]);
        // While spilled lines exist, later batches follow them to disk although memory is free.
        assert!(attempts.logs(key(1), batch(5, 1, 100)));
        assert_eq!(log_seqs(&drain(&attempts, key(1), 1)), [5]);
        assert_eq!(attempts.stats.spilled_batches(), 5);
        assert_eq!(attempts.stats.peak_retained_bytes(), 3 * one);

        // A new stream gets everything unacknowledged, read back from the file in order, and a
        // runner still holding the old stream gets nothing more.
        attempts.ack(key(1), 1);
        attempts.detach(1);
        let (second, _rx) = link(2);
        let replay = attempts.replay_or_install(&second);
        assert!(matches!(replay.as_slice(), [Replay::Spilled(k)] if *k == key(1)));
        assert_eq!(log_seqs(&drain(&attempts, key(1), 2)), [2, 3, 4, 5]);
        assert!(attempts.take_unsent(key(1), 1).is_none());
        assert!(attempts.replay_or_install(&second).is_empty());
        assert!(!attempts.all_acked());

        // Once everything spilled is acknowledged the file goes, and memory is used again.
        attempts.ack(key(1), 5);
        assert!(attempts.all_acked());
        assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 0);
        assert!(attempts.logs(key(1), batch(6, 1, 100)));
        assert_eq!(attempts.retained_bytes(), one);
        assert_eq!(log_seqs(&drain(&attempts, key(1), 2)), [6]);
        assert_eq!(attempts.stats.dropped_batches(), 0);
    }

    #[test]
    fn past_the_spill_budget_a_runner_in_spill_mode_must_wait() {
        let dir = tempfile::tempdir().unwrap();
        let stats = Arc::new(LogStats::default());
        let attempts = Attempts::new(
            one(),
            2 * one() as u64,
            dir.path().join("spill"),
            Arc::clone(&stats),
        );
        let _control = attempts.admit(key(1), 2);
        let _other = attempts.admit(key(2), 2);
        assert!(attempts.has_log_room(key(1)));
        assert!(attempts.logs(key(1), batch(1, 1, 100)));
        assert!(attempts.has_log_room(key(1)));
        // Memory is full: the second batch sends both to disk, which fills the budget.
        assert!(attempts.logs(key(1), batch(2, 1, 100)));
        assert!(!attempts.has_log_room(key(1)));
        // Memory is free again, so another attempt may still record there.
        assert!(attempts.has_log_room(key(2)));
        attempts.ack(key(1), 1);
        assert!(attempts.has_log_room(key(1)));
        assert_eq!(stats.dropped_batches(), 0);
    }

    #[test]
    fn batches_spilled_during_a_replay_are_not_sent_twice() {
        let (attempts, _dir) = attempts(2 * one());
        let _control = attempts.admit(key(1), 1);
        attempts.logs(key(1), batch(1, 1, 100));
        attempts.logs(key(1), batch(2, 1, 100));
        let (first, _rx) = link(1);
        // The replay hands over batches 1 and 2; before the stream is installed, batch 3 spills
        // them to disk.
        assert_eq!(
            log_seqs(&messages(attempts.replay_or_install(&first))),
            [1, 2]
        );
        assert!(attempts.logs(key(1), batch(3, 1, 100)));
        let replay = attempts.replay_or_install(&first);
        assert!(matches!(replay.as_slice(), [Replay::Spilled(_)]));
        assert_eq!(log_seqs(&drain(&attempts, key(1), 1)), [3]);
        assert!(attempts.replay_or_install(&first).is_empty());
    }

    #[test]
    fn a_spill_that_cannot_be_written_drops_the_batch_and_counts() {
        let dir = tempfile::tempdir().unwrap();
        // A regular file where the spill directory should be.
        let not_a_dir = dir.path().join("file");
        std::fs::write(&not_a_dir, b"").unwrap();
        let stats = Arc::new(LogStats::default());
        let attempts = Attempts::new(one(), u64::MAX, not_a_dir, Arc::clone(&stats));
        let _control = attempts.admit(key(1), 1);
        assert!(attempts.logs(key(1), batch(1, 1, 100)));
        assert!(!attempts.logs(key(1), batch(2, 1, 100)));
        assert_eq!(stats.spill_errors(), 1);
        assert_eq!(stats.dropped_batches(), 1);
        assert_eq!(attempts.retained_bytes(), one());
        let (first, _rx) = link(1);
        assert_eq!(log_seqs(&messages(attempts.replay_or_install(&first))), [1]);
    }

    #[test]
    fn forgetting_a_spilled_attempt_deletes_its_file() {
        let (attempts, dir) = attempts(10);
        let Admission::Accepted(_control) = attempts.admit(key(1), 1) else {
            panic!()
        };
        attempts.logs(key(1), batch(1, 1, 100));
        let spill_dir = dir.path().join("spill");
        assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 1);
        attempts.forget(key(1), true);
        assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 0);
        assert!(attempts.all_acked());
    }

    #[test]
    fn forgetting_a_running_attempt_kills_it_and_drops_its_reports() {
        let (attempts, _dir) = attempts(1 << 20);
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
