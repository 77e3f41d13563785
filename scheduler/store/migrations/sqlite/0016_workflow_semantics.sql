-- Trigger rules and handlers. A task's rule (`all_success` for every task stored before rules
-- existed) and the group it starts with: 'run' for a task a new run starts with (no upstream, or
-- the rule `always`), 'on_failure' / 'on_success' for the first tasks of a handler list, NULL for
-- every other task. `handler` names the list a handler task belongs to.
ALTER TABLE task_definition ADD COLUMN trigger_rule TEXT NOT NULL DEFAULT 'all_success';
ALTER TABLE task_definition ADD COLUMN handler TEXT NULL;
ALTER TABLE task_definition ADD COLUMN start_group TEXT NULL;
UPDATE task_definition SET start_group = 'run' WHERE upstream_count = 0;
CREATE INDEX idx_task_definition_start ON task_definition (workflow_id, version, start_group);

-- How many tasks each handler list of a version has, so the end of a run knows without a read.
ALTER TABLE workflow_version ADD COLUMN on_failure_tasks BIGINT NOT NULL DEFAULT 0;
ALTER TABLE workflow_version ADD COLUMN on_success_tasks BIGINT NOT NULL DEFAULT 0;

-- The outcome a run's handlers were started for (NULL while none was), and what they are told
-- (a JSON object of environment variables: AX_RUN_STATE, AX_FAILED_TASKS).
ALTER TABLE run ADD COLUMN handlers_for TEXT NULL;
ALTER TABLE run ADD COLUMN handler_env_json TEXT NULL;

-- Outputs: what a successful attempt passed on (a JSON object, NULL for none), the bytes a run's
-- attempts passed on together (held under a limit), and the output references of a task's
-- command, argv and env (a JSON array of [task, key], NULL for none), checked when it is ready.
ALTER TABLE task_attempt ADD COLUMN outputs_json TEXT NULL;
ALTER TABLE run ADD COLUMN outputs_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE task_definition ADD COLUMN output_refs TEXT NULL;
