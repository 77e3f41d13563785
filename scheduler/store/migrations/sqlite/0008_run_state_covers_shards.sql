-- The run's instance counts (`run_counts`, the run-end rule) count only a task's own instances
-- (shard_slot = 0). With shard_slot outside the (run_id, state) index every count read each row
-- of the run from the table; with it inside, the count is an index-only range scan again. The
-- busy probe keeps its (run_id, state) prefix.
DROP INDEX idx_task_instance_run_state;
CREATE INDEX idx_task_instance_run_state ON task_instance (run_id, state, shard_slot);
