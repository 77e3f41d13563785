//! Scheduler nodes' leases: claiming a node id, renewing it, giving it up, listing them.
//!
//! Every time here is the database's (`Dialect::now_ms`), read in the same transaction as the
//! rows it judges, so a node whose own clock is off judges leases like every other node. The
//! claim locks the node id's row (on MySQL, the gap where it would be), so two nodes starting
//! with one id cannot both take it.

use ax_core::Millis;
use sqlx::any::AnyRow;
use sqlx::{AnyConnection, Row};

use super::{Dialect, Store, write_tx};
use crate::{LeaseClaim, NodeLease, Result};

const NODE_SELECT: &str = "SELECT node_id, incarnation, address, version, started_at, \
     renewed_at, expires_at, clock_offset_ms, pools FROM scheduler_node";

fn node_lease(row: &AnyRow) -> Result<NodeLease> {
    Ok(NodeLease {
        node_id: row.try_get("node_id")?,
        incarnation: row.try_get("incarnation")?,
        address: row.try_get("address")?,
        version: row.try_get("version")?,
        started_at: row.try_get("started_at")?,
        renewed_at: row.try_get("renewed_at")?,
        expires_at: row.try_get("expires_at")?,
        clock_offset_ms: row.try_get("clock_offset_ms")?,
        pools: row.try_get("pools")?,
    })
}

async fn db_now(c: &mut AnyConnection, dialect: Dialect) -> Result<i64> {
    let sql = format!("SELECT {}", dialect.now_ms());
    let row = sqlx::query(sqlx::AssertSqlSafe(sql)).fetch_one(c).await?;
    Ok(row.try_get(0)?)
}

fn lease_ms_i64(lease_ms: u64) -> i64 {
    i64::try_from(lease_ms).unwrap_or(i64::MAX / 4)
}

impl Store {
    /// Takes the lease of `lease.node_id` for `lease_ms` from the database's now, in one
    /// transaction, unless a live lease stands in the way (see [`LeaseClaim::Refused`]). A
    /// lease in `presumed_dead` that is unchanged since the caller read it (same node id,
    /// incarnation and `renewed_at`) counts as dead: its holder stopped renewing.
    /// `lease.started_at`, `renewed_at` and `expires_at` are set from the database's clock.
    pub async fn claim_node_lease(
        &self,
        lease: &NodeLease,
        lease_ms: u64,
        presumed_dead: &[NodeLease],
    ) -> Result<LeaseClaim> {
        let dialect = self.dialect;
        write_tx!(self, |c| async {
            let now = db_now(c, dialect).await?;
            let sql = format!("{NODE_SELECT} WHERE node_id = ?{}", dialect.for_update());
            let own = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(lease.node_id.as_str())
                .fetch_optional(&mut *c)
                .await?
                .map(|row| node_lease(&row))
                .transpose()?;
            let mut standing: Vec<NodeLease> = own.iter().cloned().collect();
            if dialect == Dialect::Sqlite {
                // One SQLite file serves one node: every other live node stands in the way too.
                let sql = format!("{NODE_SELECT} WHERE node_id <> ? AND expires_at > ?");
                let others = sqlx::query(sqlx::AssertSqlSafe(sql))
                    .bind(lease.node_id.as_str())
                    .bind(now)
                    .fetch_all(&mut *c)
                    .await?;
                for row in &others {
                    standing.push(node_lease(row)?);
                }
            }
            let holders: Vec<NodeLease> = standing
                .into_iter()
                .filter(|held| held.expires_at > now && held.incarnation != lease.incarnation)
                .filter(|held| {
                    !presumed_dead.iter().any(|dead| {
                        dead.node_id == held.node_id
                            && dead.incarnation == held.incarnation
                            && dead.renewed_at == held.renewed_at
                    })
                })
                .collect();
            if !holders.is_empty() {
                return Ok(LeaseClaim::Refused {
                    db_now: now,
                    holders,
                });
            }
            if dialect == Dialect::Sqlite {
                sqlx::query("DELETE FROM scheduler_node WHERE node_id <> ?")
                    .bind(lease.node_id.as_str())
                    .execute(&mut *c)
                    .await?;
            }
            let expires = now.saturating_add(lease_ms_i64(lease_ms));
            let statement = if own.is_some() {
                "UPDATE scheduler_node SET incarnation = ?, address = ?, version = ?, started_at = ?, \
                 renewed_at = ?, expires_at = ?, clock_offset_ms = ?, pools = ? WHERE node_id = ?"
            } else {
                "INSERT INTO scheduler_node (incarnation, address, version, started_at, renewed_at, \
                 expires_at, clock_offset_ms, pools, node_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
            };
            sqlx::query(statement)
                .bind(lease.incarnation.as_str())
                .bind(lease.address.as_str())
                .bind(lease.version.as_str())
                .bind(now)
                .bind(now)
                .bind(expires)
                .bind(lease.clock_offset_ms)
                .bind(lease.pools.as_str())
                .bind(lease.node_id.as_str())
                .execute(&mut *c)
                .await?;
            Ok(LeaseClaim::Claimed { db_now: now })
        })
    }

    /// Extends the caller's lease to `lease_ms` from the database's now and records its clock
    /// offset. `None` when the row is no longer this incarnation's (it expired and another
    /// node took the id); otherwise the database's now.
    pub async fn renew_node_lease(
        &self,
        node_id: &str,
        incarnation: &str,
        lease_ms: u64,
        clock_offset_ms: i64,
    ) -> Result<Option<Millis>> {
        let dialect = self.dialect;
        let renew = async |c: &mut sqlx::AnyConnection| -> Result<Option<i64>> {
            let now = db_now(c, dialect).await?;
            let updated = sqlx::query(
                "UPDATE scheduler_node SET renewed_at = ?, expires_at = ?, clock_offset_ms = ? \
                 WHERE node_id = ? AND incarnation = ?",
            )
            .bind(now)
            .bind(now.saturating_add(lease_ms_i64(lease_ms)))
            .bind(clock_offset_ms)
            .bind(node_id)
            .bind(incarnation)
            .execute(&mut *c)
            .await?
            .rows_affected();
            Ok((updated == 1).then_some(now))
        };
        match &self.lease_pool {
            // One conditional update needs no transaction: it commits by itself.
            Some(pool) => renew(&mut *pool.acquire().await?).await,
            None => write_tx!(self, |c| renew(c)),
        }
    }

    /// Gives the lease up (a clean shutdown), if it is still this incarnation's.
    pub async fn release_node_lease(&self, node_id: &str, incarnation: &str) -> Result<()> {
        sqlx::query("DELETE FROM scheduler_node WHERE node_id = ? AND incarnation = ?")
            .bind(node_id)
            .bind(incarnation)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Every node's lease, live or expired, by node id, with the database's now.
    pub async fn list_node_leases(&self) -> Result<(Millis, Vec<NodeLease>)> {
        let mut c = self.pool.acquire().await?;
        let now = db_now(&mut c, self.dialect).await?;
        let sql = format!("{NODE_SELECT} ORDER BY node_id");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&mut *c)
            .await?;
        let leases = rows.iter().map(node_lease).collect::<Result<Vec<_>>>()?;
        Ok((now, leases))
    }
}
