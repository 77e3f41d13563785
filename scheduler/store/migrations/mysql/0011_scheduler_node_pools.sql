-- The [pools] a node was started with, as `name=limit` pairs in name order, so a node that joins
-- can tell when its pools differ from another live node's (pool limits are cluster-wide).
ALTER TABLE scheduler_node ADD COLUMN pools TEXT NOT NULL DEFAULT '';
