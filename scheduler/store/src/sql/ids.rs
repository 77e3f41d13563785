//! Id allocation from blocks reserved in the `id_block` table.
//!
//! Runs and instances are inserted many rows at a time, so their ids are chosen by the
//! application instead of an autoincrement column: a process reserves a block of ids with a
//! compare-and-swap update on the allocator row and hands them out from memory. Two processes
//! never reserve overlapping blocks because each reservation is a conditional update of the same
//! row; a crash only leaves a gap.

use std::collections::HashMap;
use std::sync::Mutex;

use sqlx::{AnyConnection, Row};

use crate::Result;

/// How many ids one reservation takes when fewer are asked for.
pub(crate) const BLOCK_SIZE: i64 = 1_000;

/// Allocator rows, one per kind of id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum IdKind {
    Workflow,
    Run,
    Instance,
}

impl IdKind {
    fn row(self) -> &'static str {
        match self {
            IdKind::Workflow => "workflow",
            IdKind::Run => "run",
            IdKind::Instance => "task_instance",
        }
    }
}

/// The unused rest of the last reserved block of each kind: ids `next..end`.
#[derive(Debug, Default)]
pub(crate) struct IdBlocks {
    blocks: Mutex<HashMap<IdKind, (i64, i64)>>,
}

impl IdBlocks {
    /// Takes up to `n` ids from memory; returns how many were taken.
    fn take_cached(&self, kind: IdKind, n: usize, out: &mut Vec<i64>) {
        let mut blocks = self
            .blocks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if let Some((next, end)) = blocks.get_mut(&kind) {
            while out.len() < n && *next < *end {
                out.push(*next);
                *next += 1;
            }
        }
    }

    /// Returns `n` fresh ids, reserving a new block through `conn` when memory runs out.
    ///
    /// On SQLite `conn` is the writer's own transaction (a second connection could not write while
    /// it holds the lock), so a rolled-back transaction must call [`IdBlocks::forget`]. On MySQL
    /// `conn` is a connection of the allocator's own pool in autocommit mode.
    pub(crate) async fn take(
        &self,
        conn: &mut AnyConnection,
        kind: IdKind,
        n: usize,
    ) -> Result<Vec<i64>> {
        let mut out = Vec::with_capacity(n);
        self.take_cached(kind, n, &mut out);
        if out.len() == n {
            return Ok(out);
        }
        let missing = (n - out.len()) as i64;
        let size = missing.max(BLOCK_SIZE);
        let start = reserve(conn, kind, size).await?;
        out.extend(start..start + missing);
        let mut blocks = self
            .blocks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        blocks.insert(kind, (start + missing, start + size));
        Ok(out)
    }

    /// Drops every cached block: they may come from a reservation that was rolled back.
    pub(crate) fn forget(&self) {
        self.blocks
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .clear();
    }
}

/// Reserves `size` ids of `kind` and returns the first one.
async fn reserve(conn: &mut AnyConnection, kind: IdKind, size: i64) -> Result<i64> {
    loop {
        let row = sqlx::query("SELECT next_id FROM id_block WHERE name = ?")
            .bind(kind.row())
            .fetch_one(&mut *conn)
            .await?;
        let next: i64 = row.try_get("next_id")?;
        let done = sqlx::query("UPDATE id_block SET next_id = ? WHERE name = ? AND next_id = ?")
            .bind(next + size)
            .bind(kind.row())
            .bind(next)
            .execute(&mut *conn)
            .await?;
        // Another process moved the row between the read and the update: read it again.
        if done.rows_affected() == 1 {
            return Ok(next);
        }
    }
}
