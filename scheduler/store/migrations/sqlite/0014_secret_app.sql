-- Secrets belong to an app: each app has its own namespace of secret names, and '' is the global
-- one (set by an unscoped admin, seen by every app's workflows). A workflow of app X names X's
-- secret of a name, else the global one; a workflow without an app, the global one only. The
-- secrets stored before apps existed become global: they open as before (their name alone is
-- the sealed value's associated data; an app's secret's is `app/name`).
CREATE TABLE secret_by_app (
    app TEXT NOT NULL,
    name TEXT NOT NULL,
    sealed TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    updated_by TEXT NOT NULL,
    PRIMARY KEY (app, name)
);
INSERT INTO secret_by_app (app, name, sealed, created_at, updated_at, updated_by)
    SELECT '', name, sealed, created_at, updated_at, updated_by FROM secret;
DROP TABLE secret;
ALTER TABLE secret_by_app RENAME TO secret;
