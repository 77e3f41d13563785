//! The facts a transition of an instance reads ([`InstanceKey`]), and the run locks taken first.
//!
//! A transition that may end an attempt or move a run (a report batch, a shard's fan-out or
//! failure, a cancel, a rerun, a retry) first locks the rows of its runs in ascending id order
//! ([`lock_runs`]), then reads its instances' keys, under lock on MySQL where it decides on them
//! ([`lock_key`], [`load_keys`]): of two transactions that reach one fan-in at once, the second
//! sees what the first did, and no two lock runs in opposite orders. The lock order across
//! tables is in `locks.rs`. SQLite serializes writers, so nothing is locked there.

use std::collections::{BTreeSet, HashMap};

use ax_core::ids::{Attempt, InstanceId, RunId, WorkflowId};
use ax_core::state::InstanceState;
use sqlx::{AnyConnection, Row};

use super::counted::Counted;
use super::engine::{Locked, touch};
use super::rows::{instance_state, to_u32};
use super::{Dialect, Store, in_list};
use crate::Result;

/// The facts about an instance a transition needs.
#[derive(Debug, Clone)]
pub(crate) struct InstanceKey {
    pub(crate) id: InstanceId,
    pub(crate) run_id: RunId,
    pub(crate) workflow_id: WorkflowId,
    pub(crate) version: i64,
    pub(crate) task: String,
    pub(crate) state: InstanceState,
    pub(crate) attempt: Attempt,
    pub(crate) worker_id: Option<String>,
    /// The concurrency scopes the instance holds (see `dispatch.rs`), one per line.
    pub(crate) held_slots: String,
    /// The sharded task's instance, when this one is a shard.
    pub(crate) parent_id: Option<i64>,
    /// Attempts withdrawn before a start was confirmed; they do not count against retries.
    pub(crate) withdrawn: u32,
}

/// The columns [`key_of`] reads.
const KEY_COLUMNS: &str = "id, run_id, workflow_id, workflow_version, task_name, state, attempt, worker_id, \
     held_slots, parent_id, withdrawn_attempts";

pub(crate) async fn load_key(c: &mut AnyConnection, id: InstanceId) -> Result<Option<InstanceKey>> {
    read_key(&mut Counted::new(c), id).await
}

/// The key of one instance, its row locked until the transaction ends (MySQL; SQLite writers
/// are serialized): what the caller decides on it cannot be overtaken by a report batch, which
/// locks the same rows, or by a dispatch claim.
pub(crate) async fn lock_key(
    store: &Store,
    c: &mut AnyConnection,
    id: InstanceId,
) -> Result<Option<InstanceKey>> {
    let sql = format!(
        "SELECT {KEY_COLUMNS} FROM task_instance WHERE id = ?{}",
        store.dialect.for_update()
    );
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(key_of).transpose()
}

async fn read_key(c: &mut Counted<'_>, id: InstanceId) -> Result<Option<InstanceKey>> {
    let sql = format!("SELECT {KEY_COLUMNS} FROM task_instance WHERE id = ?");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(id.0)
        .fetch_optional(&mut *c)
        .await?;
    row.as_ref().map(key_of).transpose()
}

/// The keys of many instances in one statement (a batch's first read of each instance).
pub(crate) async fn load_keys(
    c: &mut Counted<'_>,
    ids: &BTreeSet<i64>,
    lock: &str,
) -> Result<HashMap<i64, InstanceKey>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let (list, padded) = in_list(ids.iter().copied());
    let sql =
        format!("SELECT {KEY_COLUMNS} FROM task_instance WHERE id IN ({list}) ORDER BY id{lock}");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in padded {
        query = query.bind(id);
    }
    let mut keys = HashMap::with_capacity(ids.len());
    for row in query.fetch_all(&mut *c).await? {
        let key = key_of(&row)?;
        keys.insert(key.id.0, key);
    }
    Ok(keys)
}

fn key_of(row: &sqlx::any::AnyRow) -> Result<InstanceKey> {
    Ok(InstanceKey {
        id: InstanceId(row.try_get("id")?),
        run_id: RunId(row.try_get("run_id")?),
        workflow_id: WorkflowId(row.try_get("workflow_id")?),
        version: row.try_get("workflow_version")?,
        task: row.try_get("task_name")?,
        state: instance_state(&row.try_get::<String, _>("state")?)?,
        attempt: Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
        worker_id: row.try_get("worker_id")?,
        held_slots: row.try_get("held_slots")?,
        parent_id: row.try_get("parent_id")?,
        withdrawn: to_u32(row.try_get("withdrawn_attempts")?, "withdrawn_attempts")?,
    })
}

/// Locks the rows of `runs` in ascending id order, so that two transactions finishing upstreams
/// of one fan-in cannot both miss it, and two batches never lock runs in opposite orders.
pub(crate) async fn lock_runs(
    store: &Store,
    c: &mut AnyConnection,
    runs: &BTreeSet<i64>,
) -> Result<()> {
    lock_run_rows(store, &mut Counted::new(c), runs).await
}

pub(crate) async fn lock_run_rows(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &BTreeSet<i64>,
) -> Result<()> {
    if store.dialect != Dialect::MySql {
        return Ok(());
    }
    if runs.is_empty() {
        return Ok(());
    }
    // One statement; InnoDB locks the rows as it walks the primary key, in ascending id order.
    let ids = runs;
    let (list, padded) = in_list(runs.iter().copied());
    let sql = format!("SELECT id FROM run WHERE id IN ({list}) ORDER BY id FOR UPDATE");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for &run in &padded {
        query = query.bind(run);
    }
    query.fetch_all(&mut *c).await?;
    touch_runs(store, c, ids).await
}

/// On a cluster member, writes the locked run rows too (`engine.rs`): two batches on two
/// servers that each end one of a run's last two tasks then conflict, instead of each seeing
/// the other's task unfinished and neither ending the run (or creating the fan-in's instance).
pub(crate) async fn touch_runs(
    store: &Store,
    c: &mut Counted<'_>,
    runs: &BTreeSet<i64>,
) -> Result<()> {
    let runs: Vec<i64> = runs.iter().copied().collect();
    touch(store, c, Locked::Run, &runs).await
}
