-- The run queue (QUEUED runs, started in creation order when max_active_runs, the keyed
-- concurrency limit or overlap "queue" lets them) and the run key of keyed concurrency.
ALTER TABLE run ADD COLUMN run_key VARCHAR(191) NULL;
CREATE INDEX idx_run_workflow_state ON run (workflow_id, state, run_key);
