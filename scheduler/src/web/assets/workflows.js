// The workflows list and a workflow's page.

import { fill, h, kv, link, num, show, unchanged } from "./dom.js";
import { STATES, chip, fmtDuration, fmtTime, slotTime, stateName, time } from "./format.js";
import { api, enc, poll } from "./api.js";
import { route } from "./router.js";
import { actionButton } from "./actions.js";
import { dagView } from "./dag.js";
import { runsTable } from "./runs.js";

export function scheduleText(schedule) {
  if (!schedule) return "manual";
  const trigger = String(schedule.trigger || "").replace("TRIGGER_KIND_", "").toLowerCase();
  if (trigger === "cron") return schedule.cron + " (" + (schedule.timezone || "UTC") + ")";
  if (trigger === "dependency") return "after " + (schedule.after || []).join(", ");
  return trigger || "manual";
}

export function runStrip(runs) {
  const strip = h("span", { class: "strip" });
  for (const run of (runs || []).slice().reverse()) {
    const name = stateName(run.state);
    strip.append(h("a", { href: "/runs/" + run.id, class: "cell s-" + name.toLowerCase(), "aria-label": "run " + run.id + ": " + name, title: "run " + run.id + ": " + name + " · " + fmtTime(run.logicalTimeMs) },
      h("span", { "aria-hidden": "true" }, STATES[name] || "?")));
  }
  if (!strip.childNodes.length) strip.append("no runs yet");
  return strip;
}

export function pauseButton(workflow, after) {
  const verb = workflow.paused ? "Resume" : "Pause";
  const question = workflow.paused
    ? "Resume the schedule of " + workflow.name + "? Missed slots follow its misfire policy."
    : "Pause the schedule of " + workflow.name + "? Running runs go on; no new slot fires.";
  return actionButton(verb, question, verb, "/api/v1/workflows/" + enc(workflow.name) + "/" + verb.toLowerCase(), {}, after,
    { "aria-label": verb + " " + workflow.name });
}

export async function viewWorkflows(view) {
  const body = h("tbody");
  const status = h("p", { role: "status" }, "Loading workflows…");
  const filter = h("input", { type: "search", id: "wf-filter", placeholder: "Filter by name or app", "aria-label": "Filter workflows" });
  let workflows = [];
  const render = () => {
    const q = filter.value.trim().toLowerCase();
    const shown = workflows.filter(w => !q || w.name.toLowerCase().includes(q) || (w.app || "").toLowerCase().includes(q));
    fill(body, shown.map(w => h("tr", {},
      h("td", {}, link("/workflows/" + enc(w.name), w.name)),
      h("td", {}, w.app || "–"),
      h("td", { class: "num" }, num(w.taskCount || 0)),
      h("td", {}, scheduleText(w.schedule)),
      h("td", {}, w.paused ? "paused" : slotTime((w.nextFiresMs || [])[0], w.schedule && w.schedule.timezone)),
      h("td", {}, runStrip(w.recentRuns)),
      h("td", {}, w.paused ? chip("PAUSED") : "active", " ", pauseButton(w, refresh)),
    )));
    status.textContent = num(workflows.length) + " workflows" + (shown.length !== workflows.length ? ", " + num(shown.length) + " shown" : "");
  };
  const refresh = async () => {
    const answer = await api("/api/v1/workflows?recent=12&summary=true");
    if (view.left || unchanged(body, answer.workflows || [])) return;
    workflows = answer.workflows || [];
    render();
  };
  filter.addEventListener("input", render);
  show("Workflows", h("h1", {}, "Workflows"), h("div", { class: "toolbar" }, filter), status,
    h("table", {}, h("thead", {}, h("tr", {}, ["Workflow", "App", "Tasks", "Schedule", "Next fire", "Last runs (oldest → newest)", "Schedule state"].map(x => h("th", { scope: "col" }, x)))), body));
  await refresh();
  poll(view, 10000, refresh);
}

export async function viewWorkflow(view, name) {
  const [workflow, dag] = await Promise.all([
    api("/api/v1/workflows/" + enc(name)),
    api("/api/v1/workflows/" + enc(name) + "/dag?layout=true"),
  ]);
  if (view.left) return;
  const tasks = workflow.tasks || [];
  const isolated = new Set(dag.nodes.filter(n => n.isolated).map(n => n.task));
  const graph = dagView(dag, { taskHref: n => "#task-" + n.task });
  const taskFilter = h("input", { type: "search", placeholder: "Filter tasks", "aria-label": "Filter tasks" });
  const taskBody = h("tbody");
  const taskStatus = h("p", { role: "status" });
  const MAX_ROWS = 500;
  const renderTasks = () => {
    const q = taskFilter.value.trim().toLowerCase();
    const shown = tasks.filter(t => !q || t.name.toLowerCase().includes(q) || (t.command || "").toLowerCase().includes(q));
    taskBody.replaceChildren(...shown.slice(0, MAX_ROWS).map(t => h("tr", { id: "task-" + t.name },
      h("th", { scope: "row" }, t.name, isolated.has(t.name) && tasks.length > 1 ? h("span", { class: "flag" }, " isolated") : ""),
      h("td", {}, h("code", {}, t.command || (t.argv || []).join(" "))),
      h("td", {}, (t.upstream || []).join(", ") || "–"),
      h("td", {}, String(t.retries || 0)),
      h("td", {}, t.timeoutMs && t.timeoutMs !== "0" ? fmtDuration(t.timeoutMs) : "none"),
      h("td", {}, Object.entries(t.labels || {}).map(([k, v]) => k + "=" + v).join(", ") || "–"))));
    taskStatus.textContent = num(tasks.length) + " tasks" + (q ? ", " + num(shown.length) + " match" : "") + (shown.length > MAX_ROWS ? "; the first " + MAX_ROWS + " are listed, filter to see others" : "");
  };
  taskFilter.addEventListener("input", renderTasks);
  renderTasks();
  const isolatedNote = isolated.size && tasks.length > 1
    ? h("p", { class: "warn", role: "note" }, "Isolated tasks (no upstream, no downstream): ", [...isolated].slice(0, 20).join(", "), isolated.size > 20 ? " and " + (isolated.size - 20) + " more" : "")
    : null;
  const runs = runsTable(view, { workflow: name });
  const schedule = workflow.schedule || {};
  show(workflow.name,
    h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", workflow.name),
    h("h1", {}, workflow.name, " ", h("span", { class: "muted" }, "version " + workflow.version)),
    workflow.description ? h("p", {}, workflow.description) : null,
    h("div", { class: "toolbar" },
      link("/workflows/" + enc(name) + "/trigger", "Trigger a run"), " ",
      link("/workflows/" + enc(name) + "/grid", "Grid"), " ",
      link("/workflows/" + enc(name) + "/backfill", "Backfill"), " ",
      link("/workflows/" + enc(name) + "/why", "Why did it (not) run?"), " ",
      pauseButton(workflow, () => route())),
    kv([["App", workflow.app || "–"], ["Owner", workflow.owner || "–"], ["Schedule", scheduleText(schedule)],
      ["Schedule state", workflow.paused ? "paused" : "active"],
      ["Next fires", (workflow.nextFiresMs || []).length ? h("ul", { class: "plain" }, workflow.nextFiresMs.map(t => h("li", {}, slotTime(t, schedule.timezone)))) : "none"],
      ["Updated", time(workflow.updatedAtMs)]]),
    h("h2", {}, "Graph"), isolatedNote, graph.el,
    h("h2", {}, "Tasks"), h("div", { class: "toolbar" }, taskFilter), taskStatus,
    h("table", {}, h("thead", {}, h("tr", {}, ["Task", "Command", "Upstream", "Retries", "Timeout", "Labels"].map(x => h("th", { scope: "col" }, x)))), taskBody),
    h("h2", {}, "Runs"), runs.el);
  await runs.start();
}
