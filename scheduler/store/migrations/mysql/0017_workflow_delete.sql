-- A workflow can be deleted (`axctl delete workflow`, `axctl apply --prune`). Its row stays, with
-- its versions and runs: the history is kept and purged by retention like any run's, and
-- `deleted_at` says when it went. `live_name` is the name while the workflow lives and NULL once
-- it is deleted; the unique key moves to it, so a deleted name can be applied again, as a new
-- workflow with a history of its own.
ALTER TABLE workflow
    ADD COLUMN live_name VARCHAR(191) NULL,
    ADD COLUMN deleted_at BIGINT NULL;
UPDATE workflow SET live_name = name;
ALTER TABLE workflow
    DROP INDEX uq_workflow_name,
    ADD UNIQUE KEY uq_workflow_live_name (live_name);
