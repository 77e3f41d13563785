-- Concurrency limits and sharded broadcast.
--
-- `concurrency_slot` has one row per limited scope (`task:<workflow id>:<task>`,
-- `workflow:<workflow id>`, `pool:<name>`); `used` is the number of instances that hold the scope.
-- An instance holds the scopes listed in its `held_slots` (newline-separated) from its claim
-- until its attempt ends. Invariant: for every scope S, concurrency_slot.used = the number of
-- task_instance rows whose held_slots contains S; both change in the same transactions.
--
-- A sharded task's instance (the parent, shard_slot 0) fans out into shard instances of the same
-- task (parent_id, parent_attempt, shard_index, shard_total, pinned_worker); a shard's
-- shard_slot is its own id, so the unique key on (run, task, shard_slot) keeps one parent per
-- (run, task) and allows any number of shards.
ALTER TABLE task_instance
    ADD COLUMN held_slots VARCHAR(1024) NOT NULL DEFAULT '',
    ADD COLUMN parent_id BIGINT NULL,
    ADD COLUMN parent_attempt BIGINT NULL,
    ADD COLUMN shard_index BIGINT NULL,
    ADD COLUMN shard_total BIGINT NULL,
    ADD COLUMN pinned_worker VARCHAR(191) NULL,
    ADD COLUMN shard_slot BIGINT NOT NULL DEFAULT 0,
    DROP INDEX uq_task_instance_run_task,
    ADD UNIQUE KEY uq_task_instance_run_task_shard (run_id, task_name, shard_slot),
    ADD KEY idx_task_instance_parent (parent_id, parent_attempt, state);

CREATE TABLE concurrency_slot (
    scope VARCHAR(191) NOT NULL PRIMARY KEY,
    used BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- A Throttled or NoWorker decision is recorded once per instance and reason.
CREATE INDEX idx_decision_log_instance ON decision_log (instance_id, kind);
