//! The database error codes the store acts on, and the functions that classify an error by them.
//!
//! Three questions are asked of a failed statement or transaction: did it take a unique key
//! that a row holds already (a racing writer won: read its row), may the whole transaction
//! simply be tried again (a deadlock, a lock wait that timed out, a busy SQLite file), and was
//! the database out of reach rather than refusing a statement. Each backend answers in its own
//! numbers: MySQL and MariaDB by error number (`MySqlDatabaseError::number`), SQLite by extended
//! result code (the text of `DatabaseError::code`). The numbers are named here and read nowhere
//! else, so every other file asks these functions and none matches a code.

use sqlx::error::DatabaseError;
use sqlx::mysql::MySqlDatabaseError;

use crate::StoreError;

/// MySQL `ER_DUP_ENTRY`: an insert or update gave a unique or primary key a value that a row
/// holds already (the code MySQL and MariaDB return for every store statement that races).
pub(crate) const MYSQL_DUPLICATE_KEY: u16 = 1062;

/// MySQL `ER_DUP_KEY`: a statement could not write a row because of a duplicate key.
pub(crate) const MYSQL_DUP_KEY: u16 = 1022;

/// MySQL `ER_DUP_UNIQUE`: the NDB cluster's form of [`MYSQL_DUPLICATE_KEY`].
pub(crate) const MYSQL_DUP_UNIQUE: u16 = 1169;

/// MySQL `ER_DUP_ENTRY_WITH_KEY_NAME`: [`MYSQL_DUPLICATE_KEY`] with the key named in the message.
pub(crate) const MYSQL_DUP_ENTRY_WITH_KEY_NAME: u16 = 1586;

/// MySQL `ER_DUP_UNKNOWN_IN_INDEX`: a duplicate entry found while building a unique index.
pub(crate) const MYSQL_DUP_UNKNOWN_IN_INDEX: u16 = 1859;

/// Every MySQL number that says a unique or primary key is taken: the set sqlx's
/// `DatabaseError::is_unique_violation` checks for MySQL.
const MYSQL_UNIQUE_VIOLATIONS: [u16; 5] = [
    MYSQL_DUPLICATE_KEY,
    MYSQL_DUP_KEY,
    MYSQL_DUP_UNIQUE,
    MYSQL_DUP_ENTRY_WITH_KEY_NAME,
    MYSQL_DUP_UNKNOWN_IN_INDEX,
];

/// MySQL `ER_LOCK_DEADLOCK`: InnoDB chose this transaction as a deadlock's victim and rolled it
/// back; the same transaction tried again usually goes through.
pub(crate) const MYSQL_DEADLOCK: u16 = 1213;

/// MySQL `ER_LOCK_WAIT_TIMEOUT`: a row lock was not granted within `innodb_lock_wait_timeout`.
pub(crate) const MYSQL_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// MySQL `ER_TRANSACTION_ROLLBACK_DURING_COMMIT`: Group Replication rolled the transaction back at
/// commit (it lost certification to a conflicting transaction of another member); tried again,
/// it reads what won.
pub(crate) const MYSQL_ROLLBACK_DURING_COMMIT: u16 = 3101;

/// MySQL `ER_UNKNOWN_COM_ERROR`, which a Galera node returns for every statement while it is not
/// part of the primary component or not synced ("WSREP has not yet prepared node for application
/// use"): this server cannot serve writes now, as if it were out of reach.
pub(crate) const MYSQL_WSREP_NOT_READY: u16 = 1047;

/// MySQL `ER_RUN_HOOK_ERROR`: Group Replication's commit hook failed (the member left the group or
/// is in error): this server cannot commit now.
pub(crate) const MYSQL_REPLICATION_HOOK_ERROR: u16 = 3100;

/// SQLite `SQLITE_BUSY`: another connection (of this or another process) holds the lock the
/// statement needs, past the busy timeout.
pub(crate) const SQLITE_BUSY: i32 = 5;

/// SQLite `SQLITE_BUSY_RECOVERY`: another connection is recovering the WAL file.
pub(crate) const SQLITE_BUSY_RECOVERY: i32 = 261;

/// SQLite `SQLITE_BUSY_SNAPSHOT`: a read transaction cannot become a write transaction because
/// the database changed since its snapshot.
pub(crate) const SQLITE_BUSY_SNAPSHOT: i32 = 517;

/// SQLite `SQLITE_LOCKED`: a conflict inside one connection or shared cache.
pub(crate) const SQLITE_LOCKED: i32 = 6;

/// SQLite `SQLITE_LOCKED_SHAREDCACHE`: a table of the shared cache is locked by another
/// connection.
pub(crate) const SQLITE_LOCKED_SHAREDCACHE: i32 = 262;

/// SQLite `SQLITE_CONSTRAINT_PRIMARYKEY`: an insert or update gave a primary key a value that a
/// row holds already.
pub(crate) const SQLITE_CONSTRAINT_PRIMARYKEY: i32 = 1555;

/// SQLite `SQLITE_CONSTRAINT_UNIQUE`: an insert or update gave a unique index a value that a row
/// holds already.
pub(crate) const SQLITE_CONSTRAINT_UNIQUE: i32 = 2067;

/// A database's refusal, told by its backend's own number.
enum Code {
    MySql(u16),
    Sqlite(i32),
    Other,
}

fn code_of(db: &dyn DatabaseError) -> Code {
    if let Some(mysql) = db.try_downcast_ref::<MySqlDatabaseError>() {
        return Code::MySql(mysql.number());
    }
    // SQLite's code is its extended result code, in decimal.
    match db.code().and_then(|code| code.parse::<i32>().ok()) {
        Some(code) => Code::Sqlite(code),
        None => Code::Other,
    }
}

/// Whether a statement failed because a unique or primary key it wrote is taken.
pub(crate) fn is_unique_violation(err: &sqlx::Error) -> bool {
    let sqlx::Error::Database(db) = err else {
        return false;
    };
    match code_of(db.as_ref()) {
        Code::MySql(number) => MYSQL_UNIQUE_VIOLATIONS.contains(&number),
        Code::Sqlite(code) => matches!(
            code,
            SQLITE_CONSTRAINT_UNIQUE | SQLITE_CONSTRAINT_PRIMARYKEY
        ),
        Code::Other => false,
    }
}

/// Whether a failed transaction may succeed when simply tried again: a MySQL deadlock or lock
/// wait timeout, or SQLite busy or locked (another process holds the write lock too long).
pub(crate) fn is_retryable(err: &StoreError) -> bool {
    let StoreError::Database(sqlx::Error::Database(db)) = err else {
        return false;
    };
    match code_of(db.as_ref()) {
        Code::MySql(number) => matches!(
            number,
            MYSQL_DEADLOCK | MYSQL_LOCK_WAIT_TIMEOUT | MYSQL_ROLLBACK_DURING_COMMIT
        ),
        Code::Sqlite(code) => matches!(
            code,
            SQLITE_BUSY
                | SQLITE_BUSY_RECOVERY
                | SQLITE_BUSY_SNAPSHOT
                | SQLITE_LOCKED
                | SQLITE_LOCKED_SHAREDCACHE
        ),
        Code::Other => false,
    }
}

/// Whether the database could not be reached (connection lost or refused, pool exhausted or
/// closed), or the server answers but cannot serve: a cluster member outside the primary
/// component or out of the group. Either way this node is cut off from the store.
pub(crate) fn is_unreachable(err: &StoreError) -> bool {
    match err {
        StoreError::Database(
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed,
        ) => true,
        StoreError::Database(sqlx::Error::Database(db)) => matches!(
            code_of(db.as_ref()),
            Code::MySql(MYSQL_WSREP_NOT_READY | MYSQL_REPLICATION_HOOK_ERROR)
        ),
        _ => false,
    }
}
