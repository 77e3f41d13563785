// The ax web UI: one page that routes itself, reading the node's JSON API (/api/v1) and its
// Server-Sent Events. Names, params and task output are data, never markup: every value
// reaches the page through text nodes (dom.js h()), nothing through innerHTML.

import { prefs, showPrefs } from "./format.js";
import { route, setRoutes } from "./router.js";
import { viewWorkflow, viewWorkflows } from "./workflows.js";
import { viewRun } from "./run.js";
import { viewInstance } from "./instance.js";
import { viewWorkers } from "./workers.js";
import { viewWhy } from "./why.js";
import { viewAudit } from "./audit.js";
import { viewTrigger } from "./trigger.js";
import { viewBackfill } from "./backfill.js";
import { showIdentity } from "./session.js";
import { viewRuns } from "./runs.js";
import { viewGrid } from "./grid.js";

setRoutes([
  [/^\/$/, viewWorkflows],
  [/^\/workflows$/, viewWorkflows],
  [/^\/workflows\/([^/]+)$/, viewWorkflow],
  [/^\/workflows\/([^/]+)\/why$/, viewWhy],
  [/^\/workflows\/([^/]+)\/grid$/, viewGrid],
  [/^\/workflows\/([^/]+)\/trigger$/, viewTrigger],
  [/^\/workflows\/([^/]+)\/backfill$/, viewBackfill],
  [/^\/runs$/, viewRuns],
  [/^\/runs\/(\d+)$/, viewRun],
  [/^\/instances\/(\d+)$/, viewInstance],
  [/^\/workers$/, viewWorkers],
  [/^\/audit$/, viewAudit],
]);

document.getElementById("zone-toggle").addEventListener("click", () => { prefs.utc = !prefs.utc; showPrefs(); route(); });
document.getElementById("theme-toggle").addEventListener("click", () => { prefs.theme = prefs.theme === "dark" ? "light" : "dark"; showPrefs(); });
showPrefs();
showIdentity();
route();
