-- Scheduling decisions that are not a plain start (fired, misfired, skipped by overlap, queued,
-- no worker, throttled, ...), read back by `axctl why`. `slot_at` is the instant the decision is
-- about (a cron slot's logical time, or the time it was made).
CREATE TABLE decision_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at INTEGER NOT NULL,
    workflow_id INTEGER NOT NULL,
    slot_at INTEGER NOT NULL,
    run_id INTEGER NULL,
    instance_id INTEGER NULL,
    task_name TEXT NULL,
    kind TEXT NOT NULL,
    detail TEXT NOT NULL,
    node_id TEXT NOT NULL
);
CREATE INDEX idx_decision_log_workflow ON decision_log (workflow_id, slot_at);
