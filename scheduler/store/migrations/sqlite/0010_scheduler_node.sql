-- One lease per scheduler node. Every time in it is on the database's clock (milliseconds since
-- the epoch), so nodes whose own clocks differ judge leases alike. A node renews its row every
-- few seconds; a row whose expires_at has passed belongs to a node that is gone.
CREATE TABLE scheduler_node (
    node_id TEXT NOT NULL PRIMARY KEY,
    incarnation TEXT NOT NULL,
    address TEXT NOT NULL,
    version TEXT NOT NULL,
    started_at BIGINT NOT NULL,
    renewed_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    clock_offset_ms BIGINT NOT NULL
);
