-- Secrets belong to an app: each app has its own namespace of secret names, and '' is the global
-- one (set by an unscoped admin, seen by every app's workflows). A workflow of app X names X's
-- secret of a name, else the global one; a workflow without an app, the global one only. The
-- secrets stored before apps existed become global: they open as before (their name alone is
-- the sealed value's associated data; an app's secret's is `app/name`).
ALTER TABLE secret
    ADD COLUMN app VARCHAR(191) NOT NULL DEFAULT '' FIRST,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (app, name);
ALTER TABLE secret ALTER COLUMN app DROP DEFAULT;
