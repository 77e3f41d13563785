// A workflow's grid: its recent runs as columns (newest right) and its tasks as rows, each
// cell an instance's state linked to its page (a run_workflow task's cell to its child run).
// Built for 100 runs × 300 tasks: one request for the matrix (GetGrid's compact columns), one
// link per cell (its glyph its text, its name its aria-label), no listener per cell (keys,
// hover titles and clicks are delegated to the table; the router follows the links), and a
// row's cells drawn when the row comes into view. Live through one SSE stream that sends only
// the columns that changed, closed while the page is hidden; an update writes only the cells
// and headers that differ, and the rows drawn stay drawn.

import { announce, fill, h, link, num, show } from "./dom.js";
import { STATES, chip, fmtTime, stateName } from "./format.js";
import { api, enc, stream, whileVisible } from "./api.js";
import { go } from "./router.js";

/** GridRun.states' letters. */
const LETTERS = { ".": "NONE", W: "WAITING", D: "DISPATCHED", R: "RUNNING", S: "SUCCESS", F: "FAILED", T: "TIMEOUT", C: "CANCELLED", P: "PENDING", K: "SKIPPED", U: "UPSTREAM_FAILED" };
/** Item states from worst to best: a mapped cell names its worst. */
const SEVERITY = ["FAILED", "TIMEOUT", "CANCELLED", "UPSTREAM_FAILED", "RUNNING", "DISPATCHED", "WAITING", "PENDING", "SKIPPED", "SUCCESS"];
const RUN_CHOICES = [25, 50, 100];
/** Rows drawn at once; the others as they come into view. More than a screen holds. */
const FIRST_ROWS = 40;
/** Screens of rows above and below the view drawn while the page is idle, so that a scroll
 *  usually finds its rows drawn; and the rows drawn in one idle turn. */
const AHEAD_SCREENS = 1;
const AHEAD_PER_TURN = 8;

const runState = run => stateName(run.state);
const ended = run => ["SUCCESS", "FAILED", "CANCELLED"].includes(runState(run));
const sameTasks = (a, b) => JSON.stringify((a || []).map(t => t.name)) === JSON.stringify((b || []).map(t => t.name));

/** A column's details by row, indexed once per column rather than searched per cell. */
const detailIndex = new WeakMap();
function detailOf(run, row) {
  let index = detailIndex.get(run);
  if (!index) {
    index = new Map((run.details || []).map(d => [Number(d.task || 0), d]));
    detailIndex.set(run, index);
  }
  return index.get(row);
}

/** A cell's state, target and accessible name. */
function cellOf(task, run, row) {
  const letter = run.states ? run.states[row] : ".";
  const state = LETTERS[letter] || "UNKNOWN";
  const offset = Number((run.instanceOffsets || [])[row] || 0);
  const instance = offset ? String(BigInt(run.instanceBase) + BigInt(offset - 1)) : "";
  const detail = detailOf(run, row);
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

const cellClass = cell => "gcell s-" + cell.state.toLowerCase() + (cell.extra.items ? " mapped" : "") + (cell.extra.attempt ? " retried" : "") + (cell.extra.child ? " child" : "");

/** A new cell's link (thousands are made at once: no reads, no dataset). */
function newLink(key, cell) {
  const a = document.createElement("a");
  a.className = cellClass(cell);
  a.setAttribute("tabindex", "-1");
  a.setAttribute("data-key", key);
  a.setAttribute("href", cell.href);
  a.setAttribute("aria-label", cell.label);
  if (cell.extra.attempt) a.setAttribute("data-n", String(cell.extra.attempt));
  const glyph = STATES[cell.state];
  if (glyph) a.textContent = glyph;
  return a;
}

/** Writes only what differs: a live update repaints the cells that changed, not the column. */
function paintCell(a, cell) {
  const cls = cellClass(cell);
  if (a.className !== cls) a.className = cls;
  const glyph = STATES[cell.state] || "";
  if (a.textContent !== glyph) a.textContent = glyph;
  if (a.getAttribute("href") !== cell.href) a.setAttribute("href", cell.href);
  if (a.getAttribute("aria-label") !== cell.label) {
    a.setAttribute("aria-label", cell.label);
    a.removeAttribute("title");
  }
  const n = cell.extra.attempt ? String(cell.extra.attempt) : null;
  if (a.getAttribute("data-n") !== n) { if (n) a.setAttribute("data-n", n); else a.removeAttribute("data-n"); }
}

function runHeader(run) {
  const state = runState(run), time = fmtTime(run.logicalTimeMs);
  // The id and time read bottom to top; the glyph stays upright under them.
  return h("th", { scope: "col", class: "grun", "data-run": String(run.id) },
    h("a", { href: "/runs/" + run.id, "aria-label": "run " + run.id + ": " + state + ", logical time " + time },
      h("span", { class: "gtext", "aria-hidden": "true" }, h("b", {}, String(run.id)), " ", h("span", { class: "gtime" }, time)),
      h("span", { class: "gstate s-" + state.toLowerCase(), "aria-hidden": "true" }, STATES[state] || "?")));
}

function taskHeader(task) {
  return h("th", { scope: "row" }, task.name,
    task.mapped ? h("span", { class: "gkind" }, " mapped") : null,
    task.runWorkflow ? h("span", { class: "gkind" }, " → " + task.runWorkflow) : null,
    task.handler ? h("span", { class: "gkind" }, " " + task.handler) : null);
}

/** Puts `nodes` in order after `first`, its parent's first child, and removes the other nodes
 *  after it. Nodes already in that order stay where they are: a focused cell keeps its focus. */
function reconcile(first, nodes) {
  const keep = new Set(nodes);
  for (let node = first.nextSibling; node;) {
    const after = node.nextSibling;
    if (!keep.has(node)) node.remove();
    node = after;
  }
  let next = first.nextSibling;
  for (const node of nodes) {
    if (node === next) next = next.nextSibling;
    else first.parentNode.insertBefore(node, next);
  }
}

const idleCall = window.requestIdleCallback ? fn => requestIdleCallback(fn) : fn => setTimeout(() => fn({ timeRemaining: () => 10 }), 50);
const idleCancel = window.cancelIdleCallback || clearTimeout;

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
  const scroller = h("div", { class: "grid-scroll" }, table);
  /** The rows in task order; the cell elements of the rows drawn, by run id then row. */
  let rows = [];
  let cells = new Map();
  /** Each run's header and the state it shows: a header is made once, and again when its run's
   *  state changes. */
  const headers = new Map();
  let headRow = null, cols = null;
  let focusKey = null;
  /** Rows near the view, drawn while the page is idle. */
  let ahead = [], idle = 0;
  view.onLeave(() => idleCancel(idle));

  const key = (runId, row) => runId + ":" + row;
  const rowsShown = () => rows.filter(tr => !tr.hidden);
  const columnIds = runsOf => (runsOf.runs || []).map(run => String(run.id));

  const headerOf = run => {
    const state = runState(run), held = headers.get(String(run.id));
    if (held && held.state === state) return held.th;
    const th = runHeader(run);
    headers.set(String(run.id), { state, th });
    return th;
  };

  const newCell = (run, row) => {
    const td = document.createElement("td");
    const a = newLink(key(run.id, row), cellOf(grid.tasks[row], run, row));
    td.append(a);
    cells.get(String(run.id))[row] = a;
    return td;
  };

  /** Draws a row's cells from the grid as it is now (a row is drawn when it comes into view). */
  const fillRow = tr => {
    if (!tr || !tr.classList.contains("gunfilled")) return;
    tr.classList.remove("gunfilled");
    const row = Number(tr.dataset.row);
    tr.lastChild.remove();
    tr.append(...(grid.runs || []).map(run => newCell(run, row)));
  };

  /** Draws the rows in view, and queues those within a screen of it for idle time. It runs from
   *  the scroll event, before the frame is drawn: a row scrolled to is drawn in that frame, and
   *  that frame styles, lays out and paints the rows in view only (a screen of 100 runs is some
   *  3,000 cells; the whole table, 30,000, takes seconds). */
  const fillInView = () => {
    const shown = rowsShown();
    if (!shown.length) return;
    const top = scroller.scrollTop, bottom = top + scroller.clientHeight;
    // The rows are the table's, which starts at the top of the scrolled area.
    let first = 0, last = shown.length;
    while (first < last) {
      const mid = (first + last) >> 1, tr = shown[mid];
      if (tr.offsetTop + tr.offsetHeight <= top) first = mid + 1; else last = mid;
    }
    last = first;
    while (last < shown.length && shown[last].offsetTop < bottom) last++;
    const screen = Math.max(1, last - first);
    for (let i = first; i < last; i++) fillRow(shown[i]);
    ahead = shown.slice(last, last + AHEAD_SCREENS * screen)
      .concat(shown.slice(Math.max(0, first - AHEAD_SCREENS * screen), first).reverse())
      .filter(tr => tr.classList.contains("gunfilled"));
    if (!idle && ahead.length) idle = idleCall(fillAhead);
  };
  // Some rows a turn: the frame after it draws hundreds of cells, not thousands; and not one
  // row a turn, as each such frame paints the rows in view again too.
  const fillAhead = deadline => {
    idle = 0;
    for (let n = 0; n < AHEAD_PER_TURN && ahead.length; n++) {
      fillRow(ahead.shift());
      if (deadline.timeRemaining() <= 0) break;
    }
    if (ahead.length && !view.left) idle = idleCall(fillAhead);
  };

  const sizeTable = columns => {
    // Fixed widths: the browser lays the table out from its columns, not from its cells.
    cols.replaceChildren(h("col", { class: "gtasks" }), columns.map(() => h("col", { class: "gruncol" })));
    table.style.width = "calc(15rem + " + columns.length + " * 1.45rem)";
  };

  const render = () => {
    const active = document.activeElement && table.contains(document.activeElement) ? document.activeElement : null;
    const tasks = grid.tasks || [], columns = grid.runs || [];
    cells = new Map(columns.map(run => [String(run.id), new Array(tasks.length)]));
    headers.clear();
    headRow = h("tr", {}, h("th", { scope: "col", class: "gcorner" }, "Task \\ run"), columns.map(headerOf));
    const body = document.createElement("tbody");
    rows = tasks.map((task, row) => {
      const tr = document.createElement("tr");
      tr.dataset.task = task.name;
      tr.dataset.row = String(row);
      tr.className = "gunfilled";
      tr.append(taskHeader(task), h("td", { colspan: String(Math.max(1, columns.length)), class: "gpending" }));
      body.append(tr);
      return tr;
    });
    cols = h("colgroup");
    sizeTable(columns);
    table.replaceChildren(h("caption", { class: "visually-hidden" }, "Runs of " + name + ", oldest left, newest right; tasks in graph order"), cols, h("thead", {}, headRow), body);
    rows.slice(0, FIRST_ROWS).forEach(fillRow);
    if (focusKey) fillRow(rows[Number(focusKey.split(":")[1])]);
    applyFilter();
    // One tab stop: the cell focused before, or the newest run's first task.
    const again = focusKey && table.querySelector("a.gcell[data-key=\"" + CSS.escape(focusKey) + "\"]");
    const current = table.querySelector("a.gcell[tabindex=\"0\"]");
    if (again && current !== again) { if (current) current.tabIndex = -1; again.tabIndex = 0; }
    if (active && again) again.focus({ preventScroll: true });
    fillPager();
    showStatus();
    // The rows near the view once the first are drawn (they are the view unless it was scrolled).
    idleCancel(idle);
    idle = idleCall(() => { idle = 0; fillInView(); });
  };

  /** The window's runs changed with the same rows (a new run came, the oldest left): the rows
   *  drawn keep their cells, gain the new columns' and lose the old ones'. */
  const setColumns = () => {
    const columns = grid.runs || [], ids = columnIds(grid);
    const focused = document.activeElement && table.contains(document.activeElement);
    const kept = new Map([...cells].filter(([id]) => ids.includes(id)));
    cells = new Map(columns.map(run => [String(run.id), kept.get(String(run.id)) || new Array(rows.length)]));
    for (const id of headers.keys()) if (!cells.has(id)) headers.delete(id);
    sizeTable(columns);
    rows.forEach((tr, row) => {
      if (tr.classList.contains("gunfilled")) { tr.lastChild.colSpan = Math.max(1, columns.length); return; }
      reconcile(tr.firstChild, columns.map(run => {
        const a = cells.get(String(run.id))[row];
        return a ? a.parentElement : newCell(run, row);
      }));
    });
    // The focused cell's run left: the tab stop moves to a shown cell.
    if (!table.querySelector("a.gcell[tabindex=\"0\"]")) {
      const first = firstCell();
      if (first) { first.tabIndex = 0; if (focused) first.focus({ preventScroll: true }); }
    }
    fillPager();
    showStatus();
  };

  /** Shows `next` (every column with its cells): the rows drawn stay drawn, and only the cells
   *  of the columns in `changed` and the headers whose run's state changed are written. */
  const apply = (next, changed) => {
    const sameRows = sameTasks(next.tasks, grid.tasks);
    const moved = columnIds(next).join(",") !== columnIds(grid).join(",");
    grid = next;
    if (moved) announce("The grid's runs changed.");
    if (!sameRows) { render(); return; }
    reconcile(headRow.firstChild, (grid.runs || []).map(headerOf));
    if (moved) setColumns();
    const tasks = grid.tasks || [];
    for (const run of grid.runs || []) {
      if (!changed.has(String(run.id))) continue;
      const list = cells.get(String(run.id)) || [];
      list.forEach((a, row) => { if (a) paintCell(a, cellOf(tasks[row], run, row)); });
    }
  };

  const firstCell = () => {
    const tr = rowsShown()[0];
    fillRow(tr);
    return tr && tr.cells.length > 1 ? tr.cells[tr.cells.length - 1].firstChild : null;
  };

  const showStatus = () => {
    status.textContent = num((grid.runs || []).length) + " runs × " + num((grid.tasks || []).length) + " tasks" + (filter.value ? ", " + num(rowsShown().length) + " match" : "");
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
    for (const tr of rows) tr.hidden = Boolean(q) && !tr.dataset.task.toLowerCase().includes(q);
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
    const shown = rowsShown(), r = shown.indexOf(tr), last = tr.cells.length - 1;
    const at = (row, col) => { fillRow(row); return row && row.cells[Math.min(Math.max(col, 1), row.cells.length - 1)]?.firstChild; };
    let to = null;
    switch (event.key) {
      case "ArrowLeft": to = at(tr, td.cellIndex - 1); break;
      case "ArrowRight": to = at(tr, td.cellIndex + 1); break;
      case "ArrowUp": to = at(shown[r - 1], td.cellIndex); break;
      case "ArrowDown": to = at(shown[r + 1], td.cellIndex); break;
      case "Home": to = event.ctrlKey ? at(shown[0], 1) : at(tr, 1); break;
      case "End": to = event.ctrlKey ? at(shown[shown.length - 1], last) : at(tr, last); break;
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
  scroller.addEventListener("scroll", fillInView, { passive: true });
  window.addEventListener("resize", fillInView);
  view.onLeave(() => window.removeEventListener("resize", fillInView));
  filter.addEventListener("input", () => { applyFilter(); fillInView(); showStatus(); });
  runs.addEventListener("change", () => {
    go("/workflows/" + enc(name) + "/grid?runs=" + runs.value);
  });

  /** A `grid` event: every column of the window in order, cells for those that changed. A
   *  column without cells is the one held, with its header's new state; one not held (a run
   *  that came and ended while the stream was closed) is read with the whole grid. */
  const onEvent = event => {
    const sameRows = sameTasks(event.tasks, grid.tasks);
    const held = new Map((grid.runs || []).map(run => [String(run.id), run]));
    const merged = [];
    for (const run of event.runs || []) {
      if (run.hasCells) { merged.push(run); continue; }
      const old = held.get(String(run.id));
      if (!old || !old.hasCells || !sameRows) { refetch(); return; }
      merged.push({ ...old, state: run.state, finishedAtMs: run.finishedAtMs });
    }
    apply({ ...event, runs: merged }, new Set((event.runs || []).filter(run => run.hasCells).map(run => String(run.id))));
  };
  // One read at a time: events that need one while it is on its way wait for its answer.
  let refetching = null;
  const refetch = () => {
    refetching = refetching || api(base + "?" + query).then(answer => {
      refetching = null;
      if (view.left) return;
      apply(answer, new Set(columnIds(answer)));
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
