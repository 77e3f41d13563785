-- The ax store of record on MySQL 8 / MariaDB >= 10.6. Integers are BIGINT (times are epoch
-- milliseconds), strings utf8mb4 with a binary collation so names compare exactly.

CREATE TABLE id_block (
    name VARCHAR(64) NOT NULL PRIMARY KEY,
    next_id BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

INSERT INTO id_block (name, next_id) VALUES ('workflow', 1), ('run', 1), ('task_instance', 1);

CREATE TABLE workflow (
    id BIGINT NOT NULL PRIMARY KEY,
    app VARCHAR(191) NOT NULL,
    name VARCHAR(191) NOT NULL,
    owner VARCHAR(191) NOT NULL,
    latest_version BIGINT NOT NULL,
    paused BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    UNIQUE KEY uq_workflow_name (name),
    KEY idx_workflow_app (app, name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE workflow_version (
    workflow_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    spec_json MEDIUMTEXT NOT NULL,
    source MEDIUMTEXT NOT NULL,
    task_count BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, version)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE task_definition (
    workflow_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    name VARCHAR(191) NOT NULL,
    command MEDIUMTEXT NOT NULL,
    timeout_ms BIGINT NOT NULL,
    retries BIGINT NOT NULL,
    retry_backoff_ms BIGINT NOT NULL,
    priority BIGINT NOT NULL,
    labels_json TEXT NOT NULL,
    upstream_count BIGINT NOT NULL,
    app VARCHAR(191) NOT NULL,
    owner VARCHAR(191) NOT NULL,
    PRIMARY KEY (workflow_id, version, name),
    KEY idx_task_definition_roots (workflow_id, version, upstream_count)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE task_dependency (
    workflow_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    upstream VARCHAR(191) NOT NULL,
    downstream VARCHAR(191) NOT NULL,
    PRIMARY KEY (workflow_id, version, upstream, downstream),
    KEY idx_task_dependency_down (workflow_id, version, downstream, upstream)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE schedule_plan (
    workflow_id BIGINT NOT NULL PRIMARY KEY,
    trigger_type VARCHAR(16) NOT NULL,
    cron VARCHAR(191) NULL,
    timezone VARCHAR(64) NOT NULL,
    paused BIGINT NOT NULL DEFAULT 0,
    next_fire_at BIGINT NULL,
    updated_at BIGINT NOT NULL,
    KEY idx_schedule_plan_due (paused, next_fire_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE run (
    id BIGINT NOT NULL PRIMARY KEY,
    workflow_id BIGINT NOT NULL,
    workflow_version BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL,
    trigger_type VARCHAR(16) NOT NULL,
    logical_time BIGINT NOT NULL,
    dedup_key VARCHAR(191) NULL,
    idempotency_key VARCHAR(191) NULL,
    params_json MEDIUMTEXT NOT NULL,
    triggered_by VARCHAR(191) NOT NULL,
    cancel_requested BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    finished_at BIGINT NULL,
    UNIQUE KEY uq_run_dedup (workflow_id, dedup_key),
    KEY idx_run_workflow (workflow_id, id),
    KEY idx_run_state (state)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE task_instance (
    id BIGINT NOT NULL PRIMARY KEY,
    run_id BIGINT NOT NULL,
    workflow_id BIGINT NOT NULL,
    workflow_version BIGINT NOT NULL,
    task_name VARCHAR(191) NOT NULL,
    state VARCHAR(16) NOT NULL,
    attempt BIGINT NOT NULL,
    worker_id VARCHAR(191) NULL,
    priority BIGINT NOT NULL,
    not_before BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    started_at BIGINT NULL,
    finished_at BIGINT NULL,
    exit_code BIGINT NULL,
    last_heartbeat_at BIGINT NULL,
    UNIQUE KEY uq_task_instance_run_task (run_id, task_name),
    KEY idx_task_instance_dispatch (state, not_before, priority),
    KEY idx_task_instance_run_state (run_id, state)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE task_attempt (
    instance_id BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    state VARCHAR(16) NOT NULL,
    worker_id VARCHAR(191) NULL,
    node_id VARCHAR(191) NULL,
    dispatched_at BIGINT NULL,
    started_at BIGINT NULL,
    finished_at BIGINT NULL,
    exit_code BIGINT NULL,
    signal_num BIGINT NULL,
    pid BIGINT NULL,
    log_lines BIGINT NOT NULL DEFAULT 0,
    message TEXT NOT NULL,
    PRIMARY KEY (instance_id, attempt)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE execution_log (
    instance_id BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    first_seq BIGINT NOT NULL,
    line_count BIGINT NOT NULL,
    streams TEXT NOT NULL,
    body MEDIUMTEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (instance_id, attempt, first_seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE worker (
    id VARCHAR(191) NOT NULL PRIMARY KEY,
    version VARCHAR(191) NOT NULL,
    hostname VARCHAR(191) NOT NULL,
    labels_json TEXT NOT NULL,
    capacity BIGINT NOT NULL,
    running BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    last_heartbeat BIGINT NOT NULL,
    node_id VARCHAR(191) NOT NULL,
    draining BIGINT NOT NULL,
    connected BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

CREATE TABLE audit_log (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    at BIGINT NOT NULL,
    actor VARCHAR(191) NOT NULL,
    action VARCHAR(64) NOT NULL,
    target VARCHAR(191) NOT NULL,
    detail MEDIUMTEXT NOT NULL,
    remote VARCHAR(191) NOT NULL,
    KEY idx_audit_log_at (at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
