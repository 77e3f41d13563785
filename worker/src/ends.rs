//! The journal of attempt ends: what a worker restarted under the same id still owes a scheduler.
//!
//! As an attempt's `AttemptFinished` is sent, the worker appends it to this journal, with the
//! attempt's `AttemptStarted`, its log batches the scheduler has not acknowledged, and the index
//! of its spill file if it has one; the runner ends once the journal is on disk (`fdatasync`),
//! but the report does not wait for it (see `runner::send_finished`). A worker killed at any
//! later instant finds the end here when it starts again: it lists the attempt in
//! `Register.finished` and sends the started, the lines and the end again, so the scheduler
//! stores the end the process really had instead of counting the attempt lost. Once the attempt
//! is settled (its end and every line acknowledged, or the scheduler refused it, or its
//! retention ran out) a short settle record strikes it off.
//!
//! Appends are committed in groups: one thread writes whatever has been queued since its last
//! `fdatasync` in one `write` and syncs once, so a thousand ends a second cost a few hundred
//! syncs, not a thousand, and no runner waits for another's sync to start its own. Settle records
//! are not synced: one lost in a crash costs only a repeated report, which a scheduler ignores.
//!
//! The journal is a segment file, `<n>.ends`, appended to until it passes [`SEGMENT_BYTES`];
//! then the next segment is started with a copy of every unsettled end (usually a handful) and
//! the old one deleted, so the journal's size follows what is unsettled, not what ran. Each record is `[length u32][crc32c u32][protobuf]`; a torn or corrupt tail (a
//! crash of the machine during a write) ends the reading of its segment, and can only hold ends
//! that were never reported.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use ax_proto::v1::{AttemptFinished, AttemptStarted};
use prost::Message;
use prost::bytes::Bytes;
use tokio::sync::oneshot;

use crate::attempts::AttemptKey;

/// A segment is closed past this size, so settled ends are freed a segment at a time.
const SEGMENT_BYTES: u64 = 1 << 20;

/// A record longer than this is corrupt (ends carry at most 64 KiB of outputs and a retained log
/// window; a spill file's batches are indexed, not copied).
const MAX_RECORD_BYTES: usize = 256 << 20;

const SUFFIX: &str = "ends";

const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// One log batch kept with an end: its encoded frame and the lines it holds.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct KeptBatch {
    #[prost(uint64, tag = "1")]
    pub first_seq: u64,
    #[prost(uint64, tag = "2")]
    pub last_seq: u64,
    #[prost(bytes = "bytes", tag = "3")]
    pub frame: Bytes,
}

/// One batch in a spill file: where it is and the last line it holds.
#[derive(Clone, Copy, PartialEq, Message)]
pub(crate) struct SpilledBatch {
    #[prost(uint64, tag = "1")]
    pub start: u64,
    #[prost(uint64, tag = "2")]
    pub len: u64,
    #[prost(uint64, tag = "3")]
    pub last_seq: u64,
}

/// What a restarted worker needs to report an attempt that ended: the journal's record.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct EndRecord {
    #[prost(int64, tag = "1")]
    pub instance_id: i64,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
    /// Set on a settle record: the attempt above needs nothing more.
    #[prost(bool, tag = "3")]
    pub settled: bool,
    #[prost(message, optional, tag = "4")]
    pub started: Option<AttemptStarted>,
    #[prost(message, optional, tag = "5")]
    pub finished: Option<AttemptFinished>,
    /// Unacknowledged batches that were in memory, oldest first.
    #[prost(message, repeated, tag = "6")]
    pub batches: Vec<KeptBatch>,
    /// The attempt's spill file (synced before the record), when it had one.
    #[prost(string, tag = "7")]
    pub spill_path: String,
    #[prost(message, repeated, tag = "8")]
    pub spilled: Vec<SpilledBatch>,
}

impl EndRecord {
    pub(crate) fn key(&self) -> AttemptKey {
        AttemptKey {
            instance_id: self.instance_id,
            attempt: self.attempt,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("ends journal {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("the ends journal's writer has stopped")]
    Stopped,
}

enum Op {
    Append {
        key: AttemptKey,
        bytes: Vec<u8>,
        done: oneshot::Sender<Result<(), JournalError>>,
    },
    Settle(AttemptKey),
}

/// The writer's handle: cheap to share; the writer thread stops when it is dropped.
#[derive(Debug)]
pub(crate) struct EndJournal {
    ops: mpsc::Sender<Op>,
}

impl std::fmt::Debug for Op {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Op::Append { key, .. } => write!(f, "Append({key})"),
            Op::Settle(key) => write!(f, "Settle({key})"),
        }
    }
}

impl EndJournal {
    /// Opens the journal in `dir` (made 0700 if missing), returns the ends an earlier process
    /// left unsettled, oldest first, and starts the writer on a new segment.
    pub(crate) fn open(dir: &Path) -> Result<(EndJournal, Vec<EndRecord>), JournalError> {
        let io_error = |source| JournalError::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_error)?;
        let mut segments: BTreeMap<u64, PathBuf> = BTreeMap::new();
        for entry in std::fs::read_dir(dir).map_err(io_error)?.flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|ext| ext == SUFFIX)
                && let Some(number) = path
                    .file_stem()
                    .and_then(|stem| stem.to_str())
                    .and_then(|stem| stem.parse::<u64>().ok())
            {
                segments.insert(number, path);
            }
        }
        // Replays every segment in order: a settle strikes off the end it names, wherever it is.
        let mut live: Vec<EndRecord> = Vec::new();
        let mut index: HashMap<AttemptKey, usize> = HashMap::new();
        for path in segments.values() {
            for record in read_segment(path)? {
                let key = record.key();
                if record.settled {
                    if let Some(at) = index.remove(&key) {
                        live[at].settled = true;
                    }
                } else {
                    if let Some(at) = index.get(&key) {
                        // A second end of one attempt: the later one is what was reported last.
                        live[*at].settled = true;
                    }
                    index.insert(key, live.len());
                    live.push(record);
                }
            }
        }
        live.retain(|record| !record.settled);
        let mut writer = Writer {
            dir: dir.to_path_buf(),
            live: HashMap::new(),
            live_bytes: 0,
            current: None,
        };
        for record in &live {
            let bytes = frame(record);
            writer.live_bytes += bytes.len() as u64;
            writer.live.insert(record.key(), bytes);
        }
        let next = segments.keys().next_back().map_or(1, |last| last + 1);
        let older: Vec<PathBuf> = segments.into_values().collect();
        writer.start_segment(next, &older)?;
        let (ops, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("ax-ends-journal".into())
            .spawn(move || writer.run(&rx))
            .map_err(io_error)?;
        if !live.is_empty() {
            tracing::info!(
                ends = live.len(),
                "the ends journal holds ends an earlier worker process did not see acknowledged"
            );
        }
        Ok((EndJournal { ops }, live))
    }

    /// Appends `record`; the receiver answers once it is on disk.
    pub(crate) fn append(&self, record: &EndRecord) -> oneshot::Receiver<Result<(), JournalError>> {
        let (done, rx) = oneshot::channel();
        let op = Op::Append {
            key: record.key(),
            bytes: frame(record),
            done,
        };
        if let Err(mpsc::SendError(Op::Append { done, .. })) = self.ops.send(op) {
            let _ = done.send(Err(JournalError::Stopped));
        }
        rx
    }

    /// The attempt needs nothing more from the journal.
    pub(crate) fn settle(&self, key: AttemptKey) {
        let _ = self.ops.send(Op::Settle(key));
    }
}

/// The length, checksum and bytes of one record.
fn frame(record: &EndRecord) -> Vec<u8> {
    let body = record.encode_to_vec();
    let mut out = Vec::with_capacity(body.len() + 8);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_le_bytes());
    out.extend_from_slice(&CRC.checksum(&body).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// The records of one segment, up to the first torn or corrupt one.
fn read_segment(path: &Path) -> Result<Vec<EndRecord>, JournalError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut file| file.read_to_end(&mut bytes))
        .map_err(|source| JournalError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let mut records = Vec::new();
    let mut rest = bytes.as_slice();
    while !rest.is_empty() {
        let torn = |why: &str| {
            tracing::warn!(path = %path.display(), why, "the ends journal ends in a torn record; reading no further in this segment");
        };
        if rest.len() < 8 {
            torn("a record header is cut short");
            break;
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let crc = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]);
        if len > MAX_RECORD_BYTES || rest.len() < 8 + len {
            torn("a record is cut short");
            break;
        }
        let body = &rest[8..8 + len];
        if CRC.checksum(body) != crc {
            torn("a record's checksum does not match");
            break;
        }
        match EndRecord::decode(body) {
            Ok(record) => records.push(record),
            Err(error) => {
                tracing::warn!(path = %path.display(), %error, "skipping an ends journal record that does not decode");
            }
        }
        rest = &rest[8 + len..];
    }
    Ok(records)
}

fn remove_segment(path: &Path) {
    if let Err(error) = std::fs::remove_file(path) {
        tracing::warn!(path = %path.display(), %error, "cannot delete a settled ends journal segment");
    }
}

struct Writer {
    dir: PathBuf,
    /// The framed record of every unsettled end, copied forward when a segment is closed.
    live: HashMap<AttemptKey, Vec<u8>>,
    live_bytes: u64,
    /// The segment appended to: its number, file and size.
    current: Option<(u64, File, u64)>,
}

impl Writer {
    fn path(&self, number: u64) -> PathBuf {
        self.dir.join(format!("{number:020}.{SUFFIX}"))
    }

    /// Starts segment `number` holding every unsettled end, synced, then deletes the older
    /// segments: only the new one is needed to come back from a crash after this returns.
    fn start_segment(&mut self, number: u64, older: &[PathBuf]) -> Result<(), JournalError> {
        let path = self.path(number);
        let io_error = |source| JournalError::Io {
            path: path.clone(),
            source,
        };
        let mut file = OpenOptions::new()
            .mode(0o600)
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io_error)?;
        let mut carried = Vec::with_capacity(usize::try_from(self.live_bytes).unwrap_or(0));
        let mut keys: Vec<&AttemptKey> = self.live.keys().collect();
        keys.sort();
        for key in keys {
            carried.extend_from_slice(&self.live[key]);
        }
        file.write_all(&carried)
            .and_then(|()| file.sync_data())
            .map_err(io_error)?;
        // The new file's name must survive a crash as its records do.
        File::open(&self.dir)
            .and_then(|dir| dir.sync_all())
            .map_err(io_error)?;
        let size = file.metadata().map_err(io_error)?.len();
        self.current = Some((number, file, size));
        for old in older {
            remove_segment(old);
        }
        Ok(())
    }

    fn run(mut self, ops: &mpsc::Receiver<Op>) {
        while let Ok(first) = ops.recv() {
            let mut batch = vec![first];
            batch.extend(ops.try_iter());
            self.commit(batch);
        }
    }

    /// Writes a group of operations at once, syncs if it holds an end, then answers them.
    fn commit(&mut self, batch: Vec<Op>) {
        let mut buffer = Vec::new();
        let mut waiting = Vec::new();
        for op in batch {
            match op {
                Op::Append { key, bytes, done } => {
                    buffer.extend_from_slice(&bytes);
                    waiting.push(done);
                    self.live_bytes += bytes.len() as u64;
                    if let Some(old) = self.live.insert(key, bytes) {
                        self.live_bytes -= old.len() as u64;
                    }
                }
                Op::Settle(key) => {
                    let Some(old) = self.live.remove(&key) else {
                        continue;
                    };
                    self.live_bytes -= old.len() as u64;
                    buffer.extend_from_slice(&frame(&EndRecord {
                        instance_id: key.instance_id,
                        attempt: key.attempt,
                        settled: true,
                        ..EndRecord::default()
                    }));
                }
            }
        }
        let result = self.write(&buffer, !waiting.is_empty());
        if let Err(error) = &result {
            tracing::warn!(dir = %self.dir.display(), %error, "cannot write the ends journal; ends are reported without being kept");
        }
        for done in waiting {
            let _ = done.send(
                result
                    .as_ref()
                    .map(|_| ())
                    .map_err(|error| JournalError::Io {
                        path: self.dir.clone(),
                        source: io::Error::new(error.kind(), error.to_string()),
                    }),
            );
        }
        self.rotate_if_full();
    }

    fn write(&mut self, buffer: &[u8], sync: bool) -> io::Result<()> {
        let Some((_, file, size)) = self.current.as_mut() else {
            return Err(io::Error::other("no segment is open"));
        };
        if buffer.is_empty() {
            return Ok(());
        }
        file.write_all(buffer)?;
        *size += buffer.len() as u64;
        if sync {
            file.sync_data()?;
        }
        Ok(())
    }

    /// Closes a segment grown past its size (and past twice what is still unsettled, so that
    /// a large unsettled set does not close one segment per write).
    fn rotate_if_full(&mut self) {
        let Some((number, _, size)) = &self.current else {
            return;
        };
        if *size < SEGMENT_BYTES.max(2 * self.live_bytes) {
            return;
        }
        let old = *number;
        let older = [self.path(old)];
        if let Err(error) = self.start_segment(old + 1, &older) {
            tracing::warn!(%error, "cannot start a new ends journal segment; appending to the old one");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(instance_id: i64, attempt: u32, code: i32) -> EndRecord {
        EndRecord {
            instance_id,
            attempt,
            started: Some(AttemptStarted {
                instance_id,
                attempt,
                pid: 42,
                started_at_ms: 1,
            }),
            finished: Some(AttemptFinished {
                instance_id,
                attempt,
                exit_code: Some(code),
                ..AttemptFinished::default()
            }),
            batches: vec![KeptBatch {
                first_seq: 1,
                last_seq: 2,
                frame: Bytes::from_static(b"two lines"),
            }],
            ..EndRecord::default()
        }
    }

    async fn append(journal: &EndJournal, record: &EndRecord) {
        journal
            .append(record)
            .await
            .expect("the writer answers")
            .expect("the record is on disk");
    }

    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("the journal directory")
            .flatten()
            .map(|entry| entry.path())
            .collect();
        files.sort();
        files
    }

    #[tokio::test]
    async fn unsettled_ends_come_back_after_a_restart_and_settled_ones_do_not() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, left) = EndJournal::open(dir.path()).expect("open");
        assert!(left.is_empty());
        for instance in 1..=3 {
            append(&journal, &record(instance, 1, 0)).await;
        }
        journal.settle(AttemptKey {
            instance_id: 2,
            attempt: 1,
        });
        // An attempt ended twice (a retried write) is kept once, as last written.
        append(&journal, &record(3, 1, 7)).await;
        drop(journal);
        // The writer's last settle may still be in flight; an append after it orders them.
        let (journal, left) = EndJournal::open(dir.path()).expect("reopen");
        let keys: Vec<(i64, Option<i32>)> = left
            .iter()
            .map(|r| (r.instance_id, r.finished.as_ref().and_then(|f| f.exit_code)))
            .collect();
        assert_eq!(keys, vec![(1, Some(0)), (3, Some(7))]);
        assert_eq!(left[0], record(1, 1, 0));
        drop(journal);
    }

    #[tokio::test]
    async fn a_torn_tail_loses_only_the_record_it_cuts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, _) = EndJournal::open(dir.path()).expect("open");
        append(&journal, &record(1, 1, 0)).await;
        append(&journal, &record(2, 1, 0)).await;
        drop(journal);
        let files = segment_files(dir.path());
        assert_eq!(files.len(), 1, "{files:?}");
        let bytes = std::fs::read(&files[0]).expect("segment");
        std::fs::write(&files[0], &bytes[..bytes.len() - 3]).expect("cut the tail");
        let (_journal, left) = EndJournal::open(dir.path()).expect("reopen");
        assert_eq!(left, vec![record(1, 1, 0)]);
    }

    #[tokio::test]
    async fn a_flipped_byte_stops_the_segment_at_that_record() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, _) = EndJournal::open(dir.path()).expect("open");
        append(&journal, &record(1, 1, 0)).await;
        append(&journal, &record(2, 1, 0)).await;
        drop(journal);
        let files = segment_files(dir.path());
        let mut bytes = std::fs::read(&files[0]).expect("segment");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&files[0], &bytes).expect("corrupt");
        let (_journal, left) = EndJournal::open(dir.path()).expect("reopen");
        assert_eq!(left, vec![record(1, 1, 0)]);
    }

    #[tokio::test]
    async fn a_full_segment_is_replaced_by_one_holding_only_the_unsettled_ends() {
        let dir = tempfile::tempdir().expect("temp dir");
        let (journal, _) = EndJournal::open(dir.path()).expect("open");
        let first = segment_files(dir.path());
        let mut big = record(1, 1, 0);
        big.batches[0].frame = Bytes::from(vec![b'x'; SEGMENT_BYTES as usize]);
        append(&journal, &big).await;
        append(&journal, &record(2, 1, 0)).await;
        journal.settle(big.key());
        append(&journal, &record(3, 1, 0)).await;
        // A segment is closed after its writes are answered: the next write orders after it.
        append(&journal, &record(4, 1, 0)).await;
        let files = segment_files(dir.path());
        assert_eq!(files.len(), 1, "{files:?}");
        assert_ne!(files, first, "the full segment was replaced");
        let size = std::fs::metadata(&files[0]).expect("segment").len();
        assert!(
            size < 4096,
            "only the small ends were carried: {size} bytes"
        );
        drop(journal);
        let (_journal, left) = EndJournal::open(dir.path()).expect("reopen");
        let keys: Vec<i64> = left.iter().map(|r| r.instance_id).collect();
        assert_eq!(keys, vec![2, 3, 4]);
    }
}
