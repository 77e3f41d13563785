// The web UI's figures in a real browser, for ax-bench's U1 workload (it starts the scheduler,
// applies the workflows and reads the scheduler's CPU; this script drives chromium and prints
// one JSON object on its last line). Not a test: it asserts nothing and only times.
//
//   AX_UI_URL     the scheduler's base URL
//   AX_CHROMIUM   chromium's path (default /usr/bin/chromium)
//   AX_UI_DAG     a workflow whose whole graph is drawn: time from navigation to every node
//   AX_UI_HUGE    a workflow too big to draw: time from navigation to its task list
//   AX_UI_PAGES   comma-separated paths kept open for the idle phases
//   AX_UI_IDLE_S  seconds of each idle phase (visible, then hidden)
//   AX_UI_LOADS   cold loads of each timed page (default 5)
//   AX_UI_GRID    a workflow whose grid is timed (cold loads until its rows and first screens of
//                 cells are drawn; the last row once scrolled to) and
//                 then kept open alone for two idle phases (grid_visible, grid_hidden)
//   AX_UI_GRID_RUNS  the grid's runs (columns), default 100

import { chromium } from "playwright-core";

const BASE = process.env.AX_UI_URL;
const LOADS = Number(process.env.AX_UI_LOADS || 5);
const IDLE_S = Number(process.env.AX_UI_IDLE_S || 30);
/** A hang guard, not a budget. */
const GUARD = 60_000;

const browser = await chromium.launch({ executablePath: process.env.AX_CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
const fresh = async () => {
  const context = await browser.newContext({ viewport: { width: 1360, height: 900 }, timezoneId: "UTC", locale: "en-US" });
  return context.newPage();
};

/** The page's clock (ms since its navigation began) once the frame after the current one has
 *  been drawn: a timer set in an animation frame callback runs after that frame's paint. */
const painted = page => page.evaluate(() => new Promise(done => requestAnimationFrame(() => setTimeout(() => done(performance.now()), 0))));

/** Milliseconds from the start of navigation to the frame drawn after `ready(arg)` holds in the
 *  page (a function: the page's Content-Security-Policy refuses strings), by the page's own
 *  clock, for `LOADS` cold loads. The check polls every 16 ms, so a figure may include a frame
 *  more than the page needed. */
async function coldLoads(path, ready, arg, requested) {
  const times = [];
  for (let n = 0; n < LOADS; n++) {
    const page = await fresh();
    await page.goto(BASE + path);
    await page.waitForFunction(ready, arg, { timeout: GUARD, polling: 16 });
    times.push(Math.round(await painted(page)));
    // When the page asked for its data (`requested.path` in the URL), by the page's clock: what
    // loading the page and its modules cost before it.
    if (requested) {
      requested.ms.push(Math.round(await page.evaluate(part => performance.getEntriesByType("resource").find(e => e.name.includes(part))?.startTime ?? -1, requested.path)));
    }
    await page.context().close();
  }
  return times;
}

const result = {};
if (process.env.AX_UI_DAG) {
  const dag = await (await fetch(`${BASE}/api/v1/workflows/${process.env.AX_UI_DAG}/dag`)).json();
  const nodes = dag.nodes.length;
  result.dag_nodes = nodes;
  result.dag_ms = await coldLoads(`/workflows/${process.env.AX_UI_DAG}`, n => document.querySelectorAll("svg.graph .node").length === n, nodes);
}
if (process.env.AX_UI_HUGE) {
  result.huge_ms = await coldLoads(`/workflows/${process.env.AX_UI_HUGE}`, () => document.querySelectorAll("main tbody tr[id^=task-]").length > 0);
}
if (process.env.AX_UI_PAGES) {
  const pages = [];
  for (const path of process.env.AX_UI_PAGES.split(",")) {
    const page = await fresh();
    page.requests = 0;
    page.on("request", () => { page.requests += 1; });
    await page.goto(BASE + path);
    await page.waitForLoadState("networkidle").catch(() => {});
    pages.push({ path, page });
  }
  const phase = async name => {
    for (const p of pages) p.page.requests = 0;
    console.log(JSON.stringify({ phase: name, at: Date.now() }));
    await new Promise(r => setTimeout(r, IDLE_S * 1000));
    return Object.fromEntries(pages.map(p => [p.path, p.page.requests]));
  };
  result.visible_requests = await phase("visible");
  // Hidden as a browser reports a background tab: the page's own visibility handling runs.
  for (const { page } of pages) {
    await page.evaluate(() => {
      Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
      Object.defineProperty(document, "hidden", { configurable: true, get: () => true });
      document.dispatchEvent(new Event("visibilitychange"));
    });
  }
  result.hidden_requests = await phase("hidden");
  console.log(JSON.stringify({ phase: "done", at: Date.now() }));
}
if (process.env.AX_UI_GRID) {
  const runs = Number(process.env.AX_UI_GRID_RUNS || 100);
  const api = `${BASE}/api/v1/workflows/${process.env.AX_UI_GRID}/grid?limit=${runs}`;
  // The matrix's JSON: its size, and how long the node takes to answer it.
  result.grid_api_ms = [];
  for (let n = 0; n < LOADS; n++) {
    const started = Date.now();
    const text = await (await fetch(api)).text();
    result.grid_api_ms.push(Date.now() - started);
    result.grid_bytes = text.length;
    const grid = JSON.parse(text);
    result.grid_cells = grid.runs.length * grid.tasks.length;
  }
  const path = `/workflows/${process.env.AX_UI_GRID}/grid?runs=${runs}`;
  // Drawn: every row listed and the rows the page draws at once (40, more than a screen) with
  // all their cells; the page draws the others as they near the view.
  const drawn = ([rows, cells]) => document.querySelectorAll("table.grid tbody tr").length === rows
    && document.querySelectorAll("table.grid a.gcell").length >= cells;
  const tasks = result.grid_cells / runs;
  const firstCells = Math.min(tasks, 40) * runs;
  const requested = { path: `/api/v1/workflows/${process.env.AX_UI_GRID}/grid?`, ms: [] };
  result.grid_ms = await coldLoads(path, drawn, [tasks, firstCells], requested);
  result.grid_requested_ms = requested.ms;
  // Then the last row, scrolled to: the time until its cells are drawn.
  {
    const page = await fresh();
    await page.goto(BASE + path);
    await page.waitForFunction(drawn, [tasks, firstCells], { timeout: GUARD, polling: 16 });
    const started = await page.evaluate(() => { const box = document.querySelector(".grid-scroll"); box.scrollTop = box.scrollHeight; return performance.now(); });
    await page.waitForFunction(n => document.querySelectorAll("table.grid tbody tr:last-child a.gcell").length === n, runs, { timeout: GUARD, polling: 16 });
    result.grid_scroll_ms = Math.round(await painted(page) - started);
    await page.context().close();
  }
  // The grid alone, open (its live stream) and then hidden.
  const page = await fresh();
  page.requests = 0;
  page.on("request", () => { page.requests += 1; });
  await page.goto(BASE + path);
  await page.waitForFunction(drawn, [tasks, firstCells], { timeout: GUARD, polling: 100 });
  const idle = async name => {
    page.requests = 0;
    console.log(JSON.stringify({ phase: name, at: Date.now() }));
    await new Promise(r => setTimeout(r, IDLE_S * 1000));
    return { [path]: page.requests };
  };
  result.grid_visible_requests = await idle("grid_visible");
  await page.evaluate(() => {
    Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
    Object.defineProperty(document, "hidden", { configurable: true, get: () => true });
    document.dispatchEvent(new Event("visibilitychange"));
  });
  result.grid_hidden_requests = await idle("grid_hidden");
  console.log(JSON.stringify({ phase: "grid_done", at: Date.now() }));
}
await browser.close();
console.log(JSON.stringify(result));
