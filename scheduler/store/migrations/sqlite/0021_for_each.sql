-- Dynamic fan-out: a task's `for_each` (its list's source, as JSON; NULL for none) and
-- `max_items`, and the item an item instance of a mapped task runs on (`AX_ITEM`; NULL for any
-- other instance). Items are children of their task's instance as shards are (parent_id,
-- shard_index, shard_total), not pinned to a worker.
ALTER TABLE task_definition ADD COLUMN for_each TEXT NULL;
ALTER TABLE task_definition ADD COLUMN max_items BIGINT NULL;
ALTER TABLE task_instance ADD COLUMN item TEXT NULL;
