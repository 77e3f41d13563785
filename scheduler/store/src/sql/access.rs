//! API tokens (by name, and by the hash a request's token is looked up with) and sealed
//! secrets. Neither table holds anything a reader of the database could use: a token is stored
//! as its SHA-256, a secret as the nodes' AEAD seal of its value.

use ax_core::Millis;
use ax_core::access::Role;
use ax_core::worker_scope::WorkerScope;
use sqlx::Row;
use sqlx::any::AnyRow;

use super::rows::to_json;
use super::{SqlStore, db_errors, write_tx};
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

pub(crate) async fn create_token(store: &SqlStore, new: &NewToken) -> Result<bool> {
    let (ids, apps, labels) = match &new.worker {
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
    .bind(new.name.as_str())
    .bind(new.role.as_str())
    .bind(new.app.as_deref().unwrap_or(""))
    .bind(new.hash.as_str())
    .bind(new.created_at)
    .bind(new.created_by.as_str())
    .bind(new.expires_at)
    .bind(ids)
    .bind(apps)
    .bind(labels)
    .execute(&store.pool)
    .await;
    match inserted {
        Ok(_) => Ok(true),
        Err(err) if db_errors::is_unique_violation(&err) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

pub(crate) async fn list_tokens(store: &SqlStore) -> Result<Vec<TokenRecord>> {
    let sql = format!("{TOKEN_SELECT} ORDER BY name");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(token).collect()
}

pub(crate) async fn token_by_hash(store: &SqlStore, hash: &str) -> Result<Option<TokenRecord>> {
    let sql = format!("{TOKEN_SELECT} WHERE token_hash = ?");
    let row = sqlx::query(sqlx::AssertSqlSafe(sql))
        .bind(hash)
        .fetch_optional(&store.pool)
        .await?;
    row.as_ref().map(token).transpose()
}

pub(crate) async fn revoke_token(
    store: &SqlStore,
    name: &str,
    now: Millis,
) -> Result<Option<TokenRecord>> {
    write_tx!(store, |c| async {
        // A second revocation keeps the first one's time.
        sqlx::query("UPDATE api_token SET revoked_at = ? WHERE name = ? AND revoked_at IS NULL")
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

pub(crate) async fn put_secret(
    store: &SqlStore,
    app: &str,
    name: &str,
    sealed: &str,
    now: Millis,
    by: &str,
) -> Result<SecretRecord> {
    write_tx!(store, |c| async {
        let tail = store
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

pub(crate) async fn list_secrets(store: &SqlStore) -> Result<Vec<SecretRecord>> {
    let sql = format!("{SECRET_SELECT} ORDER BY app, name");
    let rows = sqlx::query(sqlx::AssertSqlSafe(sql))
        .fetch_all(&store.pool)
        .await?;
    rows.iter().map(secret).collect()
}

pub(crate) async fn delete_secret(store: &SqlStore, app: &str, name: &str) -> Result<bool> {
    let done = sqlx::query("DELETE FROM secret WHERE app = ? AND name = ?")
        .bind(app)
        .bind(name)
        .execute(&store.pool)
        .await?;
    Ok(done.rows_affected() > 0)
}
