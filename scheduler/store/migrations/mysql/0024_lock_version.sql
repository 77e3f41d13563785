-- On a multi-primary cluster (Galera, Group Replication) a row lock holds on one database
-- server only, and certification compares the rows transactions wrote: a decision taken on a
-- workflow's or a run's row that it locked without changing it (run limits, a run's last task)
-- also bumps this counter there, so two racing decisions on two servers conflict.
ALTER TABLE workflow ADD COLUMN lock_version BIGINT NOT NULL DEFAULT 0;
ALTER TABLE run ADD COLUMN lock_version BIGINT NOT NULL DEFAULT 0;
