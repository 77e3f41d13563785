//! The SQL implementation of [`Store`](crate::Store) for MySQL and SQLite.

use crate::{Result, StoreError};

/// Placeholder until the SQL backends land; `connect` refuses every url.
pub struct SqlStore;

impl SqlStore {
    pub async fn connect(url: &str) -> Result<SqlStore> {
        Err(StoreError::UnsupportedUrl(url.to_string()))
    }
}
