-- The dispatcher reads WAITING instances highest priority first, then oldest: an index in that
-- order lets it stop after the rows it takes instead of sorting every waiting instance.
CREATE INDEX idx_task_instance_queue ON task_instance (state, priority DESC, id);
