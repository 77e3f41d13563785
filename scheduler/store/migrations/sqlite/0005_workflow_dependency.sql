-- Cross-workflow dependencies (`schedule.after`): one row per (upstream workflow name, dependent
-- workflow), maintained at apply. The upstream is named, not numbered, because it may be applied
-- after its dependent. When a run ends SUCCESS the store reads the dependents of its workflow by
-- the primary key, and each dependent's upstreams by the second index.
CREATE TABLE workflow_dependency (
    upstream_name TEXT NOT NULL,
    downstream_id BIGINT NOT NULL,
    position BIGINT NOT NULL,
    PRIMARY KEY (upstream_name, downstream_id)
);
CREATE INDEX idx_workflow_dependency_down ON workflow_dependency (downstream_id, position);
-- "Has workflow W a successful run for logical time L?" is one index probe.
CREATE INDEX idx_run_logical_time ON run (workflow_id, logical_time, state);
