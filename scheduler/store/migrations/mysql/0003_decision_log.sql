-- Scheduling decisions that are not a plain start (fired, misfired, skipped by overlap, queued,
-- no worker, throttled, ...), read back by `axctl why`. `slot_at` is the instant the decision is
-- about (a cron slot's logical time, or the time it was made).
CREATE TABLE decision_log (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at BIGINT NOT NULL,
    workflow_id BIGINT NOT NULL,
    slot_at BIGINT NOT NULL,
    run_id BIGINT NULL,
    instance_id BIGINT NULL,
    task_name VARCHAR(191) NULL,
    kind VARCHAR(32) NOT NULL,
    detail MEDIUMTEXT NOT NULL,
    node_id VARCHAR(191) NOT NULL,
    KEY idx_decision_log_workflow (workflow_id, slot_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
