-- API tokens: only a hash of each token is stored (the token is shown once, at creation).
-- `app` scopes a token to one app's workflows ('' for none).
CREATE TABLE api_token (
    id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
    name VARCHAR(64) NOT NULL,
    role VARCHAR(16) NOT NULL,
    app VARCHAR(191) NOT NULL,
    token_hash CHAR(64) NOT NULL,
    created_at BIGINT NOT NULL,
    created_by VARCHAR(191) NOT NULL,
    expires_at BIGINT NULL,
    revoked_at BIGINT NULL,
    UNIQUE KEY uq_api_token_name (name),
    UNIQUE KEY uq_api_token_hash (token_hash)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- Secrets workflows refer to by name, sealed with the schedulers' key (base64; the name is the sealed
-- value's associated data, so a value moved to another name does not open).
CREATE TABLE secret (
    name VARCHAR(191) NOT NULL PRIMARY KEY,
    sealed TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    updated_by VARCHAR(191) NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin;

-- The token a mutating call came with ('' when the node runs without authentication).
ALTER TABLE audit_log ADD COLUMN token VARCHAR(64) NOT NULL DEFAULT '';
