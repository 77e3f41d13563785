-- The dispatcher reads WAITING instances highest priority first, then in the order they became
-- ready (not_before: created, or a retry's backoff ended), then by id: ids come from blocks each
-- node reserves for itself, so a lower id is not always an older instance.
DROP INDEX idx_task_instance_queue;
CREATE INDEX idx_task_instance_queue ON task_instance (state, priority DESC, not_before, id);
