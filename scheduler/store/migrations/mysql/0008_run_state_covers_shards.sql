-- The run's instance counts (`run_counts`, the run-end rule) count only a task's own instances
-- (shard_slot = 0). With shard_slot outside the (run_id, state) index every count read each row
-- of the run from the table (10,000 row lookups per GetRun poll on a 10,000-task run); with it
-- inside, the count is an index-only range scan again. The busy probe keeps its (run_id, state)
-- prefix.
ALTER TABLE task_instance
    DROP INDEX idx_task_instance_run_state,
    ADD INDEX idx_task_instance_run_state (run_id, state, shard_slot);
