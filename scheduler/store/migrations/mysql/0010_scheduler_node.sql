-- One lease per scheduler node. Every time in it is on the database's clock (milliseconds since
-- the epoch), so nodes whose own clocks differ judge leases alike. A node renews its row every
-- few seconds; a row whose expires_at has passed belongs to a node that is gone.
CREATE TABLE scheduler_node (
    node_id VARCHAR(191) NOT NULL PRIMARY KEY,
    incarnation VARCHAR(64) NOT NULL,
    address VARCHAR(191) NOT NULL,
    version VARCHAR(64) NOT NULL,
    started_at BIGINT NOT NULL,
    renewed_at BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    clock_offset_ms BIGINT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;
