//! Held attempts: processes that outlive the worker, taken back by its next process.
//!
//! An attempt whose task says `survive_worker_restart: true` is not the worker's child. The
//! worker starts a holder (`ax-worker __hold`, [`holder`]) in a session of its own, and the
//! holder starts the task as today's runner does (its own process group, a parent-death signal
//! tied to the holder). The holder writes everything the worker needs into the attempt's
//! directory, `<state-dir>/held/<instance>-<attempt>/`:
//!
//! | file      | written by | holds                                                      |
//! |-----------|------------|------------------------------------------------------------|
//! | `attempt` | worker     | the attempt: key, timeout, whether it may be fenced         |
//! | `holder`  | holder     | the holder's pid and start time (told apart from a reused pid) |
//! | `started` | holder     | the task's pid and when it started                         |
//! | `lines`   | holder     | every read of the task's output, as spool records          |
//! | `batches` | worker     | where each batch sent to a scheduler was cut in `lines`    |
//! | `acked`   | worker     | the last line a scheduler acknowledged                     |
//! | `kill`    | worker     | why the worker ended the attempt (timeout, cancel, fence)  |
//! | `end`     | holder     | the exit status, synced before the holder exits            |
//!
//! The worker tails `lines` into batches and records each batch's boundaries before sending it,
//! so a restarted worker cuts the unacknowledged batches again exactly as they were (the store
//! keeps a batch by its first line, so a batch sent twice is stored once, and one cut
//! differently could lose lines). It signals the holder, never the task: the holder alone reaps
//! the task and knows whether its process group is still the task's.
//!
//! **Fencing.** A held task must not run beside its retry. While the worker lives, it fences
//! held attempts as any other. When it is gone, the holder fences on its own: the worker keeps
//! [`FENCE_FILE`] current (since when no live scheduler may have heard from it, and the fence
//! delay in force), and the holder kills the task once that delay has passed. A restarted
//! worker seeds its own count from the file, so restarting in a loop never resets it. The
//! clock is `CLOCK_BOOTTIME`, shared by every process of the host and blind to wall-clock
//! changes.

pub mod holder;

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;

use crate::attempts::AttemptKey;

/// The directory under the state directory that holds one directory per held attempt.
pub(crate) const HELD_DIR: &str = "held";

/// The fence file, in [`HELD_DIR`].
pub(crate) const FENCE_FILE: &str = "fence";

/// The first argument that makes `ax-worker` a holder.
pub const HOLD_COMMAND: &str = "__hold";

/// How often the holder reads the fence file, and the worker rewrites it.
pub(crate) const FENCE_TICK: Duration = Duration::from_millis(250);

/// The attempt, as the worker records it before starting its holder.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct HeldAttempt {
    #[prost(int64, tag = "1")]
    pub instance_id: i64,
    #[prost(uint32, tag = "2")]
    pub attempt: u32,
    /// 0: no timeout.
    #[prost(uint64, tag = "3")]
    pub timeout_ms: u64,
    #[prost(bool, tag = "4")]
    pub keep_when_cut_off: bool,
    #[prost(string, tag = "5")]
    pub task: String,
}

impl HeldAttempt {
    pub(crate) fn key(&self) -> AttemptKey {
        AttemptKey {
            instance_id: self.instance_id,
            attempt: self.attempt,
        }
    }
}

/// The holder process, told apart from a later process that reuses its pid.
#[derive(Clone, Copy, PartialEq, Message)]
pub(crate) struct HolderId {
    #[prost(int32, tag = "1")]
    pub pid: i32,
    /// Its start time in clock ticks after boot (`/proc/<pid>/stat`, field 22).
    #[prost(uint64, tag = "2")]
    pub start_ticks: u64,
}

/// The task's process, once started.
#[derive(Clone, Copy, PartialEq, Message)]
pub(crate) struct HeldStart {
    #[prost(uint32, tag = "1")]
    pub task_pid: u32,
    #[prost(int64, tag = "2")]
    pub started_at_ms: i64,
    #[prost(uint64, tag = "3")]
    pub started_boot_ms: u64,
}

/// How the task ended, as the holder saw it.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct HeldEnd {
    /// The raw wait status; absent when the process was not started or not seen to exit.
    #[prost(int32, optional, tag = "1")]
    pub wait_status: Option<i32>,
    #[prost(int64, tag = "2")]
    pub exited_at_ms: i64,
    /// Why the holder fenced the task itself, if it did.
    #[prost(string, tag = "3")]
    pub fenced: String,
    /// What went wrong: the task could not be started, or waiting for it failed.
    #[prost(string, tag = "4")]
    pub error: String,
    #[prost(bool, tag = "5")]
    pub spawn_failed: bool,
}

use crate::runner::KillReason;

fn encode_kill(reason: &KillReason) -> String {
    match reason {
        KillReason::Timeout => "timeout\n".into(),
        KillReason::Cancel(reason) => format!("cancel\n{reason}"),
        KillReason::Fence(reason) => format!("fence\n{reason}"),
        KillReason::Forget => "forget\n".into(),
    }
}

fn decode_kill(text: &str) -> Option<KillReason> {
    let (kind, reason) = text.split_once('\n').unwrap_or((text, ""));
    match kind {
        "timeout" => Some(KillReason::Timeout),
        "cancel" => Some(KillReason::Cancel(reason.into())),
        "fence" => Some(KillReason::Fence(reason.into())),
        "forget" => Some(KillReason::Forget),
        _ => None,
    }
}

/// One batch's place in the spool: its lines and the spool offset just past its last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Boundary {
    pub first_seq: u64,
    pub last_seq: u64,
    pub end_offset: u64,
}

const BOUNDARY_BYTES: usize = 24;

/// The directory of one held attempt.
#[derive(Debug, Clone)]
pub(crate) struct HeldDir {
    path: PathBuf,
}

impl HeldDir {
    pub(crate) fn of(state_dir: &Path, key: AttemptKey) -> HeldDir {
        HeldDir {
            path: state_dir
                .join(HELD_DIR)
                .join(format!("{}-{}", key.instance_id, key.attempt)),
        }
    }

    pub(crate) fn at(path: PathBuf) -> HeldDir {
        HeldDir { path }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    pub(crate) fn lines_path(&self) -> PathBuf {
        self.file("lines")
    }

    /// Makes the directory (0700: it holds the task's output, not yet masked) and records the
    /// attempt in it.
    pub(crate) fn create(&self, attempt: &HeldAttempt) -> io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        // A directory left by an earlier process for this very attempt is not this one's.
        if self.path.exists() {
            std::fs::remove_dir_all(&self.path)?;
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.path)?;
        write_file(&self.file("attempt"), &attempt.encode_to_vec())
    }

    pub(crate) fn attempt(&self) -> io::Result<HeldAttempt> {
        read_message(&self.file("attempt"))
    }

    pub(crate) fn write_holder(&self, holder: HolderId) -> io::Result<()> {
        write_file(&self.file("holder"), &holder.encode_to_vec())
    }

    pub(crate) fn holder(&self) -> io::Result<HolderId> {
        read_message(&self.file("holder"))
    }

    pub(crate) fn write_started(&self, started: HeldStart) -> io::Result<()> {
        write_file(&self.file("started"), &started.encode_to_vec())
    }

    pub(crate) fn started(&self) -> io::Result<HeldStart> {
        read_message(&self.file("started"))
    }

    /// Records the end durably: written aside, synced, renamed into place, and the directory
    /// synced, so a reader finds the whole end or none.
    pub(crate) fn write_end(&self, end: &HeldEnd) -> io::Result<()> {
        let aside = self.file("end.partial");
        {
            let mut file = create_private(&aside)?;
            file.write_all(&end.encode_to_vec())?;
            file.sync_all()?;
        }
        std::fs::rename(&aside, self.file("end"))?;
        std::fs::File::open(&self.path)?.sync_all()
    }

    /// The end, or `None` while the holder has written none.
    pub(crate) fn end(&self) -> io::Result<Option<HeldEnd>> {
        match read_message(&self.file("end")) {
            Ok(end) => Ok(Some(end)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Keeps why the worker ends the attempt: the first reason, except that a refusal by the
    /// scheduler (nothing is reported then) overrides any.
    pub(crate) fn note_kill(&self, reason: &KillReason) -> io::Result<()> {
        if matches!(self.kill_note(), Some(known) if *reason != KillReason::Forget || known == KillReason::Forget)
        {
            return Ok(());
        }
        write_file(&self.file("kill"), encode_kill(reason).as_bytes())
    }

    pub(crate) fn kill_note(&self) -> Option<KillReason> {
        let text = std::fs::read_to_string(self.file("kill")).ok()?;
        decode_kill(&text)
    }

    /// Appends a batch's boundary. Not synced: a worker's crash keeps the page cache, and a
    /// crash of the host takes the holder and its task with it.
    pub(crate) fn append_boundary(&self, boundary: Boundary) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        let mut record = [0u8; BOUNDARY_BYTES];
        record[..8].copy_from_slice(&boundary.first_seq.to_le_bytes());
        record[8..16].copy_from_slice(&boundary.last_seq.to_le_bytes());
        record[16..].copy_from_slice(&boundary.end_offset.to_le_bytes());
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(self.file("batches"))?;
        file.write_all(&record)
    }

    /// The boundaries recorded, in order; a torn last record is left out.
    pub(crate) fn boundaries(&self) -> io::Result<Vec<Boundary>> {
        let bytes = match std::fs::read(self.file("batches")) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(error) => return Err(error),
        };
        let word = |chunk: &[u8], at: usize| {
            let mut le = [0u8; 8];
            le.copy_from_slice(&chunk[at..at + 8]);
            u64::from_le_bytes(le)
        };
        Ok(bytes
            .chunks_exact(BOUNDARY_BYTES)
            .map(|chunk| Boundary {
                first_seq: word(chunk, 0),
                last_seq: word(chunk, 8),
                end_offset: word(chunk, 16),
            })
            .collect())
    }

    pub(crate) fn write_acked(&self, seq: u64) -> io::Result<()> {
        write_file(&self.file("acked"), seq.to_string().as_bytes())
    }

    pub(crate) fn acked(&self) -> u64 {
        std::fs::read_to_string(self.file("acked"))
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0)
    }

    pub(crate) fn remove(&self) {
        if let Err(error) = std::fs::remove_dir_all(&self.path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %self.path.display(), %error, "cannot remove a held attempt's directory");
        }
    }
}

/// The held attempts' directories under `state_dir`.
pub(crate) fn held_dirs(state_dir: &Path) -> Vec<HeldDir> {
    let Ok(entries) = std::fs::read_dir(state_dir.join(HELD_DIR)) else {
        return Vec::new();
    };
    let mut dirs: Vec<HeldDir> = entries
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        .map(|entry| HeldDir::at(entry.path()))
        .collect();
    dirs.sort_by(|a, b| a.path.cmp(&b.path));
    dirs
}

/// Reads spool records from `lines`, from an offset, as far as whole records go.
#[derive(Debug)]
pub(crate) struct SpoolReader {
    path: PathBuf,
    file: Option<std::fs::File>,
    offset: u64,
    pending: Vec<u8>,
}

/// One read of the task's output, as the holder spooled it.
#[derive(Debug, Default)]
pub(crate) struct SpoolRecord {
    pub lines: crate::logs::PackedLines,
    /// The spool offset just past this record.
    pub end_offset: u64,
}

const RECORD_HEAD: usize = 8;

/// Encodes one read as a spool record: line count, body length, a stream byte per line, body.
pub(crate) fn spool_record(lines: &crate::logs::PackedLines) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEAD + lines.streams.len() + lines.body.len());
    let count = u32::try_from(lines.streams.len()).unwrap_or(u32::MAX);
    let body = u32::try_from(lines.body.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&count.to_le_bytes());
    out.extend_from_slice(&body.to_le_bytes());
    out.extend_from_slice(&lines.streams);
    out.extend_from_slice(&lines.body);
    out
}

impl SpoolReader {
    pub(crate) fn new(path: PathBuf, offset: u64) -> SpoolReader {
        SpoolReader {
            path,
            file: None,
            offset,
            pending: Vec::new(),
        }
    }

    /// The offset just past the last whole record returned.
    pub(crate) fn offset(&self) -> u64 {
        self.offset
    }

    /// The whole records written since the last call, up to `until` (an offset) when given.
    pub(crate) fn read(&mut self, until: Option<u64>) -> io::Result<Vec<SpoolRecord>> {
        use std::io::{Seek, SeekFrom};
        if self.file.is_none() {
            match std::fs::File::open(&self.path) {
                Ok(mut file) => {
                    file.seek(SeekFrom::Start(self.offset))?;
                    self.file = Some(file);
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
                Err(error) => return Err(error),
            }
        }
        let Some(file) = self.file.as_mut() else {
            return Ok(Vec::new());
        };
        let buffered = self.offset + self.pending.len() as u64;
        match until {
            Some(until) if until > buffered => {
                let mut take = file.take(until - buffered);
                take.read_to_end(&mut self.pending)?;
            }
            Some(_) => {}
            None => {
                file.read_to_end(&mut self.pending)?;
            }
        }
        let mut records = Vec::new();
        let mut at = 0;
        loop {
            let rest = &self.pending[at..];
            if rest.len() < RECORD_HEAD {
                break;
            }
            let count = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
            let body = u32::from_le_bytes([rest[4], rest[5], rest[6], rest[7]]) as usize;
            let len = RECORD_HEAD + count + body;
            if rest.len() < len {
                break;
            }
            let lines = crate::logs::PackedLines {
                streams: rest[RECORD_HEAD..RECORD_HEAD + count].to_vec(),
                body: rest[RECORD_HEAD + count..len].to_vec(),
            };
            at += len;
            records.push(SpoolRecord {
                lines,
                end_offset: self.offset + at as u64,
            });
        }
        self.pending.drain(..at);
        self.offset += at as u64;
        Ok(records)
    }
}

/// What the worker tells its holders about fencing, in [`FENCE_FILE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FenceState {
    /// Since when (boot-clock milliseconds) no live scheduler may have heard from the worker.
    pub unheard_since_ms: u64,
    /// The scheduler's dead-worker threshold last learned; 0 when none.
    pub dead_after_ms: u64,
    /// The fence delay in force; `None`: the worker does not fence.
    pub delay_ms: Option<u64>,
}

impl FenceState {
    pub(crate) fn write(&self, held_dir: &Path) -> io::Result<()> {
        let text = format!(
            "{} {} {}\n",
            self.unheard_since_ms,
            self.dead_after_ms,
            self.delay_ms
                .map_or_else(|| "off".to_string(), |ms| ms.to_string())
        );
        write_file(&held_dir.join(FENCE_FILE), text.as_bytes())
    }

    pub(crate) fn read(held_dir: &Path) -> Option<FenceState> {
        let text = std::fs::read_to_string(held_dir.join(FENCE_FILE)).ok()?;
        let mut words = text.split_whitespace();
        let unheard_since_ms = words.next()?.parse().ok()?;
        let dead_after_ms = words.next()?.parse().ok()?;
        let delay_ms = match words.next()? {
            "off" => None,
            ms => Some(ms.parse().ok()?),
        };
        Some(FenceState {
            unheard_since_ms,
            dead_after_ms,
            delay_ms,
        })
    }

    /// When the holder must fence (boot-clock milliseconds); `None`: never.
    pub(crate) fn deadline_ms(&self) -> Option<u64> {
        self.delay_ms
            .map(|delay| self.unheard_since_ms.saturating_add(delay))
    }
}

/// Writes the worker's [`FenceState`] for its holders: every [`FENCE_TICK`], and before each
/// holder starts, so that no holder starts on a state older than the dispatch it runs.
#[derive(Debug)]
pub(crate) struct FenceWriter {
    liveness: std::sync::Arc<crate::fence::Liveness>,
    self_fence_after: Option<Duration>,
    held_root: PathBuf,
    /// One writer at a time: they share the file's aside name.
    writing: std::sync::Mutex<()>,
}

impl FenceWriter {
    pub(crate) fn new(
        liveness: std::sync::Arc<crate::fence::Liveness>,
        self_fence_after: Option<Duration>,
        held_root: PathBuf,
    ) -> FenceWriter {
        FenceWriter {
            liveness,
            self_fence_after,
            held_root,
            writing: std::sync::Mutex::new(()),
        }
    }

    pub(crate) fn write_now(&self) -> io::Result<()> {
        let millis = |duration: Duration| u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
        let dead_after = self.liveness.dead_after();
        let state = FenceState {
            unheard_since_ms: boot_ms().saturating_sub(millis(self.liveness.unheard_for())),
            dead_after_ms: dead_after.map_or(0, millis),
            delay_ms: self
                .self_fence_after
                .map(|configured| millis(crate::fence::effective_delay(configured, dead_after))),
        };
        let _writing = self
            .writing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        state.write(&self.held_root)
    }
}

/// Milliseconds of `CLOCK_BOOTTIME`: the same for every process of the host, counting suspend,
/// and not moved by changes to the wall clock.
pub(crate) fn boot_ms() -> u64 {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    u64::try_from(now.tv_sec).unwrap_or(0) * 1000
        + u64::try_from(now.tv_nsec).unwrap_or(0) / 1_000_000
}

/// The start time of process `pid` in clock ticks after boot, `None` when it does not exist.
pub(crate) fn start_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields after it do not.
    let after_name = &stat[stat.rfind(')')? + 1..];
    // Field 22 overall is the 20th after the name (state is the 3rd field).
    after_name.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the holder `id` still runs (and is not a later process under its pid).
pub(crate) fn holder_alive(id: HolderId) -> bool {
    start_ticks(id.pid) == Some(id.start_ticks)
}

fn create_private(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
}

/// Writes `bytes` aside and renames them into place, so a reader sees the old or the new whole.
fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".partial");
    let aside = PathBuf::from(aside);
    create_private(&aside)?.write_all(bytes)?;
    std::fs::rename(&aside, path)
}

fn read_message<M: Message + Default>(path: &Path) -> io::Result<M> {
    let bytes = std::fs::read(path)?;
    M::decode(bytes.as_slice()).map_err(|error| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {error}", path.display()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logs::PackedLines;

    fn key() -> AttemptKey {
        AttemptKey {
            instance_id: 7,
            attempt: 2,
        }
    }

    #[test]
    fn the_spool_gives_whole_records_only_and_resumes_where_it_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines");
        let first = spool_record(&PackedLines {
            streams: vec![1, 2],
            body: b"a\nbb".to_vec(),
        });
        let second = spool_record(&PackedLines {
            streams: vec![1],
            body: b"ccc".to_vec(),
        });
        let mut file = std::fs::File::create(&path).unwrap();
        file.write_all(&first).unwrap();
        // Half of the second record: a holder in the middle of its write.
        file.write_all(&second[..5]).unwrap();
        let mut reader = SpoolReader::new(path.clone(), 0);
        let records = reader.read(None).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].lines.body, b"a\nbb");
        assert_eq!(records[0].end_offset, first.len() as u64);
        file.write_all(&second[5..]).unwrap();
        let records = reader.read(None).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].lines.streams, [1]);
        assert_eq!(reader.offset(), (first.len() + second.len()) as u64);

        // A reader bounded by an offset stops there; another resumes from an offset.
        let mut bounded = SpoolReader::new(path.clone(), 0);
        assert_eq!(bounded.read(Some(first.len() as u64)).unwrap().len(), 1);
        assert_eq!(bounded.read(Some(first.len() as u64)).unwrap().len(), 0);
        let mut resumed = SpoolReader::new(path, first.len() as u64);
        assert_eq!(resumed.read(None).unwrap()[0].lines.body, b"ccc");
    }

    #[test]
    fn a_held_directory_keeps_the_first_kill_reason_and_its_boundaries() {
        let state = tempfile::tempdir().unwrap();
        let dir = HeldDir::of(state.path(), key());
        dir.create(&HeldAttempt {
            instance_id: 7,
            attempt: 2,
            timeout_ms: 1000,
            keep_when_cut_off: false,
            task: "t".into(),
        })
        .unwrap();
        assert_eq!(dir.attempt().unwrap().key(), key());
        assert_eq!(dir.kill_note(), None);
        dir.note_kill(&KillReason::Timeout).unwrap();
        dir.note_kill(&KillReason::Cancel("late".into())).unwrap();
        assert_eq!(dir.kill_note(), Some(KillReason::Timeout));
        // A refusal by the scheduler overrides: nothing is reported then.
        dir.note_kill(&KillReason::Forget).unwrap();
        assert_eq!(dir.kill_note(), Some(KillReason::Forget));

        for (first_seq, last_seq, end_offset) in [(1, 3, 40), (4, 4, 52)] {
            dir.append_boundary(Boundary {
                first_seq,
                last_seq,
                end_offset,
            })
            .unwrap();
        }
        // A torn record at the end is not a boundary.
        std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("batches"))
            .unwrap()
            .write_all(&[1, 2, 3])
            .unwrap();
        let boundaries = dir.boundaries().unwrap();
        assert_eq!(boundaries.len(), 2);
        assert_eq!(boundaries[1].end_offset, 52);

        assert_eq!(dir.end().unwrap(), None);
        let end = HeldEnd {
            wait_status: Some(0),
            exited_at_ms: 5,
            ..HeldEnd::default()
        };
        dir.write_end(&end).unwrap();
        assert_eq!(dir.end().unwrap(), Some(end));
        assert_eq!(held_dirs(state.path()).len(), 1);
        dir.remove();
        assert!(held_dirs(state.path()).is_empty());
    }

    #[test]
    fn the_fence_file_round_trips_and_gives_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let state = FenceState {
            unheard_since_ms: 1_000,
            dead_after_ms: 20_000,
            delay_ms: Some(15_000),
        };
        state.write(dir.path()).unwrap();
        assert_eq!(FenceState::read(dir.path()), Some(state));
        assert_eq!(state.deadline_ms(), Some(16_000));
        let off = FenceState {
            delay_ms: None,
            ..state
        };
        off.write(dir.path()).unwrap();
        assert_eq!(FenceState::read(dir.path()).unwrap().deadline_ms(), None);
    }

    #[test]
    fn a_process_is_told_apart_from_a_later_one_under_its_pid() {
        let me = i32::try_from(std::process::id()).unwrap();
        let ticks = start_ticks(me).expect("our own stat");
        assert!(holder_alive(HolderId {
            pid: me,
            start_ticks: ticks
        }));
        assert!(!holder_alive(HolderId {
            pid: me,
            start_ticks: ticks + 1
        }));
        assert!(boot_ms() > 0);
    }
}
