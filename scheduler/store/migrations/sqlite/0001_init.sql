-- The ax store of record on SQLite (the embedded default). Same tables, columns and indexes as
-- the MySQL migration of the same number; integers are 64-bit, times epoch milliseconds.

CREATE TABLE id_block (
    name TEXT NOT NULL PRIMARY KEY,
    next_id BIGINT NOT NULL
);

INSERT INTO id_block (name, next_id) VALUES ('workflow', 1), ('run', 1), ('task_instance', 1);

CREATE TABLE workflow (
    id BIGINT NOT NULL PRIMARY KEY,
    app TEXT NOT NULL,
    name TEXT NOT NULL,
    owner TEXT NOT NULL,
    latest_version BIGINT NOT NULL,
    paused BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE workflow_version (
    workflow_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    spec_json TEXT NOT NULL,
    source TEXT NOT NULL,
    task_count BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (workflow_id, version)
);

CREATE TABLE task_definition (
    workflow_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    name TEXT NOT NULL,
    command TEXT NOT NULL,
    timeout_ms BIGINT NOT NULL,
    retries BIGINT NOT NULL,
    retry_backoff_ms BIGINT NOT NULL,
    priority BIGINT NOT NULL,
    labels_json TEXT NOT NULL,
    upstream_count BIGINT NOT NULL,
    app TEXT NOT NULL,
    owner TEXT NOT NULL,
    PRIMARY KEY (workflow_id, version, name)
);

CREATE TABLE task_dependency (
    workflow_id BIGINT NOT NULL,
    version BIGINT NOT NULL,
    upstream TEXT NOT NULL,
    downstream TEXT NOT NULL,
    PRIMARY KEY (workflow_id, version, upstream, downstream)
);

CREATE TABLE schedule_plan (
    workflow_id BIGINT NOT NULL PRIMARY KEY,
    trigger_type TEXT NOT NULL,
    cron TEXT NULL,
    timezone TEXT NOT NULL,
    paused BIGINT NOT NULL DEFAULT 0,
    next_fire_at BIGINT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE run (
    id BIGINT NOT NULL PRIMARY KEY,
    workflow_id BIGINT NOT NULL,
    workflow_version BIGINT NOT NULL,
    state TEXT NOT NULL,
    trigger_type TEXT NOT NULL,
    logical_time BIGINT NOT NULL,
    dedup_key TEXT NULL,
    idempotency_key TEXT NULL,
    params_json TEXT NOT NULL,
    triggered_by TEXT NOT NULL,
    cancel_requested BIGINT NOT NULL DEFAULT 0,
    created_at BIGINT NOT NULL,
    finished_at BIGINT NULL
);

CREATE TABLE task_instance (
    id BIGINT NOT NULL PRIMARY KEY,
    run_id BIGINT NOT NULL,
    workflow_id BIGINT NOT NULL,
    workflow_version BIGINT NOT NULL,
    task_name TEXT NOT NULL,
    state TEXT NOT NULL,
    attempt BIGINT NOT NULL,
    worker_id TEXT NULL,
    priority BIGINT NOT NULL,
    not_before BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    started_at BIGINT NULL,
    finished_at BIGINT NULL,
    exit_code BIGINT NULL,
    last_heartbeat_at BIGINT NULL
);

CREATE TABLE task_attempt (
    instance_id BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    state TEXT NOT NULL,
    worker_id TEXT NULL,
    node_id TEXT NULL,
    dispatched_at BIGINT NULL,
    started_at BIGINT NULL,
    finished_at BIGINT NULL,
    exit_code BIGINT NULL,
    signal_num BIGINT NULL,
    pid BIGINT NULL,
    log_lines BIGINT NOT NULL DEFAULT 0,
    message TEXT NOT NULL,
    PRIMARY KEY (instance_id, attempt)
);

CREATE TABLE execution_log (
    instance_id BIGINT NOT NULL,
    attempt BIGINT NOT NULL,
    first_seq BIGINT NOT NULL,
    line_count BIGINT NOT NULL,
    streams TEXT NOT NULL,
    body TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (instance_id, attempt, first_seq)
);

CREATE TABLE worker (
    id TEXT NOT NULL PRIMARY KEY,
    version TEXT NOT NULL,
    hostname TEXT NOT NULL,
    labels_json TEXT NOT NULL,
    capacity BIGINT NOT NULL,
    running BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    last_heartbeat BIGINT NOT NULL,
    node_id TEXT NOT NULL,
    draining BIGINT NOT NULL,
    connected BIGINT NOT NULL
);

CREATE TABLE audit_log (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at BIGINT NOT NULL,
    actor TEXT NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    detail TEXT NOT NULL,
    remote TEXT NOT NULL
);

CREATE UNIQUE INDEX uq_workflow_name ON workflow (name);
CREATE INDEX idx_workflow_app ON workflow (app, name);
CREATE INDEX idx_task_definition_roots ON task_definition (workflow_id, version, upstream_count);
CREATE INDEX idx_task_dependency_down ON task_dependency (workflow_id, version, downstream, upstream);
CREATE INDEX idx_schedule_plan_due ON schedule_plan (paused, next_fire_at);
CREATE UNIQUE INDEX uq_run_dedup ON run (workflow_id, dedup_key);
CREATE INDEX idx_run_workflow ON run (workflow_id, id);
CREATE INDEX idx_run_state ON run (state);
CREATE UNIQUE INDEX uq_task_instance_run_task ON task_instance (run_id, task_name);
CREATE INDEX idx_task_instance_dispatch ON task_instance (state, not_before, priority);
CREATE INDEX idx_task_instance_run_state ON task_instance (run_id, state);
CREATE INDEX idx_audit_log_at ON audit_log (at);
