//! Execution logs: appending workers' chunks of lines and reading them back a page at a time.
//!
//! Lines are stored as chunks, one row per (instance, attempt, first line number) holding the
//! lines' text joined by newlines and one stream letter per line, so an append of many lines
//! costs a few multi-row inserts, and a resent chunk is skipped by its key. Reads are ranges of
//! that key, so a page costs the same at the first line and at the millionth.

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId};
use sqlx::{AnyConnection, Row};

use std::collections::BTreeSet;

use super::rows::corrupt;
use super::{INSERT_CHUNK, Store, values_rows, write_tx};
use crate::{LogChunk, LogStream, Result, StoredLine};

/// Text bytes of log lines per insert statement.
const LOG_STATEMENT_BYTES: usize = 4 << 20;

impl Store {
    pub async fn append_logs(&self, chunks: &[LogChunk]) -> Result<()> {
        if chunks.iter().all(|chunk| chunk.line_count() == 0) {
            return Ok(());
        }
        write_tx!(self, |c| append_logs_tx(self, c, chunks))
    }

    /// Appends workers' chunks as [`Store::append_logs`] does, except those whose sender is
    /// not the worker the attempt was dispatched to. `senders[i]` is `None` for a chunk the
    /// node already knows is its sender's (an attempt it dispatched or re-attached on that
    /// stream), or `Some(worker)` to check, in the same transaction, that the attempt exists and
    /// was dispatched to `worker`. Answers, per chunk, whether it was kept: a refused chunk
    /// (another worker's attempt, one that does not exist yet) is not stored, so no line can be
    /// written ahead for an attempt to come.
    pub async fn append_worker_logs(
        &self,
        chunks: &[LogChunk],
        senders: &[Option<&str>],
    ) -> Result<Vec<bool>> {
        if chunks.iter().all(|chunk| chunk.line_count() == 0) {
            return Ok(vec![true; chunks.len()]);
        }
        write_tx!(self, |c| append_worker_logs_tx(self, c, chunks, senders))
    }

    /// Lines with seq > `after_seq`, in order, at most `limit`.
    pub async fn read_logs(
        &self,
        instance: InstanceId,
        attempt: Attempt,
        after_seq: u64,
        limit: u32,
    ) -> Result<Vec<StoredLine>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let next = i64::try_from(after_seq)
            .unwrap_or(i64::MAX)
            .saturating_add(1);
        let attempt_no = i64::from(attempt.0);
        let mut lines = Vec::new();
        let mut last = after_seq;
        // Both reads are ranges of the (instance, attempt, first_seq) key, so a page costs the
        // same at line 1 and at line 1,000,000: the chunk holding line `next`, then the chunks
        // after it, a few at a time, until the page is full.
        let head = sqlx::query(
            "SELECT first_seq, line_count, streams, body, created_at FROM execution_log \
             WHERE instance_id = ? AND attempt = ? AND first_seq <= ? \
             ORDER BY first_seq DESC LIMIT 1",
        )
        .bind(instance.0)
        .bind(attempt_no)
        .bind(next)
        .fetch_optional(&self.pool)
        .await?;
        if let Some(row) = head {
            split_chunk(&row, &mut last, limit, &mut lines)?;
        }
        let mut from = next;
        while (lines.len() as u64) < u64::from(limit) {
            let rows = sqlx::query(
                "SELECT first_seq, line_count, streams, body, created_at FROM execution_log \
                 WHERE instance_id = ? AND attempt = ? AND first_seq > ? \
                 ORDER BY first_seq LIMIT ?",
            )
            .bind(instance.0)
            .bind(attempt_no)
            .bind(from)
            .bind(READ_CHUNKS)
            .fetch_all(&self.pool)
            .await?;
            let Some(tail) = rows.last() else { break };
            from = tail.try_get("first_seq")?;
            for row in &rows {
                split_chunk(row, &mut last, limit, &mut lines)?;
            }
            if (rows.len() as i64) < READ_CHUNKS {
                break;
            }
        }
        Ok(lines)
    }

    /// The highest line number stored for an attempt (0 when none is): how far a running
    /// attempt's log has come, before its end report says how many lines it had.
    pub async fn last_log_seq(&self, instance: InstanceId, attempt: Attempt) -> Result<u64> {
        // The last chunk by key: one index probe however long the log is.
        let row = sqlx::query(
            "SELECT first_seq, line_count FROM execution_log \
             WHERE instance_id = ? AND attempt = ? ORDER BY first_seq DESC LIMIT 1",
        )
        .bind(instance.0)
        .bind(i64::from(attempt.0))
        .fetch_optional(&self.pool)
        .await?;
        let Some(row) = row else { return Ok(0) };
        let first: i64 = row.try_get("first_seq")?;
        let count: i64 = row.try_get("line_count")?;
        Ok(u64::try_from(first + count - 1).unwrap_or(0))
    }
}

async fn append_logs_tx(store: &Store, c: &mut AnyConnection, chunks: &[LogChunk]) -> Result<()> {
    let chunks: Vec<&LogChunk> = chunks
        .iter()
        .filter(|chunk| chunk.line_count() > 0)
        .collect();
    // Statements stay far below MySQL's max_allowed_packet (16 MiB by default on MariaDB)
    // whatever the lines' length: a group closes at INSERT_CHUNK rows or LOG_STATEMENT_BYTES.
    let mut groups: Vec<&[&LogChunk]> = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (i, chunk) in chunks.iter().enumerate() {
        let size = chunk.body().len() + chunk.line_count();
        if i > start && (i - start == INSERT_CHUNK || bytes + size > LOG_STATEMENT_BYTES) {
            groups.push(&chunks[start..i]);
            (start, bytes) = (i, 0);
        }
        bytes += size;
    }
    if start < chunks.len() {
        groups.push(&chunks[start..]);
    }
    for batch in groups {
        let sql = format!(
            "{} execution_log (instance_id, attempt, first_seq, line_count, streams, body, \
             created_at) VALUES {}",
            store.dialect.insert_ignore(),
            values_rows(batch.len(), 7)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for chunk in batch {
            let streams: String = chunk
                .streams()
                .iter()
                .map(|stream| match stream {
                    LogStream::Stdout => 'o',
                    LogStream::Stderr => 'e',
                })
                .collect();
            query = query
                .bind(chunk.instance_id.0)
                .bind(i64::from(chunk.attempt.0))
                .bind(i64::try_from(chunk.first_seq).unwrap_or(i64::MAX))
                .bind(chunk.line_count() as i64)
                .bind(streams)
                .bind(chunk.body())
                .bind(chunk.at);
        }
        query.execute(&mut *c).await?;
    }
    Ok(())
}

/// [`append_logs_tx`] for workers' chunks: those with a sender to check are kept only when
/// their attempt exists and was dispatched to that worker (one read of the attempts of their
/// instances); the answer says, per chunk, whether it was kept.
async fn append_worker_logs_tx(
    store: &Store,
    c: &mut AnyConnection,
    chunks: &[LogChunk],
    senders: &[Option<&str>],
) -> Result<Vec<bool>> {
    let instances: BTreeSet<i64> = chunks
        .iter()
        .zip(senders)
        .filter(|(_, sender)| sender.is_some())
        .map(|(chunk, _)| chunk.instance_id.0)
        .collect();
    let dispatched = super::reports::dispatched_attempts(c, instances).await?;
    let kept: Vec<bool> = chunks
        .iter()
        .enumerate()
        .map(
            |(index, chunk)| match senders.get(index).copied().flatten() {
                None => true,
                Some(sender) => dispatched.contains(&(
                    chunk.instance_id.0,
                    i64::from(chunk.attempt.0),
                    sender.to_string(),
                )),
            },
        )
        .collect();
    let stored: Vec<LogChunk> = chunks
        .iter()
        .zip(&kept)
        .filter(|(_, kept)| **kept)
        .map(|(chunk, _)| chunk.clone())
        .collect();
    append_logs_tx(store, c, &stored).await?;
    Ok(kept)
}

/// Chunks fetched per read while filling a page of log lines.
const READ_CHUNKS: i64 = 32;

/// Appends the lines of one stored chunk after `last` to `lines`, up to `limit` lines.
fn split_chunk(
    row: &sqlx::any::AnyRow,
    last: &mut u64,
    limit: u32,
    lines: &mut Vec<StoredLine>,
) -> Result<()> {
    let first: i64 = row.try_get("first_seq")?;
    let first = u64::try_from(first).map_err(|_| corrupt("negative log seq"))?;
    let streams: String = row.try_get("streams")?;
    let body: String = row.try_get("body")?;
    let at: Millis = row.try_get("created_at")?;
    for (offset, (stream, text)) in streams.chars().zip(body.split('\n')).enumerate() {
        let seq = first + offset as u64;
        // Overlapping chunks (a resend cut differently) never repeat a line.
        if seq <= *last {
            continue;
        }
        if lines.len() as u64 >= u64::from(limit) {
            return Ok(());
        }
        let stream = if stream == 'e' {
            LogStream::Stderr
        } else {
            LogStream::Stdout
        };
        lines.push(StoredLine {
            seq,
            stream,
            text: text.to_string(),
            at,
        });
        *last = seq;
    }
    Ok(())
}
