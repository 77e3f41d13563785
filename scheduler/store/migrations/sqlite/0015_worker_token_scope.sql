-- A worker token's scope, as JSON arrays of strings: the worker ids it may register (each an id,
-- a prefix ending in '*', or '*'), the apps whose tasks it is sent and the labels it may claim
-- (key=value). '' for a worker token made before scopes existed: any id, every app, any labels.
ALTER TABLE api_token ADD COLUMN worker_ids TEXT NOT NULL DEFAULT '';
ALTER TABLE api_token ADD COLUMN worker_apps TEXT NOT NULL DEFAULT '';
ALTER TABLE api_token ADD COLUMN worker_labels TEXT NOT NULL DEFAULT '';

-- What every node needs of a worker connected elsewhere: the apps its token lets it run (a JSON
-- array; '' for every app), for placements across nodes; and the incarnation of its process, so
-- a node tells the same process moving from a second one under the same id.
ALTER TABLE worker ADD COLUMN apps_json TEXT NOT NULL DEFAULT '';
ALTER TABLE worker ADD COLUMN incarnation TEXT NOT NULL DEFAULT '';
