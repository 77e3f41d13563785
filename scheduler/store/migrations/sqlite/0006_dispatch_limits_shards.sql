-- Concurrency limits and sharded broadcast: see the MySQL migration of the same number.
ALTER TABLE task_instance ADD COLUMN held_slots TEXT NOT NULL DEFAULT '';
ALTER TABLE task_instance ADD COLUMN parent_id INTEGER NULL;
ALTER TABLE task_instance ADD COLUMN parent_attempt INTEGER NULL;
ALTER TABLE task_instance ADD COLUMN shard_index INTEGER NULL;
ALTER TABLE task_instance ADD COLUMN shard_total INTEGER NULL;
ALTER TABLE task_instance ADD COLUMN pinned_worker TEXT NULL;
ALTER TABLE task_instance ADD COLUMN shard_slot INTEGER NOT NULL DEFAULT 0;
DROP INDEX uq_task_instance_run_task;
CREATE UNIQUE INDEX uq_task_instance_run_task_shard ON task_instance (run_id, task_name, shard_slot);
CREATE INDEX idx_task_instance_parent ON task_instance (parent_id, parent_attempt, state);

CREATE TABLE concurrency_slot (
    scope TEXT NOT NULL PRIMARY KEY,
    used INTEGER NOT NULL
);

CREATE INDEX idx_decision_log_instance ON decision_log (instance_id, kind);
