-- Deadlines (`deadline:` in a workflow file). `deadline_at` is the instant a run must have ended
-- by: set when the run is created for a wall-clock deadline, when it starts for a duration
-- (`deadline_after_ms`, kept so a queued run gets its deadline when it leaves the queue).
-- `deadline_missed_at` is when a node judged the deadline missed: set once, by a conditional
-- update, so two nodes never both judge a run. The index serves the judge's read: active runs
-- by deadline.
ALTER TABLE run
    ADD COLUMN deadline_at BIGINT NULL,
    ADD COLUMN deadline_after_ms BIGINT NULL,
    ADD COLUMN deadline_missed_at BIGINT NULL,
    ADD INDEX idx_run_deadline (state, deadline_at);
