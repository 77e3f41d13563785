//! Dispatch in the store: the queue of waiting instances, the claims that dispatch them, the
//! concurrency limits a claim carries, sharded broadcast, and the attempts on workers.
//!
//! **Queue and claims.** [`Store::waiting`] walks the queue index from its head;
//! [`mark_dispatched_tx`] claims a batch with a fixed number of statements whatever its size,
//! and [`Store::mark_dispatched`] puts the limits' decision in front of it when a claim carries
//! limits. [`Store::active_attempts`] lists what is dispatched or running, for the timeout and
//! worker checks.
//!
//! **Limits.** One `concurrency_slot` row per limited scope counts the instances that hold it.
//! A claim (`mark_dispatched`) that carries limits locks its instance rows (id order), then the
//! counter rows of every scope in the batch (scope order), decides each claim in the batch's
//! order (the dispatcher's priority order): it wins when the instance is still WAITING as that
//! attempt and every one of its scopes has `used < max`; the winners' scopes are written into
//! their `held_slots` and the counters raised, all in the claim's transaction. Every path that
//! moves an instance out of DISPATCHED or RUNNING (a report that ends the attempt or sends it
//! back to WAITING, a cancel) calls [`release`] in its own transaction, which lowers the counters
//! of the scopes the instance held and empties its `held_slots`. So, on every backend and with
//! any number of scheduler nodes, `used` = the instances whose `held_slots` names the scope, and
//! it never exceeds the limit the claims carried. The cost is one counter row per scope, not a
//! count over instances. Instance rows are always locked before counter rows.
//!
//! **Shards.** See `ax_core::shard`: the parent (shard_slot 0) fans out into shards whose
//! shard_slot is their own id; only rows with shard_slot 0 count for the run's end and for
//! downstream readiness, and a shard's end settles its parent.

use std::collections::{BTreeMap, BTreeSet};

use ax_core::Millis;
use ax_core::ids::{Attempt, InstanceId, RunId};
use ax_core::shard::{ShardProgress, parent_outcome};
use ax_core::state::{Event, InstanceState, Outcome, transition};
use sqlx::{AnyConnection, Row};

use super::ids::IdKind;
use super::instance_locks::{InstanceKey, load_key, lock_runs};
use super::patch::{Patches, Table};
use super::rows::{self, instance_state, map_json, to_u32};
use super::run_end::finish_run_if_done;
use super::{Dialect, Store, in_list, pow2_chunks, values_rows, write_tx};
use crate::{ActiveAttempt, DispatchClaim, QueueShare, Result, WaitingInstance};

/// The `held_slots` text of a claim: its scopes, one per line.
pub(crate) fn held_slots(claim: &DispatchClaim) -> String {
    claim
        .limits
        .iter()
        .map(|limit| limit.scope.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

impl Store {
    /// Attempts that are DISPATCHED or RUNNING, oldest first, for the liveness backstop; only
    /// those on `worker` when given (a worker re-registering).
    pub async fn active_attempts(
        &self,
        worker: Option<&str>,
        limit: u32,
    ) -> Result<Vec<ActiveAttempt>> {
        let on_worker = if worker.is_some() {
            " AND ti.worker_id = ?"
        } else {
            ""
        };
        let sql = format!(
            "SELECT ti.id, ti.run_id, ti.attempt, ti.state, ti.worker_id, ti.started_at, \
             ti.last_heartbeat_at, ta.dispatched_at, ta.node_id, td.timeout_ms \
             FROM task_instance ti \
             JOIN task_definition td ON td.workflow_id = ti.workflow_id \
               AND td.version = ti.workflow_version AND td.name = ti.task_name \
             LEFT JOIN task_attempt ta ON ta.instance_id = ti.id AND ta.attempt = ti.attempt \
             WHERE ti.state IN ('DISPATCHED', 'RUNNING'){on_worker} AND td.run_workflow IS NULL \
             AND NOT (ti.shard_slot = 0 AND ti.shard_total IS NOT NULL) ORDER BY ti.id LIMIT ?"
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        if let Some(worker) = worker {
            query = query.bind(worker);
        }
        let rows = query.bind(i64::from(limit)).fetch_all(&self.pool).await?;
        rows.iter()
            .map(|row| {
                let timeout: i64 = row.try_get("timeout_ms")?;
                Ok(ActiveAttempt {
                    instance_id: InstanceId(row.try_get("id")?),
                    run_id: RunId(row.try_get("run_id")?),
                    attempt: Attempt(to_u32(row.try_get("attempt")?, "attempt")?),
                    state: instance_state(&row.try_get::<String, _>("state")?)?,
                    worker_id: row.try_get("worker_id")?,
                    dispatched_by: row.try_get("node_id")?,
                    dispatched_at: row.try_get("dispatched_at")?,
                    started_at: row.try_get("started_at")?,
                    last_heartbeat_at: row.try_get("last_heartbeat_at")?,
                    // The column holds 0 for no timeout.
                    timeout_ms: u64::try_from(timeout)
                        .ok()
                        .and_then(std::num::NonZeroU64::new),
                })
            })
            .collect()
    }

    /// WAITING instances with `not_before <= now`, highest priority first, then in the order they
    /// became ready (`not_before`), then by id.
    pub async fn waiting(&self, now: Millis, limit: u32) -> Result<Vec<WaitingInstance>> {
        read_waiting(self, now, limit, None).await
    }

    /// [`Store::waiting`], only the instances of one node's share of the queue: those whose id
    /// is `share.index` modulo `share.nodes`.
    pub async fn waiting_share(
        &self,
        now: Millis,
        limit: u32,
        share: QueueShare,
    ) -> Result<Vec<WaitingInstance>> {
        read_waiting(self, now, limit, Some(share)).await
    }

    /// WAITING → DISPATCHED for each claim, each a conditional update on (id, attempt, WAITING),
    /// all in one transaction; records the attempt's worker and dispatch time. Returns, per
    /// claim, whether this call won it.
    pub async fn mark_dispatched(&self, claims: &[DispatchClaim]) -> Result<Vec<bool>> {
        if claims.is_empty() {
            return Ok(Vec::new());
        }
        write_tx!(self, |c| claim_in_limits_tx(self, c, claims))
    }

    /// The counters of these concurrency scopes (instances holding each now); a scope without a
    /// counter is absent.
    pub async fn limit_usage(&self, scopes: &[String]) -> Result<BTreeMap<String, u32>> {
        let mut c = self.pool.acquire().await?;
        let set: BTreeSet<&str> = scopes.iter().map(String::as_str).collect();
        let values = read_counters(self, &mut c, &set, false).await?;
        values
            .into_iter()
            .map(|(scope, used)| Ok((scope.to_string(), to_u32(used.max(0), "slot usage")?)))
            .collect()
    }

    /// Fans a WAITING sharded task's instance (the parent) out into one WAITING shard per
    /// worker in `workers` (shard index = position), each pinned to its worker; the parent
    /// becomes RUNNING with no worker and is never dispatched. One transaction; false (and
    /// nothing changed) when the parent is no longer WAITING as `attempt`, or `workers` is empty.
    pub async fn fan_out(
        &self,
        parent: InstanceId,
        attempt: Attempt,
        workers: &[String],
        now: Millis,
    ) -> Result<bool> {
        write_tx!(self, |c| fan_out_tx(self, c, parent, attempt, workers, now))
    }

    /// A WAITING shard whose pinned worker is gone for good fails (no retry: it may run only
    /// there), with `reason` on its attempt; its parent and run end as the rules say. False when
    /// it is no longer WAITING as `attempt`.
    pub async fn fail_shard(
        &self,
        id: InstanceId,
        attempt: Attempt,
        reason: &str,
        now: Millis,
    ) -> Result<bool> {
        write_tx!(self, |c| fail_shard_tx(self, c, id, attempt, reason, now))
    }
}

/// Claims with limits: decides which claims fit (see the module doc), then applies the winners
/// through [`mark_dispatched_tx`] (the plain conditional claims) and raises the counters of what
/// they took.
async fn claim_in_limits_tx(
    store: &Store,
    c: &mut AnyConnection,
    claims: &[DispatchClaim],
) -> Result<Vec<bool>> {
    if claims.iter().all(|claim| claim.limits.is_empty()) {
        return mark_dispatched_tx(store, c, claims, None).await;
    }
    // Instance rows first, in id order (the order every other transaction locks them in).
    let ids: BTreeSet<i64> = claims.iter().map(|claim| claim.instance_id.0).collect();
    let (list, ids) = in_list(ids);
    let sql = format!(
        "SELECT id, attempt, state FROM task_instance WHERE id IN ({list}) ORDER BY id{}",
        store.dialect.for_update()
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in &ids {
        query = query.bind(*id);
    }
    let mut current: BTreeMap<i64, (i64, String)> = BTreeMap::new();
    for row in query.fetch_all(&mut *c).await? {
        current.insert(
            row.try_get("id")?,
            (row.try_get("attempt")?, row.try_get("state")?),
        );
    }
    let scopes: BTreeSet<&str> = claims
        .iter()
        .flat_map(|claim| claim.limits.iter().map(|limit| limit.scope.as_str()))
        .collect();
    let before = lock_counters(store, c, &scopes).await?;
    let mut used = before.clone();
    let mut allowed = vec![false; claims.len()];
    let mut taken: BTreeSet<i64> = BTreeSet::new();
    for (i, claim) in claims.iter().enumerate() {
        let is_current = current
            .get(&claim.instance_id.0)
            .is_some_and(|(attempt, state)| {
                *attempt == i64::from(claim.attempt.0) && state == "WAITING"
            });
        if !is_current || taken.contains(&claim.instance_id.0) {
            continue;
        }
        let fits = claim.limits.iter().all(|limit| {
            used.get(limit.scope.as_str()).copied().unwrap_or(0) < i64::from(limit.max)
        });
        if !fits {
            continue;
        }
        for limit in &claim.limits {
            *used.entry(limit.scope.as_str()).or_insert(0) += 1;
        }
        taken.insert(claim.instance_id.0);
        allowed[i] = true;
    }
    let won = mark_dispatched_tx(store, c, claims, Some(&allowed)).await?;
    // The instances were locked and WAITING, so every allowed claim won; count what did.
    let mut after = before.clone();
    for (claim, won) in claims.iter().zip(&won) {
        if *won {
            for limit in &claim.limits {
                *after.entry(limit.scope.as_str()).or_insert(0) += 1;
            }
        }
    }
    for (scope, value) in &after {
        if before.get(scope) != Some(value) {
            sqlx::query("UPDATE concurrency_slot SET used = ? WHERE scope = ?")
                .bind(*value)
                .bind(*scope)
                .execute(&mut *c)
                .await?;
        }
    }
    Ok(won)
}

/// Locks the counter rows of `scopes` (creating missing ones at 0) and returns their values.
async fn lock_counters<'a>(
    store: &Store,
    c: &mut AnyConnection,
    scopes: &BTreeSet<&'a str>,
) -> Result<BTreeMap<&'a str, i64>> {
    let mut values = read_counters(store, c, scopes, true).await?;
    let missing: Vec<&str> = scopes
        .iter()
        .copied()
        .filter(|scope| !values.contains_key(scope))
        .collect();
    if !missing.is_empty() {
        let sql = format!(
            "{} concurrency_slot (scope, used) VALUES {}",
            store.dialect.insert_ignore(),
            values_rows(missing.len(), 2)
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for scope in &missing {
            query = query.bind(*scope).bind(0i64);
        }
        query.execute(&mut *c).await?;
        let missing: BTreeSet<&str> = missing.into_iter().collect();
        values.extend(read_counters(store, c, &missing, true).await?);
    }
    Ok(values)
}

async fn read_counters<'a>(
    store: &Store,
    c: &mut AnyConnection,
    scopes: &BTreeSet<&'a str>,
    lock: bool,
) -> Result<BTreeMap<&'a str, i64>> {
    let mut values = BTreeMap::new();
    if scopes.is_empty() {
        return Ok(values);
    }
    let (list, padded) = in_list(scopes.iter().copied());
    let sql = format!(
        "SELECT scope, used FROM concurrency_slot WHERE scope IN ({list}) ORDER BY scope{}",
        if lock { store.dialect.for_update() } else { "" }
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for scope in padded {
        query = query.bind(scope);
    }
    for row in query.fetch_all(&mut *c).await? {
        let scope: String = row.try_get("scope")?;
        if let Some(&key) = scopes.get(scope.as_str()) {
            values.insert(key, row.try_get::<i64, _>("used")?);
        }
    }
    Ok(values)
}

/// What [`release`] needs of an instance whose attempt ended.
#[derive(Debug, Clone)]
pub(crate) struct Ended {
    id: i64,
    held: String,
    parent: Option<i64>,
}

impl Ended {
    pub(crate) fn of(key: &InstanceKey) -> Ended {
        Ended {
            id: key.id.0,
            held: key.held_slots.clone(),
            parent: key.parent_id,
        }
    }
}

async fn load_ended(c: &mut AnyConnection, ids: &BTreeSet<i64>) -> Result<Vec<Ended>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let (list, ids) = in_list(ids.iter().copied());
    let sql = format!(
        "SELECT id, held_slots, parent_id FROM task_instance WHERE id IN ({list}) ORDER BY id"
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(id);
    }
    query
        .fetch_all(&mut *c)
        .await?
        .iter()
        .map(|row| {
            Ok(Ended {
                id: row.try_get("id")?,
                held: row.try_get("held_slots")?,
                parent: row.try_get("parent_id")?,
            })
        })
        .collect()
}

/// Gives back the concurrency scopes the instances hold (their attempt ended, or they went back
/// to WAITING, in the caller's transaction, which has locked their rows).
pub(crate) async fn release(c: &mut AnyConnection, ids: &[i64]) -> Result<()> {
    let ids: BTreeSet<i64> = ids.iter().copied().collect();
    let ended = load_ended(c, &ids).await?;
    release_loaded(c, &ended).await
}

async fn release_loaded(c: &mut AnyConnection, ended: &[Ended]) -> Result<()> {
    let holders: Vec<&Ended> = ended.iter().filter(|e| !e.held.is_empty()).collect();
    if holders.is_empty() {
        return Ok(());
    }
    let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
    for holder in &holders {
        for scope in holder.held.split('\n').filter(|s| !s.is_empty()) {
            *counts.entry(scope).or_insert(0) += 1;
        }
    }
    let (list, ids) = in_list(holders.iter().map(|holder| holder.id));
    let sql = format!("UPDATE task_instance SET held_slots = '' WHERE id IN ({list})");
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(id);
    }
    query.execute(&mut *c).await?;
    for (scope, n) in counts {
        sqlx::query(
            "UPDATE concurrency_slot SET used = CASE WHEN used > ? THEN used - ? ELSE 0 END \
             WHERE scope = ?",
        )
        .bind(n)
        .bind(n)
        .bind(scope)
        .execute(&mut *c)
        .await?;
    }
    Ok(())
}

/// After a batch of reports: the instances whose attempt ended (`ended`: report index, the
/// instance as the batch read it under lock, its new state) give back their scopes; shards
/// leave the downstream advance to their parent, and a shard's terminal end settles its parent
/// (a parent that ended joins `finished`, so its downstream is judged; its run is checked
/// for its end).
pub(crate) async fn after_attempts_ended(
    c: &mut AnyConnection,
    ended: &[(usize, Ended, InstanceState)],
    finished: &mut Vec<(usize, InstanceKey)>,
    touched_runs: &mut Vec<(usize, RunId)>,
    now: Millis,
) -> Result<()> {
    if ended.is_empty() {
        return Ok(());
    }
    let mut loaded: BTreeMap<i64, Ended> = BTreeMap::new();
    for (_, instance, _) in ended {
        loaded
            .entry(instance.id)
            .or_insert_with(|| instance.clone());
    }
    let loaded: Vec<Ended> = loaded.into_values().collect();
    release_loaded(c, &loaded).await?;
    let parents: BTreeMap<i64, i64> = loaded
        .iter()
        .filter_map(|e| e.parent.map(|parent| (e.id, parent)))
        .collect();
    if parents.is_empty() {
        return Ok(());
    }
    finished.retain(|(_, key)| !parents.contains_key(&key.id.0));
    let mut settle: BTreeMap<i64, usize> = BTreeMap::new();
    for (index, instance, state) in ended {
        if state.is_terminal()
            && let Some(parent) = parents.get(&instance.id)
        {
            settle.insert(*parent, *index);
        }
    }
    for (parent, index) in settle {
        if let Some((key, state)) = settle_parent(c, parent, now).await? {
            touched_runs.push((index, key.run_id));
            if state.is_terminal() {
                finished.push((index, InstanceKey { state, ..key }));
            }
        }
    }
    Ok(())
}

/// Ends a RUNNING parent by its shards ([`parent_outcome`]); returns it and its new state when
/// it ended now.
pub(crate) async fn settle_parent(
    c: &mut AnyConnection,
    parent: i64,
    now: Millis,
) -> Result<Option<(InstanceKey, InstanceState)>> {
    let row = sqlx::query("SELECT attempt, state, shard_total FROM task_instance WHERE id = ?")
        .bind(parent)
        .fetch_optional(&mut *c)
        .await?;
    let Some(row) = row else { return Ok(None) };
    if instance_state(&row.try_get::<String, _>("state")?)? != InstanceState::Running {
        return Ok(None);
    }
    let attempt: i64 = row.try_get("attempt")?;
    if still_going(c, parent, attempt).await? {
        return Ok(None);
    }
    let total: Option<i64> = row.try_get("shard_total")?;
    let mut progress = ShardProgress {
        total: to_u32(total.unwrap_or(0), "shard total")?,
        ..ShardProgress::default()
    };
    let counts = sqlx::query(
        "SELECT state, COUNT(*) AS n FROM task_instance \
         WHERE parent_id = ? AND parent_attempt = ? GROUP BY state",
    )
    .bind(parent)
    .bind(attempt)
    .fetch_all(&mut *c)
    .await?;
    for row in counts {
        let n = to_u32(row.try_get("n")?, "shard count")?;
        match instance_state(&row.try_get::<String, _>("state")?)? {
            InstanceState::Success => progress.succeeded += n,
            InstanceState::Failed | InstanceState::Timeout => progress.failed += n,
            InstanceState::Cancelled => progress.cancelled += n,
            _ => {}
        }
    }
    let Some(end) = parent_outcome(progress) else {
        return Ok(None);
    };
    // The shards' verdict is the parent's Finish (or Cancel) in the transition table.
    let event = match end {
        InstanceState::Cancelled => Event::Cancel,
        state => Event::Finish {
            outcome: if state == InstanceState::Success {
                Outcome::Success
            } else {
                Outcome::Failed
            },
            retries_left: false,
        },
    };
    let Ok(next) = transition(InstanceState::Running, event) else {
        return Ok(None);
    };
    let end = next.to;
    let done = sqlx::query(
        "UPDATE task_instance SET state = ?, finished_at = ? \
         WHERE id = ? AND attempt = ? AND state = 'RUNNING'",
    )
    .bind(end.as_str())
    .bind(now)
    .bind(parent)
    .bind(attempt)
    .execute(&mut *c)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(None);
    }
    Ok(load_key(c, InstanceId(parent)).await?.map(|key| (key, end)))
}

/// Whether a parent's children of `attempt` cannot end it yet: one of them is still going and
/// none failed or was cancelled ([`parent_outcome`] is then `None`, as its children are all
/// created at once). Two seeks of `idx_task_instance_parent`, where counting every child after
/// each report batch would read all 10,000 items of a mapped task every time.
async fn still_going(c: &mut AnyConnection, parent: i64, attempt: i64) -> Result<bool> {
    let ended_badly = sqlx::query(
        "SELECT id FROM task_instance WHERE parent_id = ? AND parent_attempt = ? \
         AND state IN ('FAILED', 'TIMEOUT', 'CANCELLED') LIMIT 1",
    )
    .bind(parent)
    .bind(attempt)
    .fetch_optional(&mut *c)
    .await?;
    if ended_badly.is_some() {
        return Ok(false);
    }
    let going = sqlx::query(
        "SELECT id FROM task_instance WHERE parent_id = ? AND parent_attempt = ? \
         AND state IN ('WAITING', 'DISPATCHED', 'RUNNING') LIMIT 1",
    )
    .bind(parent)
    .bind(attempt)
    .fetch_optional(&mut *c)
    .await?;
    Ok(going.is_some())
}

async fn fan_out_tx(
    store: &Store,
    c: &mut AnyConnection,
    parent: InstanceId,
    attempt: Attempt,
    workers: &[String],
    now: Millis,
) -> Result<bool> {
    if workers.is_empty() {
        return Ok(false);
    }
    let Some(key) = load_key(c, parent).await? else {
        return Ok(false);
    };
    lock_runs(store, c, &BTreeSet::from([key.run_id.0])).await?;
    let Ok(next) = transition(InstanceState::Waiting, Event::FanOut) else {
        return Ok(false);
    };
    let total = workers.len() as i64;
    let done = sqlx::query(
        "UPDATE task_instance SET state = ?, started_at = ?, shard_total = ? \
         WHERE id = ? AND attempt = ? AND state = 'WAITING' AND shard_slot = 0",
    )
    .bind(next.to.as_str())
    .bind(now)
    .bind(total)
    .bind(parent.0)
    .bind(i64::from(attempt.0))
    .execute(&mut *c)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    let priority: i64 = sqlx::query("SELECT priority FROM task_instance WHERE id = ?")
        .bind(parent.0)
        .fetch_one(&mut *c)
        .await?
        .try_get("priority")?;
    let ids = store.take_ids(c, IdKind::Instance, workers.len()).await?;
    let sql = format!(
        "INSERT INTO task_instance (id, run_id, workflow_id, workflow_version, task_name, state, \
         attempt, priority, not_before, created_at, parent_id, parent_attempt, shard_index, \
         shard_total, pinned_worker, shard_slot) VALUES {}",
        values_rows(workers.len(), 16)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for (index, (id, worker)) in ids.iter().zip(workers).enumerate() {
        query = query
            .bind(*id)
            .bind(key.run_id.0)
            .bind(key.workflow_id.0)
            .bind(key.version)
            .bind(key.task.as_str())
            .bind(InstanceState::Waiting.as_str())
            .bind(1i64)
            .bind(priority)
            .bind(now)
            .bind(now)
            .bind(parent.0)
            .bind(i64::from(attempt.0))
            .bind(index as i64)
            .bind(total)
            .bind(worker.as_str())
            .bind(*id);
    }
    query.execute(&mut *c).await?;
    Ok(true)
}

async fn fail_shard_tx(
    store: &Store,
    c: &mut AnyConnection,
    id: InstanceId,
    attempt: Attempt,
    reason: &str,
    now: Millis,
) -> Result<bool> {
    let Some(key) = load_key(c, id).await? else {
        return Ok(false);
    };
    lock_runs(store, c, &BTreeSet::from([key.run_id.0])).await?;
    let row = sqlx::query("SELECT parent_id, pinned_worker FROM task_instance WHERE id = ?")
        .bind(id.0)
        .fetch_one(&mut *c)
        .await?;
    let parent: Option<i64> = row.try_get("parent_id")?;
    let worker: Option<String> = row.try_get("pinned_worker")?;
    let Some(parent) = parent else {
        return Ok(false);
    };
    let Ok(next) = transition(InstanceState::Waiting, Event::PinnedWorkerGone) else {
        return Ok(false);
    };
    let done = sqlx::query(
        "UPDATE task_instance SET state = ?, finished_at = ? \
         WHERE id = ? AND attempt = ? AND state = 'WAITING'",
    )
    .bind(next.to.as_str())
    .bind(now)
    .bind(id.0)
    .bind(i64::from(attempt.0))
    .execute(&mut *c)
    .await?;
    if done.rows_affected() != 1 {
        return Ok(false);
    }
    let updated = sqlx::query(
        "UPDATE task_attempt SET state = ?, finished_at = ?, message = ? \
         WHERE instance_id = ? AND attempt = ?",
    )
    .bind(next.to.as_str())
    .bind(now)
    .bind(reason)
    .bind(id.0)
    .bind(i64::from(attempt.0))
    .execute(&mut *c)
    .await?;
    if updated.rows_affected() == 0 {
        sqlx::query(
            "INSERT INTO task_attempt (instance_id, attempt, state, worker_id, finished_at, \
             log_lines, message) VALUES (?, ?, 'FAILED', ?, ?, 0, ?)",
        )
        .bind(id.0)
        .bind(i64::from(attempt.0))
        .bind(worker)
        .bind(now)
        .bind(reason)
        .execute(&mut *c)
        .await?;
    }
    // A sharded task ended by this shard has the tasks below it judged, as after a report.
    match settle_parent(c, parent, now).await? {
        Some((ended, state)) if state.is_terminal() => {
            super::reports::advance_after_ended(store, c, &ended, now).await?;
        }
        _ => {
            finish_run_if_done(store, c, key.run_id, now).await?;
        }
    }
    Ok(true)
}

/// The conditional claims; with `allowed`, only the claims it allows are tried (the limits said
/// no to the others, see the module doc). A claim wins when its instance is still WAITING as that
/// attempt; the batch costs a fixed number of statements whatever its size: one locking read
/// of the instances, one update of the winners, one read of their attempt rows, one multi-row
/// insert of the new attempt rows (and one update for attempts dispatched again).
pub(crate) async fn mark_dispatched_tx(
    store: &Store,
    c: &mut AnyConnection,
    claims: &[DispatchClaim],
    allowed: Option<&[bool]>,
) -> Result<Vec<bool>> {
    let mut won = vec![false; claims.len()];
    let ids: BTreeSet<i64> = claims
        .iter()
        .enumerate()
        .filter(|(i, _)| allowed.is_none_or(|allowed| allowed[*i]))
        .map(|(_, claim)| claim.instance_id.0)
        .collect();
    if ids.is_empty() {
        return Ok(won);
    }
    // Lock the instance rows in id order whatever the claim order, so two batches cannot
    // deadlock; the claims are decided on what the lock shows.
    let (list, ids) = in_list(ids);
    let sql = format!(
        "SELECT id, attempt, state FROM task_instance WHERE id IN ({list}) ORDER BY id{}",
        store.dialect.for_update()
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
    for id in ids {
        query = query.bind(id);
    }
    let mut waiting: BTreeMap<i64, i64> = BTreeMap::new();
    for row in query.fetch_all(&mut *c).await? {
        if row.try_get::<String, _>("state")? == InstanceState::Waiting.as_str() {
            waiting.insert(row.try_get("id")?, row.try_get("attempt")?);
        }
    }
    let mut instances = Patches::new(Table::Instance);
    let mut winners: Vec<&DispatchClaim> = Vec::new();
    for (i, claim) in claims.iter().enumerate() {
        if allowed.is_some_and(|allowed| !allowed[i]) {
            continue;
        }
        let attempt = i64::from(claim.attempt.0);
        // A claim wins once: the instance leaves WAITING with it.
        if waiting.get(&claim.instance_id.0) == Some(&attempt) {
            waiting.remove(&claim.instance_id.0);
            won[i] = true;
            instances.set(
                claim.instance_id.0,
                0,
                [
                    ("state", InstanceState::Dispatched.as_str().into()),
                    ("worker_id", claim.worker_id.as_str().into()),
                    ("held_slots", super::dispatch::held_slots(claim).into()),
                ],
            );
            winners.push(claim);
        }
    }
    if winners.is_empty() {
        return Ok(won);
    }
    instances.write(c).await?;
    // One attempt row per claim; a rejected attempt dispatched again reuses its row, whose
    // earlier start and end are cleared.
    const COLUMNS: [&str; 13] = [
        "instance_id",
        "attempt",
        "state",
        "worker_id",
        "node_id",
        "dispatched_at",
        "started_at",
        "finished_at",
        "exit_code",
        "signal_num",
        "pid",
        "log_lines",
        "message",
    ];
    let tail = store.dialect.upsert_tail(&COLUMNS[..2], &COLUMNS[2..]);
    for winners in pow2_chunks(&winners) {
        let sql = format!(
            "INSERT INTO task_attempt ({}) VALUES {}{tail}",
            COLUMNS.join(", "),
            values_rows(winners.len(), COLUMNS.len())
        );
        let mut query = sqlx::query(sqlx::AssertSqlSafe(sql));
        for claim in winners {
            query = query
                .bind(claim.instance_id.0)
                .bind(i64::from(claim.attempt.0))
                .bind(InstanceState::Dispatched.as_str())
                .bind(claim.worker_id.as_str())
                .bind(claim.node_id.as_str())
                .bind(claim.at)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(None::<i64>)
                .bind(0i64)
                .bind("");
        }
        query.execute(&mut *c).await?;
    }
    Ok(won)
}

/// The head of the WAITING queue, or of one node's share of it.
async fn read_waiting(
    store: &Store,
    now: Millis,
    limit: u32,
    share: Option<QueueShare>,
) -> Result<Vec<WaitingInstance>> {
    // Walk the queue index from its head and stop after `limit` rows, looking up each
    // row's workflow and run by primary key. Left to itself, MariaDB starts from the small
    // workflow and run tables, or joins the workflow through a join buffer, and either way
    // sorts every WAITING row (20–35 ms a read with 10,000 waiting).
    let (join_order, queue_index, by_key) = match store.dialect {
        Dialect::MySql => (
            "SELECT STRAIGHT_JOIN",
            "task_instance ti FORCE INDEX (idx_task_instance_queue)",
            " FORCE INDEX (PRIMARY) ON",
        ),
        Dialect::Sqlite => (
            "SELECT",
            "task_instance ti INDEXED BY idx_task_instance_queue",
            " ON",
        ),
    };
    let in_share = if share.is_some() {
        " AND ti.id % ? = ?"
    } else {
        ""
    };
    let sql = format!(
        "{} JOIN run r{by_key} r.id = ti.run_id \
         WHERE ti.state = 'WAITING' AND ti.not_before <= ? AND r.state = 'RUNNING'{in_share} \
         ORDER BY ti.priority DESC, ti.not_before, ti.id LIMIT ?",
        rows::INSTANCE_SELECT
            .replace(
                "ti.exit_code,",
                "ti.exit_code, r.logical_time, r.params_json, r.handler_env_json, r.outputs_bytes,"
            )
            .replacen("SELECT", join_order, 1)
            .replacen("task_instance ti", queue_index, 1)
            .replacen("JOIN workflow w ON", &format!("JOIN workflow w{by_key}"), 1)
    );
    let mut query = sqlx::query(sqlx::AssertSqlSafe(sql)).bind(now);
    if let Some(share) = share {
        query = query
            .bind(i64::from(share.nodes.max(1)))
            .bind(i64::from(share.index));
    }
    let rows = query.bind(i64::from(limit)).fetch_all(&store.pool).await?;
    let mut with_outputs = BTreeSet::new();
    for row in &rows {
        if row.try_get::<i64, _>("outputs_bytes")? > 0 {
            with_outputs.insert(row.try_get::<i64, _>("run_id")?);
        }
    }
    let outputs = if with_outputs.is_empty() {
        BTreeMap::new()
    } else {
        let mut conn = store.pool.acquire().await?;
        super::outputs::of_runs(&mut conn, &with_outputs).await?
    };
    rows.iter()
        .map(|row| {
            let params: String = row.try_get("params_json")?;
            let instance = rows::instance(row)?;
            let shard = instance.shard.clone();
            let run_outputs = outputs.get(&instance.run_id.0).cloned().unwrap_or_default();
            Ok(WaitingInstance {
                instance,
                logical_time: row.try_get("logical_time")?,
                params: map_json(&params, "run params")?,
                run_env: rows::run_env(row)?,
                run_outputs,
                shard,
            })
        })
        .collect()
}
