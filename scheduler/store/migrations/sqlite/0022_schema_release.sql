-- Which release of ax migrated this schema, and the oldest release that may still run on it (the
-- version policy, docs/operations.md). One row (id 1), written by a node whose release is newer
-- than the one recorded; a node whose release is older than oldest_release refuses to start.
-- This and every later migration is recorded in ax_migrations, not _sqlx_migrations, which ax
-- 0.1.0 reads and where it refuses any migration it does not know.
CREATE TABLE schema_release (
    id INTEGER NOT NULL PRIMARY KEY,
    release_name TEXT NOT NULL,
    migration INTEGER NOT NULL,
    oldest_release TEXT NOT NULL
);
