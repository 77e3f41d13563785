// The grid in a real browser: a workflow's runs as columns and tasks as rows, each cell's state,
// name and link checked against the API (failed, retried, skipped by a rule and by a condition,
// upstream failed, a mapped task's items, a run_workflow task's child run); live, a new run is a
// new column and a running cell turns SUCCESS without a reload; keyboard, one tab stop with
// arrow keys between cells; axe finds nothing serious. Against the scheduler and fixtures
// web_ui.rs sets up (fixtures/ui-grid-*.yaml).

import { test } from "node:test";
import assert from "node:assert/strict";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { BASE, GUARD, api, close, ended, open, seriousViolations, shot, trigger, until } from "./common.mjs";

/** "RUN_STATE_FAILED", "INSTANCE_STATE_SUCCESS", "success" → "FAILED", "SUCCESS". */
const stateName = raw => String(raw || "").replace(/^(RUN_STATE|INSTANCE_STATE)_/, "").toUpperCase();

/** Every cell of the page: its run, task, class, name and link. */
async function pageCells(page) {
  return page.evaluate(() => [...document.querySelectorAll("table.grid tbody tr")].flatMap(tr => {
    const runs = [...document.querySelectorAll("table.grid thead th.grun")].map(th => th.dataset.run);
    return [...tr.querySelectorAll("a.gcell")].map((a, n) => ({
      run: runs[n], task: tr.dataset.task, cls: a.className, label: a.getAttribute("aria-label"), href: a.getAttribute("href"),
    }));
  }));
}

/** What the API says a run's cells are: by task, its own instance (state, id, attempt), its
 *  items' counts and its current attempt's child run. */
async function expectedCells(runId) {
  const list = await api(`/api/v1/runs/${runId}/instances?attempts=true&group_items=true`);
  const own = new Map((list.instances || []).filter(i => !Number(i.shardParentId)).map(i => [i.task, i]));
  const items = new Map((list.tasks || []).filter(t => t.items).map(t => [t.task, t.items]));
  const cells = new Map();
  for (const [task, inst] of own) {
    const current = (inst.attempts || []).find(a => Number(a.attempt) === Number(inst.attempt));
    const child = current && Number(current.childRunId) ? String(current.childRunId) : "";
    cells.set(task, {
      state: stateName(inst.state),
      href: child ? `/runs/${child}` : `/instances/${inst.id}`,
      attempt: Number(inst.attempt),
      items: items.get(task) || null,
      child,
    });
  }
  return cells;
}

test("grid: every cell's state, name and link is the API's: failed, retried, skipped, upstream failed, mapped items, child run", async () => {
  const runs = [];
  for (const body of [{}, { params: { archive: "yes" } }]) {
    const run = await trigger("ui-grid-mixed", body);
    runs.push(await ended(run.id));
  }
  const page = await open("/workflows/ui-grid-mixed/grid");
  await page.locator("table.grid a.gcell").first().waitFor({ timeout: GUARD });
  const grid = await api("/api/v1/workflows/ui-grid-mixed/grid");
  // The rows are the graph's order: every task after its upstreams.
  const rows = await page.locator("table.grid tbody tr").evaluateAll(trs => trs.map(tr => tr.dataset.task));
  assert.deepEqual(rows, grid.tasks.map(t => t.name));
  assert.equal(rows[0], "extract");
  assert.ok(rows.indexOf("join") > rows.indexOf("copy") && rows.indexOf("publish") > rows.indexOf("check"), rows.join(","));
  // The columns: oldest left, newest right, as the API orders them.
  const headers = await page.locator("table.grid thead th.grun").evaluateAll(ths => ths.map(th => th.dataset.run));
  assert.deepEqual(headers, grid.runs.map(r => String(r.id)));
  assert.equal(headers.at(-1), String(runs[1].id), "the newest run is the rightmost column");

  const cells = await pageCells(page);
  assert.equal(cells.length, grid.runs.length * grid.tasks.length, "one cell per run and task");
  for (const run of grid.runs) {
    const expected = await expectedCells(run.id);
    for (const cell of cells.filter(c => c.run === String(run.id))) {
      const want = expected.get(cell.task);
      if (!want) {
        assert.equal(cell.label, `task ${cell.task}, run ${run.id}: no instance`);
        assert.equal(cell.href, `/runs/${run.id}`);
        continue;
      }
      assert.ok(cell.label.startsWith(`task ${cell.task}, run ${run.id}: ${want.state}`), `${cell.label} is ${want.state}`);
      assert.match(cell.cls, new RegExp(`\\bs-${want.state.toLowerCase()}\\b`), cell.label);
      assert.equal(cell.href, want.href, cell.label);
      assert.equal(cell.label.includes(`, attempt ${want.attempt}`), want.attempt > 1, cell.label);
      if (want.items) assert.ok(cell.label.includes(`, ${want.items.total} items: `), cell.label);
      if (want.child) assert.ok(cell.label.endsWith(`, child run ${want.child}`), cell.label);
    }
  }
  // What each kind of cell says, in the first run (no archive param).
  const first = String(runs[0].id);
  const label = task => cells.find(c => c.run === first && c.task === task).label;
  assert.equal(label("check"), `task check, run ${first}: FAILED`);
  assert.equal(label("publish"), `task publish, run ${first}: UPSTREAM_FAILED`);
  assert.equal(label("on_error"), `task on_error, run ${first}: SKIPPED`);
  assert.equal(label("archive"), `task archive, run ${first}: SKIPPED`);
  assert.equal(label("flaky"), `task flaky, run ${first}: SUCCESS, attempt 2`);
  assert.equal(label("copy"), `task copy, run ${first}: FAILED, 3 items: 2 success, 1 failed (worst FAILED)`);
  assert.match(label("call"), new RegExp(`^task call, run ${first}: SUCCESS, child run \\d+$`));
  const second = String(runs[1].id);
  assert.equal(cells.find(c => c.run === second && c.task === "archive").label, `task archive, run ${second}: SUCCESS`, "the condition held in the second run");
  // The run header: id, state and logical time.
  const header = page.locator(`table.grid th.grun[data-run="${first}"]`);
  assert.match(await header.getByRole("link").getAttribute("aria-label"), new RegExp(`^run ${first}: FAILED, logical time \\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d:\\d\\d UTC$`));
  await shot(page, "grid-mixed");

  // A cell opens its instance's page (its log); a run_workflow cell its child run.
  await page.getByRole("link", { name: `task check, run ${first}: FAILED`, exact: true }).click();
  await page.locator("main h1").getByText("FAILED").waitFor({ timeout: GUARD });
  assert.equal(new URL(page.url()).pathname, cells.find(c => c.run === first && c.task === "check").href);
  await page.goBack();
  const call = page.getByRole("link", { name: new RegExp(`^task call, run ${first}: SUCCESS, child run`) });
  await call.click();
  await page.locator("main h1").getByText(/^Run \d+/).waitFor({ timeout: GUARD });
  assert.equal(new URL(page.url()).pathname, cells.find(c => c.run === first && c.task === "call").href);
  await close(page);
});

test("grid: live — a new run appears as a new column and its running cell turns SUCCESS without a reload", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ax-grid-"));
  const earlier = await trigger("ui-grid-live", { params: { release: join(dir, "first") } });
  writeFileSync(join(dir, "first"), "go");
  await ended(earlier.id);
  const page = await open("/workflows/ui-grid-live/grid");
  await page.locator(`table.grid th.grun[data-run="${earlier.id}"]`).waitFor({ timeout: GUARD });
  await page.evaluate(() => { window.__sameDocument = true; });

  const release = join(dir, "second");
  const run = await trigger("ui-grid-live", { params: { release } });
  // The new column, rightmost, without a reload.
  await page.locator(`table.grid th.grun[data-run="${run.id}"]`).waitFor({ timeout: GUARD });
  const headers = await page.locator("table.grid thead th.grun").evaluateAll(ths => ths.map(th => th.dataset.run));
  assert.equal(headers.at(-1), String(run.id));
  const hold = page.getByRole("link", { name: `task hold, run ${run.id}: RUNNING`, exact: true });
  await hold.waitFor({ timeout: GUARD });
  const inst = (await api(`/api/v1/runs/${run.id}/instances`)).instances.find(i => i.task === "hold");
  assert.equal(await hold.getAttribute("href"), `/instances/${inst.id}`);
  await shot(page, "grid-live-running");

  writeFileSync(release, "go");
  await page.getByRole("link", { name: `task hold, run ${run.id}: SUCCESS`, exact: true }).waitFor({ timeout: GUARD });
  await page.getByRole("link", { name: `task last, run ${run.id}: SUCCESS`, exact: true }).waitFor({ timeout: GUARD });
  await until("the run header to say SUCCESS", async () => /: SUCCESS,/.test(await page.locator(`table.grid th.grun[data-run="${run.id}"] a`).getAttribute("aria-label")));
  assert.equal(await page.evaluate(() => window.__sameDocument), true, "the page was not reloaded");
  assert.equal(await page.locator("table.grid thead th.grun").count(), headers.length, "no column twice");
  await shot(page, "grid-live-done");
  await close(page);
});

test("grid: keyboard — one tab stop, arrow keys between cells, Enter opens one; the filter; no serious axe violation in light or dark", async () => {
  const run = await trigger("ui-grid-mixed");
  await ended(run.id);
  const page = await open("/workflows/ui-grid-mixed/grid", { bypassCSP: true });
  await page.locator("table.grid a.gcell").first().waitFor({ timeout: GUARD });
  assert.equal(await page.locator("table.grid [tabindex=\"0\"]").count(), 1, "one tab stop in the grid");
  // Tab reaches the grid once: the newest run's first task.
  let focused = "";
  for (let i = 0; i < 40 && !focused.startsWith("task "); i++) {
    await page.keyboard.press("Tab");
    focused = await page.evaluate(() => document.activeElement?.getAttribute("aria-label") || "");
  }
  const grid = await api("/api/v1/workflows/ui-grid-mixed/grid");
  const newest = grid.runs.at(-1).id, older = grid.runs.at(-2).id;
  assert.ok(focused.startsWith(`task extract, run ${newest}: `), focused);
  const active = () => page.evaluate(() => document.activeElement?.getAttribute("aria-label") || "");
  await page.keyboard.press("ArrowDown");
  assert.ok((await active()).startsWith(`task ${grid.tasks[1].name}, run ${newest}: `), await active());
  await page.keyboard.press("ArrowLeft");
  assert.ok((await active()).startsWith(`task ${grid.tasks[1].name}, run ${older}: `), await active());
  await page.keyboard.press("Home");
  assert.ok((await active()).startsWith(`task ${grid.tasks[1].name}, run ${grid.runs[0].id}: `), await active());
  await page.keyboard.press("End");
  await page.keyboard.press("ArrowUp");
  assert.ok((await active()).startsWith(`task extract, run ${newest}: `), await active());
  assert.equal(await page.locator("table.grid [tabindex=\"0\"]").count(), 1, "still one tab stop");
  // Tab leaves the grid at once: no cell is a stop of its own.
  await page.keyboard.press("Tab");
  assert.ok(!(await active()).startsWith("task "), "Tab leaves the grid");
  await page.keyboard.press("Shift+Tab");
  assert.ok((await active()).startsWith(`task extract, run ${newest}: `), "Shift+Tab comes back to the same cell");
  await shot(page, "grid-keyboard");

  // The filter keeps the matching rows; the tab stop moves to a shown cell.
  await page.getByLabel("Filter tasks by name").fill("publish");
  await until("one row shown", async () => (await page.locator("table.grid tbody tr:not([hidden])").count()) === 1);
  assert.equal(await page.locator("table.grid tbody tr:not([hidden])").getAttribute("data-task"), "publish");
  assert.equal(await page.locator("table.grid tbody tr:not([hidden]) [tabindex=\"0\"]").count(), 1);
  await page.locator("main [role=status]").getByText("1 match").waitFor({ timeout: GUARD });
  await shot(page, "grid-filter");
  await page.getByLabel("Filter tasks by name").fill("");

  for (const theme of ["light", "dark"]) {
    await page.evaluate(t => localStorage.setItem("ax.theme", t), theme);
    await page.goto(BASE + "/workflows/ui-grid-mixed/grid");
    await page.locator("table.grid a.gcell").first().waitFor({ timeout: GUARD });
    assert.deepEqual(await seriousViolations(page), [], theme);
    await shot(page, `grid-${theme}`);
  }
  // Enter on a cell opens it.
  await page.locator("table.grid a.gcell[tabindex=\"0\"]").focus();
  const target = await page.locator("table.grid a.gcell[tabindex=\"0\"]").getAttribute("href");
  await page.keyboard.press("Enter");
  await page.waitForURL(BASE + target);
  await page.locator("main h1").getByText("extract").waitFor({ timeout: GUARD });
  await close(page);
});

test("grid: the workflow page links it, older runs page back, and a bad limit is refused by name", async () => {
  const page = await open("/workflows/ui-grid-mixed");
  await page.locator("main .toolbar").getByRole("link", { name: "Grid", exact: true }).click();
  await page.waitForURL(BASE + "/workflows/ui-grid-mixed/grid");
  await page.locator("table.grid a.gcell").first().waitFor({ timeout: GUARD });
  const all = await api("/api/v1/workflows/ui-grid-mixed/grid?limit=100");
  const page1 = await api("/api/v1/workflows/ui-grid-mixed/grid?limit=1");
  assert.equal(page1.runs.length, 1);
  assert.equal(page1.runs[0].id, all.runs.at(-1).id, "the newest run");
  assert.equal(page1.nextBeforeId, page1.runs[0].id);
  const page2 = await api(`/api/v1/workflows/ui-grid-mixed/grid?limit=1&before=${page1.nextBeforeId}`);
  assert.equal(page2.runs[0].id, all.runs.at(-2).id, "the next older run");
  await page.goto(BASE + `/workflows/ui-grid-mixed/grid?runs=25&before=${page1.nextBeforeId}`);
  await page.getByRole("link", { name: "Newest runs →" }).waitFor({ timeout: GUARD });
  const headers = await page.locator("table.grid thead th.grun").evaluateAll(ths => ths.map(th => th.dataset.run));
  assert.ok(!headers.includes(String(page1.runs[0].id)), "an older page leaves the newest run out");
  const refused = await fetch(BASE + "/api/v1/workflows/ui-grid-mixed/grid?limit=101");
  assert.equal(refused.status, 400);
  assert.match((await refused.json()).message, /^limit: 101 runs is more than the 100 a grid holds$/);
  const missing = await fetch(BASE + "/api/v1/workflows/no-such-wf/grid");
  assert.equal(missing.status, 404);
  await close(page);
});
