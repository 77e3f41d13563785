// Lists of runs, newest first: the runs page and a workflow's runs.

import { fill, h, link, num, show, unchanged } from "./dom.js";
import { chip, fmtDuration, fromInput, shownZone, stateName, time, toInput, TERMINAL_RUN } from "./format.js";
import { api, enc, poll } from "./api.js";

const STATES = ["running", "queued", "success", "failed", "cancelled"];
const TRIGGERS = ["cron", "manual", "api", "dependency", "backfill", "parent"];
const PAGE = 50;

/** What the tasks of a run are doing, in words: the ended and the working counts, and the tasks
 *  still waiting (queued, or not created until their upstreams end) while the run goes on. */
export function countsText(run) {
  const c = run.counts || {};
  const ended = TERMINAL_RUN.has(stateName(run.state));
  const n = x => Number(x || 0);
  const parts = [
    [n(c.success), "ok"],
    [n(c.failed) + n(c.timeout), "failed"],
    [n(c.running) + n(c.dispatched), "running"],
    [n(c.waiting) + (ended ? 0 : n(c.notCreated)), "waiting"],
    [n(c.cancelled), "cancelled"],
    [n(c.skipped), "skipped"],
    [n(c.upstreamFailed), "upstream failed"],
    [ended ? n(c.notCreated) : 0, "not run"],
  ];
  return parts.filter(([count, label], i) => i === 0 || count).map(([count, label]) => num(count) + " " + label).join(" · ");
}

/** A paged table of runs, newest first (paging by id: a page deep in a million runs costs
 *  what the first does), narrowed by `fixed` (a workflow's page fixes its workflow) and by the
 *  filters above it. The filters live in the address, so a reload or a shared link shows the
 *  same runs. The rows read so far refresh every 5 s while the page is shown. */
export function runsTable(view, fixed = {}) {
  const url = new URLSearchParams(location.search);
  const body = h("tbody");
  const status = h("p", { role: "status" });
  const older = h("button", { type: "button", hidden: true }, "Older runs");
  const select = (name, label, values) => {
    const el = h("select", { name, "aria-label": label },
      h("option", { value: "" }, "any " + label.toLowerCase()), values.map(v => h("option", { value: v }, v)));
    el.value = values.includes(url.get(name)) ? url.get(name) : "";
    return el;
  };
  const stateSelect = select("state", "State", STATES);
  const triggerSelect = select("trigger", "Trigger", TRIGGERS);
  const workflowInput = fixed.workflow ? null
    : h("input", { type: "search", name: "workflow", value: url.get("workflow") || "", placeholder: "Workflow", "aria-label": "Workflow", size: 18 });
  const bound = (name, label) => {
    const id = "runs-" + name;
    const input = h("input", { type: "datetime-local", id, name, step: "1", value: toInput(url.get(name)) });
    return { input, el: h("label", { for: id }, label + " ", input) };
  };
  const from = bound("from", "Logical time from"), to = bound("to", "to");
  const clear = h("button", { type: "button" }, "Clear filters");
  const error = h("p", { class: "error", role: "alert", hidden: true });

  const query = () => {
    const q = new URLSearchParams();
    if (workflowInput && workflowInput.value.trim()) q.set("workflow", workflowInput.value.trim());
    if (stateSelect.value) q.set("state", stateSelect.value);
    if (triggerSelect.value) q.set("trigger", triggerSelect.value);
    const f = fromInput(from.input.value), t = fromInput(to.input.value);
    if (f) q.set("from", String(f));
    if (t) q.set("to", String(t));
    return q;
  };

  let before = "0", pages = 1;
  const row = run => h("tr", {},
    h("td", {}, link("/runs/" + run.id, "run " + run.id)),
    fixed.workflow ? null : h("td", {}, link("/workflows/" + enc(run.workflow), run.workflow)),
    h("td", {}, chip(run.state), Number(run.deadlineMissedAtMs) ? [" ", chip("DEADLINE_MISSED")] : null),
    h("td", {}, String(run.trigger || "").replace("TRIGGER_KIND_", "").toLowerCase()),
    h("td", {}, time(run.logicalTimeMs)),
    h("td", {}, Number(run.finishedAtMs) ? fmtDuration(run.finishedAtMs - run.createdAtMs) : "running"),
    h("td", { class: "counts" }, countsText(run)));

  /** The newest `pages` pages, read again as one: what is shown stays in place, updated. */
  const load = async () => {
    const q = query();
    if (fixed.workflow) q.set("workflow", fixed.workflow);
    q.set("limit", String(Math.min(1000, PAGE * pages)));
    let answer;
    try {
      answer = await api("/api/v1/runs?" + q);
    } catch (err) {
      if (view.left) return;
      error.textContent = "The runs could not be listed: " + err.message;
      error.hidden = false;
      return;
    }
    if (view.left) return;
    error.hidden = true;
    const runs = answer.runs || [];
    before = answer.nextBeforeId || "0";
    older.hidden = before === "0";
    status.textContent = runs.length ? num(runs.length) + " runs shown" + (before !== "0" ? "; older runs follow" : "") : "No runs" + (query().toString() ? " match these filters." : ".");
    if (unchanged(body, runs)) return;
    fill(body, runs.map(row));
  };

  const refilter = () => {
    const q = query();
    // The address keeps the filters; the page's other parameters stay as they were.
    const next = new URLSearchParams(location.search);
    for (const name of ["workflow", "state", "trigger", "from", "to"]) {
      if (q.has(name)) next.set(name, q.get(name)); else next.delete(name);
    }
    const search = next.toString();
    history.replaceState(history.state, "", location.pathname + (search ? "?" + search : "") + location.hash);
    pages = 1;
    load();
  };
  for (const control of [stateSelect, triggerSelect, from.input, to.input]) control.addEventListener("change", refilter);
  workflowInput?.addEventListener("change", refilter);
  clear.addEventListener("click", () => {
    for (const control of [stateSelect, triggerSelect, from.input, to.input, workflowInput]) if (control) control.value = "";
    refilter();
  });
  older.addEventListener("click", async () => {
    // Paging by id keeps a deep page cheap; the rows shown so far then refresh as one read.
    const q = query();
    if (fixed.workflow) q.set("workflow", fixed.workflow);
    q.set("limit", String(PAGE));
    q.set("before", before);
    const answer = await api("/api/v1/runs?" + q);
    if (view.left) return;
    pages += 1;
    body.append(...(answer.runs || []).map(row));
    unchanged(body, null);
    before = answer.nextBeforeId || "0";
    older.hidden = before === "0";
    status.textContent = num(body.rows.length) + " runs shown" + (before !== "0" ? "; older runs follow" : "");
  });

  const headers = ["Run", fixed.workflow ? null : "Workflow", "State", "Trigger", "Logical time", "Duration", "Tasks"].filter(Boolean);
  const el = h("div", { class: "runs" },
    h("form", { class: "toolbar filters", role: "search", "aria-label": "Filter runs", onsubmit: e => { e.preventDefault(); refilter(); } },
      workflowInput, stateSelect, triggerSelect, from.el, to.el, h("span", { class: "muted" }, "(" + shownZone() + ")"), clear),
    error, status,
    h("table", {}, h("thead", {}, h("tr", {}, headers.map(x => h("th", { scope: "col" }, x)))), body), older);
  return {
    el,
    async start() {
      await load();
      poll(view, 5000, load);
    },
  };
}

export async function viewRuns(view) {
  const runs = runsTable(view);
  show("Runs", h("h1", {}, "Runs"), runs.el);
  await runs.start();
}
