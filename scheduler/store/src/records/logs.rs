//! Log lines: the packed chunks a worker sends and the store keeps as rows, and a stored line as
//! read back.

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// Consecutive lines of one attempt, stored as one row. Appending a chunk whose
/// (instance, attempt, first_seq) is already stored is a no-op (a resend after a reconnect).
///
/// The lines are kept packed, as the worker sends them and as the row stores them: one stream
/// per line, and the lines' text joined by `'\n'` (no line contains one). A batch of a thousand
/// lines is two buffers, never a thousand strings.
#[derive(Debug, Clone, PartialEq)]
pub struct LogChunk {
    pub instance_id: InstanceId,
    pub attempt: Attempt,
    /// 1-based line number of the first line.
    pub first_seq: u64,
    pub(crate) streams: Vec<LogStream>,
    pub(crate) body: String,
    pub at: Millis,
}

/// Why packed lines were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{lines} stream entries for {newlines} line breaks; packed lines need one entry per line")]
pub struct MispackedLines {
    pub lines: usize,
    pub newlines: usize,
}

impl LogChunk {
    /// A chunk of separate lines; a `'\n'` inside a line is replaced with a space.
    pub fn from_lines<S: AsRef<str>>(
        instance_id: InstanceId,
        attempt: Attempt,
        first_seq: u64,
        lines: impl IntoIterator<Item = (LogStream, S)>,
        at: Millis,
    ) -> LogChunk {
        let mut streams = Vec::new();
        let mut body = String::new();
        for (stream, text) in lines {
            if !streams.is_empty() {
                body.push('\n');
            }
            streams.push(stream);
            let text = text.as_ref();
            if text.contains('\n') {
                body.push_str(&text.replace('\n', " "));
            } else {
                body.push_str(text);
            }
        }
        LogChunk {
            instance_id,
            attempt,
            first_seq,
            streams,
            body,
            at,
        }
    }

    /// A chunk of packed lines: `body` holds the lines joined by `'\n'`, one per entry of
    /// `streams`.
    pub fn packed(
        instance_id: InstanceId,
        attempt: Attempt,
        first_seq: u64,
        streams: Vec<LogStream>,
        body: String,
        at: Millis,
    ) -> Result<LogChunk, MispackedLines> {
        let newlines = memchr::memchr_iter(b'\n', body.as_bytes()).count();
        let consistent = if streams.is_empty() {
            body.is_empty()
        } else {
            newlines == streams.len() - 1
        };
        if !consistent {
            return Err(MispackedLines {
                lines: streams.len(),
                newlines,
            });
        }
        Ok(LogChunk {
            instance_id,
            attempt,
            first_seq,
            streams,
            body,
            at,
        })
    }

    pub fn line_count(&self) -> usize {
        self.streams.len()
    }

    /// The line number of the last line (`first_seq - 1` when there is none).
    pub fn last_seq(&self) -> u64 {
        (self.first_seq + self.streams.len() as u64).saturating_sub(1)
    }

    /// The stream of each line, in order.
    pub fn streams(&self) -> &[LogStream] {
        &self.streams
    }

    /// The lines' text joined by `'\n'`.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// Masks every occurrence of each of `values` (none holding a line break) with `mask`: in a
    /// line, across the lines of a stream (where a worker cut a long line), and pieces of at
    /// least `min_piece` bytes at the chunk's edges ([`ax_core::mask`]). The lines stay as
    /// they are otherwise.
    /// Whether [`LogChunk::mask`] with these values would mask anything.
    pub fn would_mask(&self, values: &[String], min_piece: usize) -> bool {
        let rules = ax_core::mask::MaskRules {
            starts_attempt: self.first_seq <= 1,
            min_piece,
        };
        ax_core::mask::mask_lines(&self.streams, &self.body, values, "", rules).is_some()
    }

    pub fn mask(&mut self, values: &[String], mask: &str, min_piece: usize) {
        let rules = ax_core::mask::MaskRules {
            starts_attempt: self.first_seq <= 1,
            min_piece,
        };
        if let Some(masked) =
            ax_core::mask::mask_lines(&self.streams, &self.body, values, mask, rules)
        {
            self.body = masked;
        }
    }

    /// The lines in order.
    pub fn lines(&self) -> impl Iterator<Item = (LogStream, &str)> {
        let texts = (!self.streams.is_empty())
            .then(|| self.body.split('\n'))
            .into_iter()
            .flatten();
        self.streams.iter().copied().zip(texts)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct StoredLine {
    pub seq: u64,
    pub stream: LogStream,
    pub text: String,
    pub at: Millis,
}
