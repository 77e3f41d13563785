//! The log pump: reads a child's stdout or stderr line by line in bounded chunks, and groups the
//! lines of one attempt into numbered batches.

use std::time::Duration;

use ax_proto::v1::{LogBatch, LogStream};
use prost::bytes::Bytes;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The capacity a chatty task's pipe is grown to (Linux's default is 64 KiB), so that it writes
/// on while the worker is busy elsewhere: with it W4's task ran in 0.53 s, without in 0.68 s
/// (`seq` to /dev/null: 0.22 s). Only pipes that showed a backlog are grown: the kernel counts
/// every pipe's capacity against the user's `pipe-user-pages-soft` (64 MiB), past which new
/// pipes of that user get two pages. The kernel caps it at `pipe-max-size` (1 MiB); a refusal
/// leaves the pipe as it was.
const CHATTY_PIPE_CAPACITY: i32 = 1 << 20;

/// The longest output line ax-worker keeps whole by default (`WorkerOptions::max_line_bytes`):
/// 1 MiB. A longer line is cut into lines of this size; `docs/web-ui.md` tells users so.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Bytes read from a pipe at once. Reading in chunks of this size (instead of `read_line`) keeps
/// memory bounded even when a task prints gigabytes without a newline.
const READ_CHUNK: usize = 16 * 1024;

/// When a batch is sent.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    pub max_lines: usize,
    pub max_bytes: usize,
    /// How long the first line of a batch may wait for company.
    pub max_delay: Duration,
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits {
            max_lines: 4_096,
            max_bytes: 256 * 1024,
            max_delay: Duration::from_millis(50),
        }
    }
}

/// Lines of one read from a pipe, packed as `LogBatch` carries them: one stream byte per line
/// and the lines' text joined by `'\n'`, so that no line is ever held as a string of its own and
/// a read of short lines is copied in one piece.
#[derive(Debug, Default)]
pub struct PackedLines {
    pub streams: Vec<u8>,
    /// Valid UTF-8.
    pub body: Vec<u8>,
}

impl PackedLines {
    pub fn count(&self) -> u64 {
        self.streams.len() as u64
    }

    /// Appends `lines` lines of `stream` whose text, joined by `'\n'`, is `text` (valid UTF-8).
    fn push_block(&mut self, stream: LogStream, text: &[u8], lines: usize) {
        if !self.streams.is_empty() {
            self.body.push(b'\n');
        }
        self.body.extend_from_slice(text);
        self.streams
            .extend(std::iter::repeat_n(stream as u8, lines));
    }

    /// Appends one line of raw output, replacing invalid UTF-8 with U+FFFD.
    fn push_output(&mut self, stream: LogStream, raw: &[u8]) {
        match std::str::from_utf8(raw) {
            Ok(_) => self.push_block(stream, raw, 1),
            Err(_) => self.push_block(stream, String::from_utf8_lossy(raw).as_bytes(), 1),
        }
    }

    /// Appends the lines of a later read.
    fn append(&mut self, later: PackedLines) {
        if later.streams.is_empty() {
            return;
        }
        if self.streams.is_empty() && self.body.capacity() < later.body.len() {
            *self = later;
            return;
        }
        if !self.streams.is_empty() {
            self.body.push(b'\n');
        }
        self.body.extend_from_slice(&later.body);
        self.streams.extend_from_slice(&later.streams);
    }
}

/// The number of lines in `text` (split on `'\n'`) and the length of the longest.
fn line_stats(text: &[u8]) -> (usize, usize) {
    let (mut lines, mut longest, mut start) = (1, 0, 0);
    for at in memchr::memchr_iter(b'\n', text) {
        longest = longest.max(at - start);
        start = at + 1;
        lines += 1;
    }
    (lines, longest.max(text.len() - start))
}

fn encode_len(len: usize, out: &mut Vec<u8>) {
    prost::encode_length_delimiter(len, out).expect("a Vec grows as needed");
}

/// Reads `reader` until end of file and pushes its lines into `lines`, packed, as one message
/// per read (every line a read completed), not one per line: a task printing a million short
/// lines costs a few thousand channel hand-offs and no allocation per line; a read that holds
/// only whole lines of valid text within the limit is copied in one piece. Lines are split on
/// `\n` (which is removed; everything else, `\r` included, is kept), lines longer than
/// `max_line_bytes` are cut into several lines at a UTF-8 character boundary, and invalid UTF-8
/// is replaced with U+FFFD. A read error ends the pump like end of file: a broken pipe must not
/// end the attempt. `grow` is the pipe's descriptor, grown once a read finds a full chunk
/// waiting. Returns the number of lines pushed.
pub async fn pump_lines<R>(
    reader: R,
    stream: LogStream,
    max_line_bytes: usize,
    mut grow: Option<std::os::fd::RawFd>,
    lines: mpsc::Sender<PackedLines>,
) -> u64
where
    R: AsyncRead + Unpin,
{
    let max_line_bytes = max_line_bytes.max(4);
    let mut reader = BufReader::with_capacity(READ_CHUNK, reader);
    let mut pending: Vec<u8> = Vec::new();
    let mut pushed = 0u64;
    // Cuts `pending` into lines of at most `max_line_bytes` while it is longer than that.
    let cut_long = |pending: &mut Vec<u8>, out: &mut PackedLines| {
        while pending.len() > max_line_bytes {
            let cut = utf8_cut(pending, max_line_bytes);
            let rest = pending.split_off(cut);
            out.push_output(stream, pending);
            *pending = rest;
        }
    };
    loop {
        let chunk = match reader.fill_buf().await {
            Ok(chunk) => chunk,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => {
                tracing::warn!(%error, ?stream, "reading task output failed; treating it as end of output");
                break;
            }
        };
        if chunk.is_empty() {
            break;
        }
        if chunk.len() == READ_CHUNK
            && let Some(fd) = grow.take()
        {
            // SAFETY: fcntl(2) on a pipe the caller's reader owns and keeps open; it only
            // changes the pipe's capacity.
            unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, CHATTY_PIPE_CAPACITY) };
        }
        let mut out = PackedLines::default();
        let mut rest = chunk;
        if pending.is_empty()
            && let Some(last) = memchr::memrchr(b'\n', rest)
        {
            let whole = &rest[..last];
            let (count, longest) = line_stats(whole);
            if longest <= max_line_bytes && std::str::from_utf8(whole).is_ok() {
                out.body.reserve(chunk.len());
                out.push_block(stream, whole, count);
                rest = &rest[last + 1..];
            }
        }
        while let Some(newline) = memchr::memchr(b'\n', rest) {
            let line = &rest[..newline];
            if pending.is_empty() && line.len() <= max_line_bytes {
                out.push_output(stream, line);
            } else {
                pending.extend_from_slice(line);
                cut_long(&mut pending, &mut out);
                out.push_output(stream, &pending);
                pending.clear();
            }
            rest = &rest[newline + 1..];
        }
        pending.extend_from_slice(rest);
        cut_long(&mut pending, &mut out);
        let consumed = chunk.len();
        reader.consume(consumed);
        let n = out.count();
        if n > 0 {
            if lines.send(out).await.is_err() {
                return pushed;
            }
            pushed += n;
        }
    }
    if !pending.is_empty() {
        let mut out = PackedLines::default();
        out.push_output(stream, &pending);
        if lines.send(out).await.is_ok() {
            pushed += 1;
        }
    }
    pushed
}

/// The largest cut point at or below `max` that does not split a UTF-8 sequence, so that a long
/// line of valid text is split into valid pieces. Falls back to `max` for bytes that are not valid
/// UTF-8 anyway.
fn utf8_cut(bytes: &[u8], max: usize) -> usize {
    let is_continuation = |byte: u8| byte & 0xC0 == 0x80;
    let mut cut = max;
    while cut > 0 && max - cut < 4 && cut < bytes.len() && is_continuation(bytes[cut]) {
        cut -= 1;
    }
    if cut == 0 || max - cut >= 4 { max } else { cut }
}

/// A cut batch of one attempt's lines, encoded once as the `WorkerMessage` that carries it and
/// kept as these bytes until the scheduler acknowledges it: sending, replaying and spilling it
/// copy no line.
#[derive(Debug, Clone)]
pub struct LogFrame {
    pub first_seq: u64,
    pub last_seq: u64,
    pub bytes: Bytes,
}

impl LogFrame {
    /// Encodes a batch the slow way, for tests.
    #[cfg(test)]
    pub fn of(batch: &LogBatch) -> LogFrame {
        use prost::Message;
        let message = ax_proto::v1::WorkerMessage {
            body: Some(ax_proto::v1::worker_message::Body::Logs(batch.clone())),
        };
        LogFrame {
            first_seq: batch.first_seq,
            last_seq: batch.first_seq + (batch.line_count() as u64).saturating_sub(1),
            bytes: message.encode_to_vec().into(),
        }
    }
}

/// Numbers the lines of one attempt from 1 in arrival order and groups them into batches.
#[derive(Debug)]
pub struct Batcher {
    limits: BatchLimits,
    next_seq: u64,
    lines: PackedLines,
    first_at: Option<Instant>,
}

impl Batcher {
    pub fn new(limits: BatchLimits) -> Self {
        Batcher {
            limits,
            next_seq: 1,
            lines: PackedLines::default(),
            first_at: None,
        }
    }

    /// Adds the lines of one read; returns true when the batch is full and should be taken now.
    /// (A batch may exceed the limits by the lines of one read.)
    pub fn push(&mut self, read: PackedLines) -> bool {
        if read.count() == 0 {
            return false;
        }
        if self.lines.count() == 0 {
            self.first_at = Some(Instant::now());
        }
        if self.lines.count() > 0 && self.lines.body.capacity() < self.limits.max_bytes {
            // A chatty attempt: its batch is sized once for a full batch and kept across batches
            // (`take` clears it), so no batch grows by reallocation or frees its buffer.
            let lines = &mut self.lines;
            lines
                .body
                .reserve(self.limits.max_bytes + READ_CHUNK - lines.body.len());
            lines
                .streams
                .reserve(self.limits.max_lines + READ_CHUNK - lines.streams.len());
        }
        self.lines.append(read);
        self.lines.count() >= self.limits.max_lines as u64
            || self.lines.body.len() >= self.limits.max_bytes
    }

    /// When the pending batch must be sent even if it is not full.
    pub fn deadline(&self) -> Option<Instant> {
        self.first_at.map(|first| first + self.limits.max_delay)
    }

    /// Takes the pending lines as a batch, if there are any.
    pub fn take(&mut self, instance_id: i64, attempt: u32, sent_at_ms: i64) -> Option<LogFrame> {
        use prost::Message;
        let count = self.lines.count();
        if count == 0 {
            return None;
        }
        let lines = &mut self.lines;
        let first_seq = self.next_seq;
        let last_seq = first_seq + count - 1;
        self.next_seq = last_seq + 1;
        self.first_at = None;
        // The batch without its lines, then the two packed fields: fields may come in any order.
        let header = LogBatch {
            instance_id,
            attempt,
            first_seq,
            sent_at_ms,
            ..LogBatch::default()
        };
        const LOGS_KEY: u8 = 5 << 3 | 2; // WorkerMessage.logs
        const STREAMS_KEY: u8 = 6 << 3 | 2; // LogBatch.streams
        const BODY_KEY: u8 = 7 << 3 | 2; // LogBatch.body
        let field_len = |len: usize| 1 + prost::length_delimiter_len(len) + len;
        let batch_len =
            header.encoded_len() + field_len(lines.streams.len()) + field_len(lines.body.len());
        let mut bytes = Vec::with_capacity(field_len(batch_len));
        bytes.push(LOGS_KEY);
        encode_len(batch_len, &mut bytes);
        header.encode(&mut bytes).expect("a Vec grows as needed");
        bytes.push(STREAMS_KEY);
        encode_len(lines.streams.len(), &mut bytes);
        bytes.extend_from_slice(&lines.streams);
        bytes.push(BODY_KEY);
        encode_len(lines.body.len(), &mut bytes);
        bytes.extend_from_slice(&lines.body);
        lines.streams.clear();
        lines.body.clear();
        Some(LogFrame {
            first_seq,
            last_seq,
            bytes: bytes.into(),
        })
    }

    /// Lines taken into batches so far: the seq of the last line sent.
    pub fn lines_taken(&self) -> u64 {
        self.next_seq - 1
    }

    /// Lines pushed and not yet taken.
    pub fn pending_lines(&self) -> u64 {
        self.lines.count()
    }

    /// Numbers the next batch from `next_seq`: a restarted worker goes on where the batches an
    /// earlier process cut end (a held attempt's).
    pub fn resume_at(&mut self, next_seq: u64) {
        self.next_seq = next_seq.max(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ax_proto::v1::{WorkerMessage, worker_message::Body};
    use prost::Message;

    async fn pump(input: &[u8], max: usize) -> Vec<String> {
        let (tx, mut rx) = mpsc::channel(1024);
        let count = pump_lines(input, LogStream::Stdout, max, None, tx).await;
        let mut out = Vec::new();
        while let Some(read) = rx.recv().await {
            assert!(read.streams.iter().all(|&s| s == LogStream::Stdout as u8));
            let body = String::from_utf8(read.body).expect("packed text is UTF-8");
            let lines: Vec<String> = body.split('\n').map(str::to_string).collect();
            assert_eq!(lines.len(), read.streams.len(), "{body:?}");
            out.extend(lines);
        }
        assert_eq!(count as usize, out.len());
        out
    }

    #[tokio::test]
    async fn splits_on_newline_and_keeps_the_rest() {
        assert_eq!(pump(b"a\n\nb\r\nlast", 64).await, ["a", "", "b\r", "last"]);
        assert!(pump(b"", 64).await.is_empty());
    }

    #[tokio::test]
    async fn long_lines_are_split_at_character_boundaries() {
        let text = "é".repeat(10); // 20 bytes
        let lines = pump(format!("{text}\n").as_bytes(), 7).await;
        assert_eq!(lines.concat(), text);
        assert!(
            lines
                .iter()
                .all(|line| line.len() <= 7 && !line.contains('\u{FFFD}')),
            "{lines:?}"
        );
        let big = vec![b'x'; 100_000];
        let lines = pump(&big, 16 * 1024).await;
        assert_eq!(lines.len(), 7);
        assert_eq!(lines.iter().map(String::len).sum::<usize>(), 100_000);
        // Lengths that take multi-byte varints encode correctly too.
        let long = "y".repeat(300);
        assert_eq!(pump(format!("{long}\n").as_bytes(), 1 << 20).await, [long]);
    }

    #[tokio::test]
    async fn invalid_utf8_is_replaced() {
        assert_eq!(pump(b"a\xffb\n", 64).await, ["a\u{FFFD}b"]);
    }

    fn read_of(stream: LogStream, texts: &[&str]) -> PackedLines {
        let mut read = PackedLines::default();
        for text in texts {
            read.push_output(stream, text.as_bytes());
        }
        read
    }

    fn batch_of(frame: &LogFrame) -> LogBatch {
        match WorkerMessage::decode(frame.bytes.as_ref())
            .expect("frame decodes")
            .body
        {
            Some(Body::Logs(batch)) => batch,
            other => panic!("not a log batch: {other:?}"),
        }
    }

    #[test]
    fn batcher_numbers_lines_from_one_and_frames_decode_as_log_batches() {
        let limits = BatchLimits {
            max_lines: 2,
            max_bytes: 1 << 20,
            max_delay: Duration::from_millis(50),
        };
        let mut batcher = Batcher::new(limits);
        assert!(batcher.take(1, 1, 0).is_none());
        assert!(!batcher.push(read_of(LogStream::Stdout, &["a"])));
        assert!(!batcher.push(PackedLines::default()));
        assert!(batcher.deadline().is_some());
        assert!(batcher.push(read_of(LogStream::Stderr, &["b"])));
        let frame = batcher.take(7, 3, 99).expect("batch");
        assert_eq!((frame.first_seq, frame.last_seq), (1, 2));
        let batch = batch_of(&frame);
        assert_eq!(
            (
                batch.instance_id,
                batch.attempt,
                batch.first_seq,
                batch.sent_at_ms
            ),
            (7, 3, 1, 99)
        );
        assert!(batch.lines.is_empty(), "lines are sent packed");
        assert_eq!(
            batch.texts().expect("consistent"),
            [(LogStream::Stdout, "a"), (LogStream::Stderr, "b")]
        );
        batcher.push(read_of(LogStream::Stdout, &["c", ""]));
        batcher.push(read_of(LogStream::Stdout, &["", "f"]));
        let frame = batcher.take(7, 3, 0).expect("batch");
        assert_eq!((frame.first_seq, frame.last_seq), (3, 6));
        let batch = batch_of(&frame);
        let texts: Vec<&str> = batch
            .texts()
            .expect("consistent")
            .into_iter()
            .map(|(_, text)| text)
            .collect();
        assert_eq!(texts, ["c", "", "", "f"], "empty lines survive the joins");
        assert_eq!(batcher.lines_taken(), 6);
        assert!(batcher.deadline().is_none());
    }
}
