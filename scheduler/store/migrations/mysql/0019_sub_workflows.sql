-- Sub-workflows (`run_workflow:` on a task). A task's `run_workflow` (the workflow it starts a
-- run of; NULL for a task that runs a command) and its `params` templates (a JSON object).
-- A child run names the run, instance and attempt that started it. `sub_workflow_wait` has one
-- row per parent attempt that started a child (its primary key, with the child run's dedup key
-- `parent:<instance>:<attempt>`, is why one attempt never has two children); `closed_at` is set
-- once both sides have ended, so the sweep reads only the open waits. The index on
-- `run_workflow` lets the dispatcher find the few tasks that start a run without a scan.
ALTER TABLE task_definition
    ADD COLUMN run_workflow VARCHAR(191) NULL,
    ADD COLUMN run_params MEDIUMTEXT NULL;
ALTER TABLE run
    ADD COLUMN parent_run_id BIGINT NULL,
    ADD COLUMN parent_instance_id BIGINT NULL,
    ADD COLUMN parent_attempt BIGINT NULL,
    ADD INDEX idx_run_parent (parent_run_id);
CREATE TABLE sub_workflow_wait (
    parent_instance_id BIGINT NOT NULL,
    parent_attempt BIGINT NOT NULL,
    parent_run_id BIGINT NOT NULL,
    child_run_id BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    closed_at BIGINT NULL,
    PRIMARY KEY (parent_instance_id, parent_attempt),
    KEY idx_sub_workflow_wait_open (closed_at),
    KEY idx_sub_workflow_wait_parent_run (parent_run_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
CREATE INDEX idx_task_definition_run_workflow ON task_definition (run_workflow);
