// A run's page: its graph, timeline and tasks, live while it runs.

import { alertBox, button, fill, h, kv, link, num, show, table } from "./dom.js";
import { TERMINAL_INSTANCE, TERMINAL_RUN, chip, fmtDuration, stateName, time } from "./format.js";
import { api, enc, post, stream, whileVisible } from "./api.js";
import { route } from "./router.js";
import { actionButton, confirmAction } from "./actions.js";
import { dagView } from "./dag.js";
import { markButton, markable } from "./marks.js";

const ACTIVE = new Set(["WAITING", "DISPATCHED", "RUNNING"]);

export async function viewRun(view, id) {
  const run = await api("/api/v1/runs/" + id);
  if (view.left) return;
  const dag = await api("/api/v1/workflows/" + enc(run.workflow) + "/dag?layout=true&run=" + id);
  if (view.left) return;
  const graph = dagView(dag);
  const header = h("div");
  const actions = h("div", { class: "toolbar" });
  const instancesBody = h("tbody");
  const headRow = h("tr");
  const gantt = h("div", { class: "gantt", role: "img" });
  // The tasks chosen for "Clear and rerun selected", kept across renders.
  const selected = new Set();
  const rerunSelected = h("button", { type: "button", disabled: true }, "Clear and rerun selected");
  const syncSelection = () => {
    rerunSelected.disabled = !selected.size;
    rerunSelected.textContent = selected.size ? "Clear and rerun selected (" + selected.size + ")" : "Clear and rerun selected";
  };
  rerunSelected.addEventListener("click", async () => {
    const tasks = [...selected];
    if (!(await confirmAction("Clear and rerun selected",
      "Run " + tasks.join(", ") + " of run " + id + " again, and everything below " + (tasks.length > 1 ? "them" : "it") + "?", "Rerun"))) return;
    rerunSelected.disabled = true;
    try {
      await post("/api/v1/runs/" + id + "/rerun", { tasks });
      selected.clear();
      await route();
    } catch (err) {
      alertBox(actions, "Clear and rerun selected failed: " + err.message);
      syncSelection();
    }
  });
  // Cells whose duration grows while their attempt runs: [element, started at].
  let live = [];
  let latest = { run, instances: { instances: [], tasks: [] } };

  const render = snapshot => {
    latest = snapshot;
    const r = snapshot.run, state = stateName(r.state);
    const ended = TERMINAL_RUN.has(state);
    const statuses = snapshot.instances.tasks || [];
    fill(header,
      h("h1", {}, "Run " + r.id + " ", chip(r.state)),
      kv([["Workflow", link("/workflows/" + enc(r.workflow), r.workflow + " (version " + r.workflowVersion + ")")],
        ["Trigger", String(r.trigger || "").replace("TRIGGER_KIND_", "").toLowerCase() + (r.triggeredBy ? " by " + r.triggeredBy : "")],
        ["Logical time", time(r.logicalTimeMs)], ["Created", time(r.createdAtMs)], ["Finished", time(r.finishedAtMs)],
        ["Tasks", h("span", { class: "task-counts" }, taskCounts(statuses))],
        deadlineRow(r), parentRow(r), childrenRow(r),
        r.idempotencyKey ? ["Idempotency key", r.idempotencyKey] : null,
        ["Params", Object.keys(r.params || {}).length ? table(null, ["Name", "Value"], Object.entries(r.params).map(([k, v]) => [k, h("code", {}, v)])) : "none"]]));
    for (const task of [...selected]) if (!statuses.some(t => t.task === task)) selected.delete(task);
    syncSelection();
    fill(actions,
      !ended ? actionButton("Cancel run", "Cancel run " + r.id + "? Its running tasks are killed and the rest will not run.", "Cancel run", "/api/v1/runs/" + r.id + "/cancel", { reason: "cancelled from the web UI" }, refresh) : null,
      ["FAILED", "CANCELLED"].includes(state) ? actionButton("Rerun failed tasks", "Run the failed, timed-out and cancelled tasks of run " + r.id + " again, and what depends on them?", "Rerun", "/api/v1/runs/" + r.id + "/rerun", { failed: true }, () => route()) : null,
      ended ? rerunSelected : null);
    const byTask = new Map((snapshot.instances.instances || []).filter(i => !Number(i.shardParentId)).map(i => [i.task, i]));
    graph.update(new Map(statuses.map(t => [t.task, { state: t.status, instanceId: t.instanceId }])));
    fill(headRow, (ended ? ["Select"] : []).concat(["Task", "State", "Attempt", "Worker", "Started", "Duration", "Exit code", "Actions"]).map(x =>
      h("th", { scope: "col" }, x === "Select" ? h("span", { class: "visually-hidden" }, x) : x)));
    live = [];
    instancesBody.replaceChildren(...statuses.map(t => {
      const inst = byTask.get(t.task);
      const s = stateName(t.status);
      const started = inst && Number(inst.startedAtMs), finished = inst && Number(inst.finishedAtMs);
      const duration = h("td", { class: "duration" }, started ? fmtDuration((finished || Date.now()) - started) : "–");
      if (started && !finished && inst && ACTIVE.has(stateName(inst.state))) live.push([duration, started]);
      const box = ended && inst ? h("input", {
        type: "checkbox", "aria-label": "Select task " + t.task, checked: selected.has(t.task),
        onchange: e => { if (e.target.checked) selected.add(t.task); else selected.delete(t.task); syncSelection(); },
      }) : null;
      const after = () => route();
      return h("tr", {},
        ended ? h("td", {}, box) : null,
        h("th", { scope: "row" }, inst ? link("/instances/" + inst.id, t.task) : t.task),
        h("td", {}, chip(s), t.items ? itemCounts(t.items, inst) : null),
        h("td", {}, inst ? String(inst.attempt) : "–"),
        h("td", {}, whereItRuns(inst)),
        h("td", {}, started ? time(started) : "–"),
        duration,
        h("td", {}, inst && inst.exitCode !== undefined && inst.exitCode !== null && TERMINAL_INSTANCE.has(s) ? String(inst.exitCode) : "–"),
        h("td", {}, h("div", { class: "row-actions" },
          inst && ["FAILED", "TIMEOUT", "CANCELLED"].includes(s) && ended ? actionButton("Retry", "Run task " + t.task + " again as a new attempt?", "Retry", "/api/v1/instances/" + inst.id + "/retry", {}, after, { "aria-label": "Retry " + t.task }) : null,
          // The accessible name starts with the visible text (axe label-content-name-mismatch).
          inst && TERMINAL_INSTANCE.has(s) && ended ? actionButton("Rerun from here", "Run task " + t.task + " and everything below it again?", "Rerun", "/api/v1/runs/" + r.id + "/rerun", { fromTask: t.task }, after, { "aria-label": "Rerun from here: " + t.task }) : null,
          inst && markable(stateName(inst.state), "SUCCESS") ? markButton("SUCCESS", t.task, inst.id, after) : null,
          inst && markable(stateName(inst.state), "FAILED") ? markButton("FAILED", t.task, inst.id, after) : null)));
    }));
    renderGantt(gantt, r, [...byTask.values()]);
    ticker.sync();
  };
  const refresh = async () => {
    const [r, instances] = await Promise.all([api("/api/v1/runs/" + id), api("/api/v1/runs/" + id + "/instances?attempts=true&group_items=true")]);
    if (!view.left) render({ run: r, instances });
    return !TERMINAL_RUN.has(stateName(r.state));
  };
  // While a task runs, its duration and its timeline bar grow each second; the ticker runs only
  // then, and only while the page is shown.
  const ticker = liveTicker(view, () => live.length > 0, () => {
    const now = Date.now();
    for (const [el, started] of live) el.textContent = fmtDuration(now - started);
    renderGantt(gantt, latest.run, (latest.instances.instances || []).filter(i => !Number(i.shardParentId)));
  });

  show("Run " + id,
    h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(run.workflow), run.workflow), " / run " + id),
    header, actions, h("h2", {}, "Graph"), graph.el, h("h2", {}, "Timeline"), gantt,
    h("h2", {}, "Tasks"),
    h("table", { class: "run-tasks" }, h("thead", {}, headRow), instancesBody));
  await refresh();
  whileVisible(view, () => {
    // An ended run changes no more: its page was read whole above.
    if (TERMINAL_RUN.has(stateName(latest.run.state))) return null;
    return stream("/api/v1/runs/" + id + "/events", { run: render, end: () => {}, error: e => alertBox(actions, e.message) }, refresh);
  });
}

/** A 1 s timer that runs `tick` while `wanted()` holds, the page is visible and the view is
 *  current; `sync()` after each render starts or stops it. */
export function liveTicker(view, wanted, tick) {
  let timer = null;
  const sync = () => {
    const on = wanted() && document.visibilityState === "visible" && !view.left;
    if (on && !timer) timer = setInterval(() => { if (!wanted() || view.left) sync(); else tick(); }, 1000);
    else if (!on && timer) { clearInterval(timer); timer = null; }
  };
  document.addEventListener("visibilitychange", sync);
  view.onLeave(() => { document.removeEventListener("visibilitychange", sync); clearInterval(timer); timer = null; });
  return { sync };
}

/** How a run's tasks stand, in one line: waiting and pending tasks count too, so a RUNNING run
 *  whose tasks wait for a worker never reads "0 running". */
export function taskCounts(statuses) {
  const order = ["running", "dispatched", "waiting", "pending", "success", "failed", "timeout", "upstream_failed", "skipped", "cancelled"];
  const counts = new Map();
  for (const t of statuses) {
    const s = String(t.status || "pending").toLowerCase();
    counts.set(s, (counts.get(s) || 0) + 1);
  }
  const known = order.filter(s => counts.has(s)).concat([...counts.keys()].filter(s => !order.includes(s)));
  return known.length ? known.map(s => num(counts.get(s)) + " " + s.replace("_", " ")).join(" · ") : "none";
}

/** A mapped task's items in one line under its state: "10,000 items: 9,990 success · 8
 *  failed", linked to the task's page where they are listed. */
export function itemCounts(items, inst) {
  const parts = Object.entries(items.states || {}).sort((a, b) => b[1] - a[1]).map(([state, n]) => num(n) + " " + state.toLowerCase());
  const text = num(items.total) + " items: " + parts.join(" · ");
  return h("div", { class: "items-count" }, inst ? link("/instances/" + inst.id + "#items", text) : text);
}

/** The items of a mapped task on its page, a page of 100 at a time, filtered by state. */
export function itemsSection(view, instance) {
  const el = h("section", { id: "items", "aria-label": "Items", hidden: true });
  const body = h("div");
  const filter = h("select", { "aria-label": "Only items in state" },
    ["", "waiting", "running", "success", "failed", "timeout", "cancelled"].map(v => h("option", { value: v }, v || "any state")));
  let from = 0;
  const pages = [];
  const load = async () => {
    const q = "items_of=" + instance.id + "&items_from=" + from + "&limit=100" + (filter.value ? "&state=" + filter.value : "");
    const page = await api("/api/v1/runs/" + instance.runId + "/instances?" + q);
    if (view.left) return;
    const items = page.instances || [];
    const next = Number(page.nextItemsFrom || 0);
    if (!items.length && !filter.value && !from) { el.hidden = true; return; }
    el.hidden = false;
    fill(body,
      items.length ? table(null, ["Index", "Item", "State", "Attempt", "Worker", "Started", "Duration", "Exit code"], items.map(i => {
        const s = stateName(i.state), started = Number(i.startedAtMs), finished = Number(i.finishedAtMs);
        return [String(i.shardIndex || 0), link("/instances/" + i.id, i.item || "(empty)"), chip(s), String(i.attempt), i.workerId || "–",
          started ? time(started) : "–", started ? fmtDuration((finished || Date.now()) - started) : "–",
          i.exitCode !== undefined && i.exitCode !== null && TERMINAL_INSTANCE.has(s) ? String(i.exitCode) : "–"];
      })) : h("p", { class: "muted" }, "No item" + (filter.value ? " is " + filter.value : "") + "."),
      h("div", { class: "toolbar" },
        pages.length ? button("Previous items", () => { from = pages.pop(); load(); }) : null,
        next ? button("Next items", () => { pages.push(from); from = next; load(); }) : null));
  };
  filter.addEventListener("change", () => { from = 0; pages.length = 0; load(); });
  el.append(h("h2", {}, "Items"), h("div", { class: "toolbar" }, filter), body);
  return { el, load };
}

/** A run's deadline for its page: the time it must end by and, once judged missed, a chip and
 *  when; none for a run without a deadline. */
export function deadlineRow(r) {
  const at = Number(r.deadlineAtMs || 0), missed = Number(r.deadlineMissedAtMs || 0);
  if (!at) return null;
  return ["Deadline", h("span", { class: "deadline" }, time(at),
    missed ? [" ", chip("DEADLINE_MISSED"), " judged ", time(missed)] : null)];
}

/** Where an instance's current attempt runs: its worker, or the child run a run_workflow task
 * waits on (it takes no worker). */
export function whereItRuns(inst) {
  if (!inst) return "–";
  if (inst.workerId) return inst.workerId;
  const current = (inst.attempts || []).find(a => Number(a.attempt) === Number(inst.attempt));
  return current && Number(current.childRunId) ? link("/runs/" + current.childRunId, "child run " + current.childRunId) : "–";
}

/** A child run's parent: the run and task that started it (run_workflow); none otherwise. */
export function parentRow(r) {
  if (!Number(r.parentRunId)) return null;
  return ["Parent", h("span", { class: "parent-run" }, link("/runs/" + r.parentRunId, "run " + r.parentRunId),
    r.parentTask ? [", task ", link("/instances/" + r.parentInstanceId, r.parentTask)] : null)];
}

/** The runs this run's run_workflow tasks started, newest first; none without any. */
export function childrenRow(r) {
  const ids = r.childRunIds || [];
  if (!ids.length) return null;
  return ["Children", h("span", { class: "child-runs" },
    ids.flatMap((id, n) => [n ? ", " : null, link("/runs/" + id, "run " + id)]))];
}

/** One row per task, one bar per attempt: a retried task shows its failed attempts beside
 *  the one that followed. Times are the attempts' own (a running one up to now): a row's time is
 *  the sum of its attempts, each listed when there are several, and the total is the work done,
 *  not the span from the first start to the last end (a rerun's idle gap is no work). */
export function renderGantt(el, run, instances) {
  const now = Date.now();
  const spans = i => (i.attempts && i.attempts.length ? i.attempts : [i])
    .filter(a => Number(a.startedAtMs))
    .map(a => ({ attempt: a.attempt || i.attempt, state: stateName(a.state), s: Number(a.startedAtMs), f: Number(a.finishedAtMs) || now }));
  const rows = instances.map(i => ({ task: i.task, bars: spans(i) })).filter(r => r.bars.length);
  if (!rows.length) { el.replaceChildren(h("p", { class: "muted" }, "No task has started yet.")); el.setAttribute("aria-label", "No task has started yet"); return; }
  const bars = rows.flatMap(r => r.bars);
  const t0 = Math.min(...bars.map(b => b.s));
  const t1 = Math.max(...bars.map(b => b.f), t0 + 1);
  const span = t1 - t0;
  const work = bars.reduce((sum, b) => sum + (b.f - b.s), 0);
  const summary = fmtDuration(work) + " of work in " + num(bars.length) + (bars.length === 1 ? " attempt" : " attempts") +
    (span > work ? "; " + fmtDuration(span) + " from the first start to the last end" : "");
  el.setAttribute("aria-label", "Timeline of " + rows.length + " tasks: " + summary);
  rows.sort((a, b) => a.bars[0].s - b.bars[0].s);
  el.replaceChildren(h("p", { class: "gantt-total" }, summary), ...rows.slice(0, 300).map(r => {
    const own = r.bars.map(b => b.f - b.s);
    const total = own.reduce((a, b) => a + b, 0);
    return h("div", { class: "gantt-row" },
      h("span", { class: "gantt-label" }, r.task + (r.bars.length > 1 ? " (" + r.bars.length + " attempts)" : "")),
      h("span", { class: "gantt-track" }, ...r.bars.map(b => h("span", {
        class: "gantt-bar s-" + b.state.toLowerCase(),
        "data-attempt": String(b.attempt),
        title: r.task + ", attempt " + b.attempt + ": " + b.state + ", " + fmtDuration(b.f - b.s),
        style: { left: ((b.s - t0) / span * 100) + "%", width: Math.max(0.5, (b.f - b.s) / span * 100) + "%" },
      }))),
      h("span", { class: "gantt-time" }, fmtDuration(total) + (own.length > 1 ? " (" + own.map(fmtDuration).join(" + ") + ")" : "")));
  }), rows.length > 300 ? h("p", { class: "muted" }, "The first 300 of " + num(rows.length) + " tasks are drawn.") : "");
}
