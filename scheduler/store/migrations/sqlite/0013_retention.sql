-- Retention (the purger and `axctl purge`): a workflow's ended runs in end order, so a batch of
-- runs that ended before a cutoff is one range of this index, however many runs follow it;
-- and a run's decisions by run, so they are deleted with it by primary key.
CREATE INDEX idx_run_finished ON run (workflow_id, finished_at, id);
CREATE INDEX idx_decision_log_run ON decision_log (run_id);
