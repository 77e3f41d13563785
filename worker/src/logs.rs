//! The log pump: reads a child's stdout or stderr line by line in bounded chunks, and groups the
//! lines of one attempt into numbered batches.

use std::time::Duration;

use ax_proto::v1::{LogBatch, LogLine, LogStream};
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::sync::mpsc;
use tokio::time::Instant;

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
            max_lines: 500,
            max_bytes: 256 * 1024,
            max_delay: Duration::from_millis(50),
        }
    }
}

/// Reads `reader` until end of file and pushes its lines into `lines`, as one message per read
/// (every line a read completed), not one per line: a task printing a million short lines
/// costs a few thousand channel hand-offs instead of a million. Lines are split on `\n` (which
/// is removed; everything else, `\r` included, is kept), lines longer than `max_line_bytes` are
/// cut into several lines at a UTF-8 character boundary, and invalid UTF-8 is replaced with
/// U+FFFD. A read error ends the pump like end of file: a broken pipe must not end the attempt.
/// Returns the number of lines pushed.
pub async fn pump_lines<R>(
    reader: R,
    stream: LogStream,
    max_line_bytes: usize,
    lines: mpsc::Sender<Vec<LogLine>>,
) -> u64
where
    R: AsyncRead + Unpin,
{
    let max_line_bytes = max_line_bytes.max(4);
    let mut reader = BufReader::with_capacity(READ_CHUNK, reader);
    let mut pending: Vec<u8> = Vec::new();
    let mut pushed = 0u64;
    let emit = |bytes: &[u8], out: &mut Vec<LogLine>| {
        out.push(LogLine {
            stream: stream as i32,
            text: String::from_utf8_lossy(bytes).into_owned(),
        })
    };
    // Cuts `pending` into lines of at most `max_line_bytes` while it is longer than that.
    let cut_long = |pending: &mut Vec<u8>, out: &mut Vec<LogLine>| {
        while pending.len() > max_line_bytes {
            let cut = utf8_cut(pending, max_line_bytes);
            let rest = pending.split_off(cut);
            emit(pending, out);
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
        let mut out = Vec::new();
        let mut rest = chunk;
        while let Some(newline) = rest.iter().position(|&byte| byte == b'\n') {
            let line = &rest[..newline];
            if pending.is_empty() && line.len() <= max_line_bytes {
                emit(line, &mut out);
            } else {
                pending.extend_from_slice(line);
                cut_long(&mut pending, &mut out);
                emit(&pending, &mut out);
                pending.clear();
            }
            rest = &rest[newline + 1..];
        }
        pending.extend_from_slice(rest);
        cut_long(&mut pending, &mut out);
        let consumed = chunk.len();
        reader.consume(consumed);
        let n = out.len() as u64;
        if n > 0 {
            if lines.send(out).await.is_err() {
                return pushed;
            }
            pushed += n;
        }
    }
    if !pending.is_empty() {
        let mut out = Vec::new();
        emit(&pending, &mut out);
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

/// Numbers the lines of one attempt from 1 in arrival order and groups them into batches.
#[derive(Debug)]
pub struct Batcher {
    limits: BatchLimits,
    next_seq: u64,
    lines: Vec<LogLine>,
    bytes: usize,
    first_at: Option<Instant>,
}

impl Batcher {
    pub fn new(limits: BatchLimits) -> Self {
        Batcher {
            limits,
            next_seq: 1,
            lines: Vec::new(),
            bytes: 0,
            first_at: None,
        }
    }

    /// Adds a line; returns true when the batch is full and should be taken now.
    pub fn push(&mut self, line: LogLine) -> bool {
        if self.lines.is_empty() {
            self.first_at = Some(Instant::now());
        }
        self.bytes += line.text.len();
        self.lines.push(line);
        self.lines.len() >= self.limits.max_lines || self.bytes >= self.limits.max_bytes
    }

    /// When the pending batch must be sent even if it is not full.
    pub fn deadline(&self) -> Option<Instant> {
        self.first_at.map(|first| first + self.limits.max_delay)
    }

    /// Takes the pending lines as a batch, if there are any.
    pub fn take(&mut self, instance_id: i64, attempt: u32, sent_at_ms: i64) -> Option<LogBatch> {
        if self.lines.is_empty() {
            return None;
        }
        let lines = std::mem::take(&mut self.lines);
        let first_seq = self.next_seq;
        self.next_seq += lines.len() as u64;
        self.bytes = 0;
        self.first_at = None;
        Some(LogBatch {
            instance_id,
            attempt,
            first_seq,
            lines,
            sent_at_ms,
        })
    }

    /// Lines taken into batches so far: the seq of the last line sent.
    pub fn lines_taken(&self) -> u64 {
        self.next_seq - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn pump(input: &[u8], max: usize) -> Vec<String> {
        let (tx, mut rx) = mpsc::channel(1024);
        let count = pump_lines(input, LogStream::Stdout, max, tx).await;
        let mut out = Vec::new();
        while let Some(lines) = rx.recv().await {
            out.extend(lines.into_iter().map(|line| line.text));
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
    }

    #[tokio::test]
    async fn invalid_utf8_is_replaced() {
        assert_eq!(pump(b"a\xffb\n", 64).await, ["a\u{FFFD}b"]);
    }

    #[test]
    fn batcher_numbers_lines_from_one() {
        let limits = BatchLimits {
            max_lines: 2,
            max_bytes: 1 << 20,
            max_delay: Duration::from_millis(50),
        };
        let mut batcher = Batcher::new(limits);
        let line = |text: &str| LogLine {
            stream: LogStream::Stdout as i32,
            text: text.into(),
        };
        assert!(batcher.take(1, 1, 0).is_none());
        assert!(!batcher.push(line("a")));
        assert!(batcher.deadline().is_some());
        assert!(batcher.push(line("b")));
        let batch = batcher.take(1, 1, 0).expect("batch");
        assert_eq!((batch.first_seq, batch.lines.len()), (1, 2));
        batcher.push(line("c"));
        let batch = batcher.take(1, 1, 0).expect("batch");
        assert_eq!((batch.first_seq, batch.lines.len()), (3, 1));
        assert_eq!(batcher.lines_taken(), 3);
        assert!(batcher.deadline().is_none());
    }
}
