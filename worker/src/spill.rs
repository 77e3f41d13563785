//! Spill files: the unacknowledged log batches of one attempt, kept on disk once the worker's
//! in-memory bound is reached, so that a long outage or a slow scheduler loses no log line.
//!
//! A spill file is a sequence of log frames (each batch encoded as the `WorkerMessage` that
//! carries it, `logs::LogFrame`), in seq order. Alongside it the worker keeps a small index (offset,
//! length and last seq of every unacknowledged batch), so that batches are read back one at a
//! time, never a whole file at once, and are sent as they were read; an acknowledgement frees the
//! index without touching the file. The file is deleted once every batch in it is acknowledged.
//! Writes are positional at the end of the last complete record, so a failed or partial write is
//! simply overwritten by the next one. A running attempt's spill file is not synced; when the
//! attempt ends, the file is synced and its index kept with the end in the ends journal (`ends`),
//! so a worker restarted under the same id reopens it and sends the rest. A new worker process
//! deletes every other spill file an earlier one left behind.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prost::bytes::Bytes;

use crate::attempts::AttemptKey;
use crate::ends::SpilledBatch;
use crate::logs::LogFrame;

/// File name suffix of spill files.
const SUFFIX: &str = "spill";

/// What happened to the worker's unacknowledged log lines, for tests and operators.
#[derive(Debug, Default)]
pub struct LogStats {
    retained_bytes: AtomicUsize,
    peak_retained_bytes: AtomicUsize,
    spilled_batches: AtomicU64,
    spill_errors: AtomicU64,
    dropped_batches: AtomicU64,
}

impl LogStats {
    /// Bytes of unacknowledged log lines held in memory now.
    pub fn retained_bytes(&self) -> usize {
        self.retained_bytes.load(Ordering::Relaxed)
    }

    /// The most bytes of unacknowledged log lines ever held in memory at once.
    pub fn peak_retained_bytes(&self) -> usize {
        self.peak_retained_bytes.load(Ordering::Relaxed)
    }

    /// Batches written to a spill file.
    pub fn spilled_batches(&self) -> u64 {
        self.spilled_batches.load(Ordering::Relaxed)
    }

    /// Spill file operations that failed (create, write, read, delete).
    pub fn spill_errors(&self) -> u64 {
        self.spill_errors.load(Ordering::Relaxed)
    }

    /// Batches lost because they could be neither kept in memory nor spilled nor read back.
    pub fn dropped_batches(&self) -> u64 {
        self.dropped_batches.load(Ordering::Relaxed)
    }

    pub(crate) fn set_retained(&self, bytes: usize) {
        self.retained_bytes.store(bytes, Ordering::Relaxed);
        self.peak_retained_bytes.fetch_max(bytes, Ordering::Relaxed);
    }

    pub(crate) fn count_spilled(&self) {
        self.spilled_batches.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_error(&self) {
        self.spill_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_dropped(&self) {
        self.dropped_batches.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpillError {
    #[error("spill file {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

/// One batch in the file.
#[derive(Debug, Clone, Copy)]
struct Record {
    start: u64,
    len: usize,
    last_seq: u64,
}

/// The spill file of one attempt and the index of its unacknowledged batches.
#[derive(Debug)]
pub(crate) struct SpillFile {
    path: PathBuf,
    file: File,
    /// End of the last complete record: where the next one is written.
    written: u64,
    /// Unacknowledged records, oldest first.
    records: VecDeque<Record>,
    /// Everything before this offset was handed to a sender on this stream ("epoch").
    sent: Option<(u64, u64)>,
}

impl SpillFile {
    /// Creates (or truncates) the spill file of `key` in `dir`.
    pub(crate) fn create(dir: &Path, key: AttemptKey) -> Result<Self, SpillError> {
        let path = dir.join(format!("{}-{}.{SUFFIX}", key.instance_id, key.attempt));
        let io_error = |source| SpillError::Io {
            path: path.clone(),
            source,
        };
        // Spilled lines are not yet masked (the node masks secrets): only the worker's user
        // reads them.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io_error)?;
        let file = OpenOptions::new()
            .mode(0o600)
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(io_error)?;
        Ok(SpillFile {
            path,
            file,
            written: 0,
            records: VecDeque::new(),
            sent: None,
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a batch at the end of the file.
    pub(crate) fn append(&mut self, frame: &LogFrame) -> Result<(), SpillError> {
        let bytes = &frame.bytes;
        self.file
            .write_all_at(bytes, self.written)
            .map_err(|source| SpillError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.records.push_back(Record {
            start: self.written,
            len: bytes.len(),
            last_seq: frame.last_seq,
        });
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// Bytes of the file not yet acknowledged.
    pub(crate) fn unacked_bytes(&self) -> u64 {
        self.records
            .front()
            .map_or(0, |oldest| self.written - oldest.start)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Marks everything written so far as handed to a sender on stream `epoch`.
    pub(crate) fn mark_all_sent(&mut self, epoch: u64) {
        self.sent = Some((epoch, self.written));
    }

    /// The index of the first record not yet handed to stream `epoch`, or `None` when `epoch` is
    /// older than the stream the file is being sent on (a runner still holding a dead stream).
    fn first_unsent(&self, epoch: u64) -> Option<usize> {
        let from = match self.sent {
            Some((sent_epoch, offset)) if sent_epoch == epoch => offset,
            Some((sent_epoch, _)) if sent_epoch > epoch => return None,
            _ => 0,
        };
        let index = self.records.partition_point(|record| record.start < from);
        (index < self.records.len()).then_some(index)
    }

    pub(crate) fn has_unsent(&self, epoch: u64) -> bool {
        self.first_unsent(epoch).is_some()
    }

    /// Reads the next batch not yet handed to stream `epoch` and marks it handed. A batch that
    /// cannot be read back is dropped from the index (so later acknowledgements still free the
    /// file) and its error returned; the caller may go on with the next one.
    pub(crate) fn next_unsent(&mut self, epoch: u64) -> Result<Option<Bytes>, SpillError> {
        let Some(index) = self.first_unsent(epoch) else {
            return Ok(None);
        };
        let record = self.records[index];
        self.sent = Some((epoch, record.start + record.len as u64));
        let mut bytes = vec![0; record.len];
        let read = self
            .file
            .read_exact_at(&mut bytes, record.start)
            .map_err(|source| SpillError::Io {
                path: self.path.clone(),
                source,
            });
        if read.is_err() {
            self.records.remove(index);
        }
        read.map(|()| Some(bytes.into()))
    }

    /// The scheduler stored every line up to `seq`; returns true when nothing in the file is
    /// unacknowledged any more.
    pub(crate) fn ack(&mut self, seq: u64) -> bool {
        while self
            .records
            .front()
            .is_some_and(|record| record.last_seq <= seq)
        {
            self.records.pop_front();
        }
        self.records.is_empty()
    }

    /// The unacknowledged batches' places in the file, for the ends journal, and a handle that
    /// syncs it.
    pub(crate) fn index(&self) -> (Vec<SpilledBatch>, io::Result<File>) {
        let index = self
            .records
            .iter()
            .map(|record| SpilledBatch {
                start: record.start,
                len: record.len as u64,
                last_seq: record.last_seq,
            })
            .collect();
        (index, self.file.try_clone())
    }

    /// Opens a spill file an earlier worker process left, with the index its ends journal kept.
    pub(crate) fn reopen(path: PathBuf, index: &[SpilledBatch]) -> Result<Self, SpillError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|source| SpillError::Io {
                path: path.clone(),
                source,
            })?;
        let records: VecDeque<Record> = index
            .iter()
            .map(|batch| Record {
                start: batch.start,
                len: usize::try_from(batch.len).unwrap_or(usize::MAX),
                last_seq: batch.last_seq,
            })
            .collect();
        let written = records
            .back()
            .map_or(0, |last| last.start + last.len as u64);
        Ok(SpillFile {
            path,
            file,
            written,
            records,
            sent: None,
        })
    }

    /// Deletes the file.
    pub(crate) fn delete(self) -> Result<(), SpillError> {
        drop(self.file);
        std::fs::remove_file(&self.path).map_err(|source| SpillError::Io {
            path: self.path,
            source,
        })
    }
}

/// Deletes the spill files an earlier worker process left in `dir`, but those in `keep` (the
/// lines of ends its journal still holds).
pub(crate) fn remove_stale(dir: &Path, keep: &std::collections::HashSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == SUFFIX) && !keep.contains(&path) {
            match std::fs::remove_file(&path) {
                Ok(()) => tracing::info!(path = %path.display(), "deleted a stale spill file"),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "deleting a stale spill file failed")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_proto::v1::{LogBatch, LogLine, LogStream, WorkerMessage, worker_message::Body};
    use prost::Message;

    fn batch(first_seq: u64, lines: usize) -> LogFrame {
        LogFrame::of(&LogBatch {
            instance_id: 7,
            attempt: 1,
            first_seq,
            lines: (0..lines)
                .map(|n| LogLine {
                    stream: LogStream::Stdout as i32,
                    text: format!("line {}", first_seq + n as u64),
                })
                .collect(),
            ..LogBatch::default()
        })
    }

    fn first_seq(bytes: Option<Bytes>) -> u64 {
        let bytes = bytes.expect("a batch");
        match WorkerMessage::decode(bytes.as_ref()).unwrap().body {
            Some(Body::Logs(batch)) => batch.first_seq,
            other => panic!("not a log batch: {other:?}"),
        }
    }

    const KEY: AttemptKey = AttemptKey {
        instance_id: 7,
        attempt: 1,
    };

    #[test]
    fn batches_come_back_in_order_once_per_stream_and_acks_empty_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = SpillFile::create(dir.path(), KEY).unwrap();
        for first_seq in [1, 4, 6] {
            spill
                .append(&batch(first_seq, if first_seq == 1 { 3 } else { 2 }))
                .unwrap();
        }
        let mut seqs = Vec::new();
        while let Some(bytes) = spill.next_unsent(1).unwrap() {
            seqs.push(first_seq(Some(bytes)));
        }
        assert_eq!(seqs, [1, 4, 6]);
        assert!(!spill.has_unsent(1));
        // A stale stream gets nothing once a newer one reads.
        assert_eq!(first_seq(spill.next_unsent(2).unwrap()), 1);
        assert!(spill.next_unsent(1).unwrap().is_none());
        assert!(!spill.ack(3));
        // Stream 3 starts after what is acknowledged.
        assert_eq!(first_seq(spill.next_unsent(3).unwrap()), 4);
        assert!(spill.ack(7));
        let path = spill.path().to_path_buf();
        assert!(path.exists());
        spill.delete().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn stale_files_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("1-1.spill"), b"x").unwrap();
        std::fs::write(dir.path().join("2-1.spill"), b"x").unwrap();
        std::fs::write(dir.path().join("keep.txt"), b"x").unwrap();
        let journaled = std::collections::HashSet::from([dir.path().join("2-1.spill")]);
        remove_stale(dir.path(), &journaled);
        assert!(!dir.path().join("1-1.spill").exists());
        assert!(
            dir.path().join("2-1.spill").exists(),
            "an end's lines are kept"
        );
        assert!(dir.path().join("keep.txt").exists());
    }
}
