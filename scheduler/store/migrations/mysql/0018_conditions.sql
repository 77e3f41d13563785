-- Conditions: a task's `if:` (a CEL expression, NULL for none), judged in the advance when the
-- task's trigger rule says it runs.
ALTER TABLE task_definition ADD COLUMN run_if TEXT NULL;
