//! API tokens (by name, and by the hash a request's token is looked up with) and sealed
//! secrets. Neither table holds anything a reader of the database could use: a token is stored
//! as its SHA-256, a secret as the nodes' AEAD seal of its value.

use ax_core::Millis;
use ax_core::access::Role;
use ax_core::worker_scope::WorkerScope;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::rows::to_json;
use super::{Store, db_errors, write_tx};
use crate::{NewToken, Result, SecretRecord, StoreError, TokenRecord};

const TOKEN_SELECT: &str = "SELECT name, role, app, created_at, created_by, expires_at, \
     revoked_at, worker_ids, worker_apps, worker_labels FROM api_token";

const SECRET_SELECT: &str =
    "SELECT app, name, sealed, created_at, updated_at, updated_by FROM secret";

fn token(row: &AnyRow) -> Result<TokenRecord> {
    let role: String = row.try_get("role")?;
    let role: Role = role
        .parse()
        .map_err(|err: String| StoreError::Corrupt(format!("api_token.role: {err}")))?;
    let app: String = row.try_get("app")?;
    let worker = match role {
        Role::Worker => Some(worker_scope(row)?),
        _ => None,
    };
    Ok(TokenRecord {
        name: row.try_get("name")?,
        role,
        app: (!app.is_empty()).then_some(app),
        created_at: row.try_get("created_at")?,
        created_by: row.try_get("created_by")?,
        expires_at: row.try_get("expires_at")?,
        revoked_at: row.try_get("revoked_at")?,
        worker,
    })
}

/// A worker token's scope from its columns; one stored before scopes existed (no ids) reads as
/// any id, every app, any labels.
fn worker_scope(row: &AnyRow) -> Result<WorkerScope> {
    let ids: String = row.try_get("worker_ids")?;
    if ids.is_empty() {
        return Ok(WorkerScope::any());
    }
    let list = |column: &str| -> Result<Vec<String>> {
        let text: String = row.try_get(column)?;
        if text.is_empty() {
            return Ok(Vec::new());
        }
        serde_json::from_str(&text)
            .map_err(|err| StoreError::Corrupt(format!("api_token.{column}: {err}")))
    };
    WorkerScope::parse(
        &list("worker_ids")?,
        &list("worker_apps")?,
        &list("worker_labels")?,
    )
    .map_err(|err| StoreError::Corrupt(format!("api_token worker scope: {err}")))
}

fn secret(row: &AnyRow) -> Result<SecretRecord> {
    Ok(SecretRecord {
        app: row.try_get("app")?,
        name: row.try_get("name")?,
        sealed: row.try_get("sealed")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        updated_by: row.try_get("updated_by")?,
    })
}

impl Store {
    /// Stores a new token; `false` (and nothing changed) when its name is taken.
    pub async fn create_token(&self, token: &NewToken) -> Result<bool> {
        let (ids, apps, labels) = match &token.worker {
            Some(scope) => {
                let ids: Vec<&str> = scope.ids.iter().map(|id| id.as_str()).collect();
                (
                    to_json(&ids)?,
                    to_json(&scope.apps)?,
                    to_json(&scope.label_list())?,
                )
            }
            None => Default::default(),
        };
        let inserted = sqlx::query(
            "INSERT INTO api_token (name, role, app, token_hash, created_at, created_by, \
             expires_at, revoked_at, worker_ids, worker_apps, worker_labels) \
             VALUES (?, ?, ?, ?, ?, ?, ?, NULL, ?, ?, ?)",
        )
        .bind(token.name.as_str())
        .bind(token.role.as_str())
        .bind(token.app.as_deref().unwrap_or(""))
        .bind(token.hash.as_str())
        .bind(token.created_at)
        .bind(token.created_by.as_str())
        .bind(token.expires_at)
        .bind(ids)
        .bind(apps)
        .bind(labels)
        .execute(&self.pool)
        .await;
        match inserted {
            Ok(_) => Ok(true),
            Err(err) if db_errors::is_unique_violation(&err) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// Every token, revoked and expired ones too, by name.
    pub async fn list_tokens(&self) -> Result<Vec<TokenRecord>> {
        let sql = format!("{TOKEN_SELECT} ORDER BY name");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(token).collect()
    }

    /// The token whose hash is `hash`, whatever its state.
    pub async fn token_by_hash(&self, hash: &str) -> Result<Option<TokenRecord>> {
        let sql = format!("{TOKEN_SELECT} WHERE token_hash = ?");
        let row = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(token).transpose()
    }

    /// Revokes the token called `name` at `now` (a second revocation keeps the first time);
    /// `None` when no token has that name.
    pub async fn revoke_token(&self, name: &str, now: Millis) -> Result<Option<TokenRecord>> {
        write_tx!(self, |c| async {
            // A second revocation keeps the first one's time.
            sqlx::query(
                "UPDATE api_token SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL",
            )
            .bind(now)
            .bind(name)
            .execute(&mut *c)
            .await?;
            let sql = format!("{TOKEN_SELECT} WHERE name = ?");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(name)
                .fetch_optional(&mut *c)
                .await?;
            row.as_ref().map(token).transpose()
        })
    }

    /// Creates or replaces the secret called `name` of `app` ('' for a global one); another
    /// app's secret of that name is a different secret and stays as it is.
    pub async fn put_secret(
        &self,
        app: &str,
        name: &str,
        sealed: &str,
        now: Millis,
        by: &str,
    ) -> Result<SecretRecord> {
        write_tx!(self, |c| async {
            let tail = self
                .dialect
                .upsert_tail(&["app", "name"], &["sealed", "updated_at", "updated_by"]);
            let sql = format!(
                "INSERT INTO secret (app, name, sealed, created_at, updated_at, updated_by) \
                 VALUES (?, ?, ?, ?, ?, ?){tail}"
            );
            sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(app)
                .bind(name)
                .bind(sealed)
                .bind(now)
                .bind(now)
                .bind(by)
                .execute(&mut *c)
                .await?;
            let sql = format!("{SECRET_SELECT} WHERE app = ? AND name = ?");
            let row = sqlx::query(sqlx::AssertSqlSafe(sql))
                .bind(app)
                .bind(name)
                .fetch_one(&mut *c)
                .await?;
            secret(&row)
        })
    }

    /// Every secret of every app, by app ('' first) then name.
    pub async fn list_secrets(&self) -> Result<Vec<SecretRecord>> {
        let sql = format!("{SECRET_SELECT} ORDER BY app, name");
        let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(secret).collect()
    }

    /// Deletes the secret called `name` of `app` ('' for the global one) and no other; `false`
    /// when that app has no secret of that name.
    pub async fn delete_secret(&self, app: &str, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM secret WHERE app = ? AND name = ?")
            .bind(app)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
