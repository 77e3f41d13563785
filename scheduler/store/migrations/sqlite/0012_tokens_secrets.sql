-- API tokens: only a hash of each token is stored (the token is shown once, at creation).
-- `app` scopes a token to one app's workflows ('' for none).
CREATE TABLE api_token (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    role TEXT NOT NULL,
    app TEXT NOT NULL,
    token_hash TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    created_by TEXT NOT NULL,
    expires_at BIGINT NULL,
    revoked_at BIGINT NULL
);
CREATE UNIQUE INDEX uq_api_token_name ON api_token (name);
CREATE UNIQUE INDEX uq_api_token_hash ON api_token (token_hash);

-- Secrets workflows refer to by name, sealed with the schedulers' key (base64; the name is the sealed
-- value's associated data, so a value moved to another name does not open).
CREATE TABLE secret (
    name TEXT NOT NULL PRIMARY KEY,
    sealed TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    updated_by TEXT NOT NULL
);

-- The token a mutating call came with ('' when the node runs without authentication).
ALTER TABLE audit_log ADD COLUMN token TEXT NOT NULL DEFAULT '';
