-- The promotion of queued runs reads `WHERE workflow_id = ? AND state = 'QUEUED' ORDER BY id`
-- on every run end: this index answers it in order, without sorting (idx_run_workflow_state has
-- run_key between state and id).
CREATE INDEX idx_run_queue_order ON run (workflow_id, state, id);
