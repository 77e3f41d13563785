// A workflow's grid: its recent runs as columns (newest right) and its tasks as rows, each
// cell an instance's state linked to its page (a run_workflow task's cell to its child run).
// Built for 100 runs × 300 tasks: one request for the matrix (GetGrid's compact columns), one
// element per cell (the glyph is drawn by CSS from the state's class, the name is its
// aria-label), and no listener per cell: keys, hover titles and clicks are delegated to the
// table (the router follows the links). Live through one SSE stream that sends only the
// columns that changed; it is closed while the page is hidden.

import { announce, fill, h, link, num, show } from "./dom.js";
import { STATES, chip, fmtTime, stateName } from "./format.js";
import { api, enc, stream, whileVisible } from "./api.js";
import { go } from "./router.js";

/** GridRun.states' letters. */
const LETTERS = { ".": "NONE", W: "WAITING", D: "DISPATCHED", R: "RUNNING", S: "SUCCESS", F: "FAILED", T: "TIMEOUT", C: "CANCELLED", P: "PENDING", K: "SKIPPED", U: "UPSTREAM_FAILED" };
/** Item states from worst to best: a mapped cell names its worst. */
const SEVERITY = ["FAILED", "TIMEOUT", "CANCELLED", "UPSTREAM_FAILED", "RUNNING", "DISPATCHED", "WAITING", "PENDING", "SKIPPED", "SUCCESS"];
const RUN_CHOICES = [25, 50, 100];
/** Rows drawn at once; the others as they near the view. More than a screen holds. */
const FIRST_ROWS = 40;

const runState = run => stateName(run.state);
const ended = run => ["SUCCESS", "FAILED", "CANCELLED"].includes(runState(run));

/** A cell's state, target and accessible name. */
function cellOf(task, run, row) {
  const letter = run.states ? run.states[row] : ".";
  const state = LETTERS[letter] || "UNKNOWN";
  const offset = Number((run.instanceOffsets || [])[row] || 0);
  const instance = offset ? String(BigInt(run.instanceBase) + BigInt(offset - 1)) : "";
  const detail = (run.details || []).find(d => Number(d.task || 0) === row);
  let label = "task " + task.name + ", run " + run.id + ": " + (state === "NONE" ? "no instance" : state);
  let href = instance ? "/instances/" + instance : "/runs/" + run.id;
  const extra = { attempt: 0, items: 0, child: "" };
  if (detail) {
    if (Number(detail.attempt) > 1) { extra.attempt = Number(detail.attempt); label += ", attempt " + extra.attempt; }
    if (detail.items) {
      const states = Object.entries(detail.items.states || {});
      extra.items = Number(detail.items.total || 0);
      const worst = SEVERITY.find(s => states.some(([name, n]) => name === s && n > 0));
      label += ", " + num(extra.items) + " items: " + states.sort((a, b) => b[1] - a[1]).map(([s, n]) => num(n) + " " + s.toLowerCase()).join(", ") + (worst ? " (worst " + worst + ")" : "");
    }
    if (Number(detail.childRunId)) { extra.child = String(detail.childRunId); href = "/runs/" + extra.child; label += ", child run " + extra.child; }
  }
  return { state, href, label, extra };
}

function paintCell(a, cell) {
  a.className = "gcell s-" + cell.state.toLowerCase() + (cell.extra.items ? " mapped" : "") + (cell.extra.attempt ? " retried" : "") + (cell.extra.child ? " child" : "");
  a.setAttribute("href", cell.href);
  a.setAttribute("aria-label", cell.label);
  if (cell.extra.attempt) a.dataset.n = String(cell.extra.attempt); else delete a.dataset.n;
  a.removeAttribute("title");
}

function runHeader(run) {
  const state = runState(run);
  // The id and time read bottom to top; the glyph stays upright under them.
  return h("th", { scope: "col", class: "grun", "data-run": String(run.id) },
    h("a", { href: "/runs/" + run.id, "aria-label": "run " + run.id + ": " + state + ", logical time " + fmtTime(run.logicalTimeMs) },
      h("span", { class: "gtext", "aria-hidden": "true" }, h("b", {}, String(run.id)), " ", h("span", { class: "gtime" }, fmtTime(run.logicalTimeMs))),
      h("span", { class: "gstate s-" + state.toLowerCase(), "aria-hidden": "true" }, STATES[state] || "?")));
}

function taskHeader(task) {
  return h("th", { scope: "row" }, task.name,
    task.mapped ? h("span", { class: "gkind" }, " mapped") : null,
    task.runWorkflow ? h("span", { class: "gkind" }, " → " + task.runWorkflow) : null,
    task.handler ? h("span", { class: "gkind" }, " " + task.handler) : null);
}

export async function viewGrid(view, name) {
  const params = new URLSearchParams(location.search);
  const before = params.get("before") || "";
  const limit = RUN_CHOICES.includes(Number(params.get("runs"))) ? Number(params.get("runs")) : 25;
  const query = "limit=" + limit + (before ? "&before=" + enc(before) : "");
  const base = "/api/v1/workflows/" + enc(name) + "/grid";
  let grid = await api(base + "?" + query);
  if (view.left) return;

  const table = h("table", { class: "grid", role: "grid" });
  const status = h("p", { role: "status" });
  const filter = h("input", { type: "search", placeholder: "Filter tasks", "aria-label": "Filter tasks by name" });
  const runs = h("select", { "aria-label": "Runs shown" }, RUN_CHOICES.map(n => h("option", { value: String(n), selected: n === limit }, n + " runs")));
  const pager = h("span", { class: "pager" });
  /** The cell elements by run id, then row. */
  let cells = new Map();
  let focusKey = null;
  let observer = null;
  const scroller = h("div", { class: "grid-scroll" }, table);
  view.onLeave(() => { if (observer) observer.disconnect(); });

  const key = (runId, row) => runId + ":" + row;
  const rowsShown = () => [...table.tBodies[0].rows].filter(tr => !tr.hidden);

  /** Fills a row's cells from the grid as it is now (a row is drawn when it nears the view). */
  const fillRow = tr => {
    if (!tr || !tr.classList.contains("gunfilled")) return;
    tr.classList.remove("gunfilled");
    if (observer) observer.unobserve(tr);
    const row = Number(tr.dataset.row), task = grid.tasks[row];
    tr.lastChild.remove();
    for (const run of grid.runs || []) {
      const td = document.createElement("td");
      const a = document.createElement("a");
      a.tabIndex = -1;
      a.dataset.key = key(run.id, row);
      paintCell(a, cellOf(task, run, row));
      td.append(a);
      tr.append(td);
      cells.get(String(run.id))[row] = a;
    }
  };

  const render = () => {
    const active = document.activeElement && table.contains(document.activeElement) ? document.activeElement : null;
    const tasks = grid.tasks || [], columns = grid.runs || [];
    cells = new Map(columns.map(run => [String(run.id), new Array(tasks.length)]));
    if (observer) observer.disconnect();
    // Rows past the first screens are drawn as they near the view: the browser styles and
    // lays out the cells shown, not all 30,000 at once.
    observer = new IntersectionObserver(entries => {
      for (const entry of entries) if (entry.isIntersecting) fillRow(entry.target);
    }, { root: scroller, rootMargin: "600px 0px" });
    const head = h("tr", {}, h("th", { scope: "col", class: "gcorner" }, "Task \\ run"), columns.map(runHeader));
    const body = document.createElement("tbody");
    const rows = tasks.map((task, row) => {
      const tr = document.createElement("tr");
      tr.dataset.task = task.name;
      tr.dataset.row = String(row);
      tr.className = "gunfilled";
      tr.append(taskHeader(task), h("td", { colspan: String(Math.max(1, columns.length)), class: "gpending" }));
      body.append(tr);
      return tr;
    });
    // Fixed widths: the browser lays the table out from its columns, not from its cells.
    const cols = h("colgroup", {}, h("col", { class: "gtasks" }), columns.map(() => h("col", { class: "gruncol" })));
    table.style.width = "calc(15rem + " + columns.length + " * 1.45rem)";
    table.replaceChildren(h("caption", { class: "visually-hidden" }, "Runs of " + name + ", oldest left, newest right; tasks in graph order"), cols, h("thead", {}, head), body);
    rows.slice(0, FIRST_ROWS).forEach(fillRow);
    if (focusKey) fillRow(rows[Number(focusKey.split(":")[1])]);
    for (const tr of rows) if (tr.classList.contains("gunfilled")) observer.observe(tr);
    applyFilter();
    // One tab stop: the cell focused before, or the newest run's first task.
    const again = focusKey && table.querySelector("a.gcell[data-key=\"" + CSS.escape(focusKey) + "\"]");
    const first = again || firstCell();
    if (first) first.tabIndex = 0;
    if (active && again) again.focus({ preventScroll: true });
    fillPager();
    status.textContent = num(columns.length) + " runs × " + num(tasks.length) + " tasks" + (filter.value ? ", " + num(rowsShown().length) + " match" : "");
  };

  const firstCell = () => {
    const tr = rowsShown()[0];
    fillRow(tr);
    return tr && tr.cells.length > 1 ? tr.cells[tr.cells.length - 1].firstChild : null;
  };

  const fillPager = () => {
    const older = Number(grid.nextBeforeId || 0);
    const url = extra => "/workflows/" + enc(name) + "/grid?runs=" + limit + extra;
    fill(pager,
      older ? link(url("&before=" + older), "← Older runs") : null,
      older && before ? " " : null,
      before ? link(url(""), "Newest runs →") : null);
  };

  const applyFilter = () => {
    const q = filter.value.trim().toLowerCase();
    for (const tr of table.tBodies[0].rows) tr.hidden = Boolean(q) && !tr.dataset.task.toLowerCase().includes(q);
    const current = table.querySelector("a.gcell[tabindex=\"0\"]");
    if (!current || current.closest("tr").hidden) {
      if (current) current.tabIndex = -1;
      const first = firstCell();
      if (first) first.tabIndex = 0;
    }
  };

  const move = (from, to) => {
    if (!to) return;
    from.tabIndex = -1;
    to.tabIndex = 0;
    focusKey = to.dataset.key;
    to.focus();
    to.scrollIntoView({ block: "nearest", inline: "nearest" });
  };

  table.addEventListener("keydown", event => {
    const a = event.target.closest && event.target.closest("a.gcell");
    if (!a) return;
    const td = a.parentElement, tr = td.parentElement;
    const rows = rowsShown(), r = rows.indexOf(tr), last = tr.cells.length - 1;
    const at = (row, col) => { fillRow(row); return row && row.cells[Math.min(Math.max(col, 1), row.cells.length - 1)]?.firstChild; };
    let to = null;
    switch (event.key) {
      case "ArrowLeft": to = at(tr, td.cellIndex - 1); break;
      case "ArrowRight": to = at(tr, td.cellIndex + 1); break;
      case "ArrowUp": to = at(rows[r - 1], td.cellIndex); break;
      case "ArrowDown": to = at(rows[r + 1], td.cellIndex); break;
      case "Home": to = event.ctrlKey ? at(rows[0], 1) : at(tr, 1); break;
      case "End": to = event.ctrlKey ? at(rows[rows.length - 1], last) : at(tr, last); break;
      default: return;
    }
    event.preventDefault();
    if (to && to !== a) move(a, to);
  });
  table.addEventListener("focusin", event => {
    const a = event.target.closest && event.target.closest("a.gcell");
    if (a) focusKey = a.dataset.key;
  });
  // A hover title costs nothing until a cell is hovered.
  table.addEventListener("mouseover", event => {
    const a = event.target.closest && event.target.closest("a.gcell");
    if (a && !a.title) a.title = a.getAttribute("aria-label");
  });
  filter.addEventListener("input", () => { applyFilter(); status.textContent = num((grid.runs || []).length) + " runs × " + num((grid.tasks || []).length) + " tasks" + (filter.value ? ", " + num(rowsShown().length) + " match" : ""); });
  runs.addEventListener("change", () => {
    go("/workflows/" + enc(name) + "/grid?runs=" + runs.value);
  });

  /** A `grid` event: every column of the window in order, cells for those that changed. */
  const onEvent = event => {
    const sameRows = JSON.stringify((event.tasks || []).map(t => t.name)) === JSON.stringify((grid.tasks || []).map(t => t.name));
    const held = new Map((grid.runs || []).map(run => [String(run.id), run]));
    const merged = [];
    for (const run of event.runs || []) {
      if (run.hasCells) { merged.push(run); continue; }
      const old = held.get(String(run.id));
      if (!old || !old.hasCells || !sameRows) { refetch(); return; }
      merged.push({ ...old, state: run.state, finishedAtMs: run.finishedAtMs });
    }
    const order = merged.map(run => String(run.id)).join(",");
    const heldOrder = (grid.runs || []).map(run => String(run.id)).join(",");
    const changed = (event.runs || []).filter(run => run.hasCells).map(run => String(run.id));
    const headers = (event.runs || []).filter(run => held.has(String(run.id)) && runState(held.get(String(run.id))) !== runState(run));
    grid = { ...event, runs: merged };
    if (!sameRows || order !== heldOrder) { render(); if (order !== heldOrder) announce("The grid's runs changed."); return; }
    // The same columns: repaint the changed cells and headers in place, focus untouched.
    const tasks = grid.tasks || [];
    for (const id of changed) {
      const run = merged.find(r => String(r.id) === id), list = cells.get(id) || [];
      tasks.forEach((task, row) => { if (list[row]) paintCell(list[row], cellOf(task, run, row)); });
    }
    for (const run of headers) {
      const th = table.querySelector("th.grun[data-run=\"" + run.id + "\"]");
      if (th) th.replaceWith(runHeader(merged.find(r => String(r.id) === String(run.id))));
    }
  };
  let refetching = null;
  const refetch = () => {
    refetching = refetching || api(base + "?" + query).then(answer => {
      refetching = null;
      if (view.left) return;
      grid = answer;
      render();
    }, () => { refetching = null; });
    return refetching;
  };

  show(name + " grid",
    h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(name), name), " / grid"),
    h("h1", {}, "Grid of ", name),
    h("div", { class: "toolbar" }, filter, " ", runs, " ", pager),
    legend(),
    status,
    scroller);
  render();
  // Only the newest page changes; an older page is read once.
  if (!before) {
    whileVisible(view, () => {
      const unended = (grid.runs || []).filter(run => !ended(run)).map(run => run.id).join(",");
      return stream(base + "/events?limit=" + limit + (unended ? "&also=" + unended : ""),
        { grid: onEvent, error: () => {} },
        async () => { await refetch(); return true; });
    });
  }
}

function legend() {
  const states = ["SUCCESS", "RUNNING", "WAITING", "FAILED", "UPSTREAM_FAILED", "SKIPPED", "TIMEOUT", "CANCELLED", "PENDING"];
  return h("p", { class: "glegend" }, h("span", { class: "muted" }, "States: "), states.map(s => [chip(s), " "]),
    h("span", { class: "muted" }, "A number in a corner is the attempt; a corner mark, a mapped task's items."));
}
