-- Attempts the scheduler withdrew before their worker confirmed a start (the worker died, or
-- came back without them). The next try is a new attempt number, because an attempt number is
-- never dispatched twice, but a withdrawn attempt is not the task's failure: the retry policy
-- counts attempt - withdrawn_attempts.
ALTER TABLE task_instance ADD COLUMN withdrawn_attempts BIGINT NOT NULL DEFAULT 0;
