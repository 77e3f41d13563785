// The lists and the everyday pages in a real browser: run lists filtered by workflow, state,
// trigger and logical time, kept in the address and live; refreshes that keep keyboard focus and
// fetch once; URLs with and without a trailing slash; the header's toggles; a big graph as one
// tab stop; times in the workflow's own zone; the why page for a past time.

import { test } from "node:test";
import assert from "node:assert/strict";
import { BASE, GUARD, api, close, ended, instanceOf, open, seriousViolations, shot, trigger, until } from "./common.mjs";

const cancel = id => api(`/api/v1/runs/${id}/cancel`, { reason: "the check is done" });
const rowOf = (page, id) => page.locator("main tbody tr").filter({ has: page.getByRole("link", { name: `run ${id}`, exact: true }) });

test("/workflows and trailing-slash URLs open their pages, under one spelling", async () => {
  const page = await open("/workflows");
  await page.locator("main h1", { hasText: "Workflows" }).waitFor({ timeout: GUARD });
  await page.getByRole("link", { name: "ui-lists-one", exact: true }).waitFor({ timeout: GUARD });
  await page.goto(BASE + "/workflows/ui-lists-one/");
  await page.locator("main h1", { hasText: "ui-lists-one" }).waitFor({ timeout: GUARD });
  assert.equal(new URL(page.url()).pathname, "/workflows/ui-lists-one");
  await page.goto(BASE + "/runs/?state=success");
  await page.locator("main h1", { hasText: "Runs" }).waitFor({ timeout: GUARD });
  assert.equal(new URL(page.url()).pathname + new URL(page.url()).search, "/runs?state=success");
  await page.goto(BASE + "/workflows/ui-lists-one/why/");
  await page.locator("main h1", { hasText: "Why did" }).waitFor({ timeout: GUARD });
  await shot(page, "lists-trailing-slash");
  await close(page);
});

test("a one-task workflow's task is not flagged isolated; an isolated task is not drawn like an upstream failure", async () => {
  const dag = await api("/api/v1/workflows/ui-lists-one/dag");
  assert.equal(dag.nodes.length, 1);
  assert.ok(!dag.nodes[0].isolated, "the API calls a lone task isolated");
  const page = await open("/workflows/ui-lists-one");
  await page.locator("svg.graph .node").first().waitFor({ timeout: GUARD });
  assert.equal(await page.locator("svg.graph .node.isolated").count(), 0);
  assert.equal(await page.getByRole("note").filter({ hasText: "Isolated tasks" }).count(), 0);
  assert.equal(await page.locator("main table .flag").count(), 0);
  await shot(page, "lists-one-task");
  // ui-fanin's lonely task is isolated: a solid outline, where upstream-failed is dashed.
  await page.goto(BASE + "/workflows/ui-fanin");
  const lonely = page.locator("svg.graph .node.isolated rect");
  await lonely.waitFor({ timeout: GUARD });
  assert.equal(await lonely.evaluate(el => getComputedStyle(el).strokeDasharray), "none");
  await shot(page, "lists-isolated");
  await close(page);
});

test("the runs list: filters by state, trigger, workflow and logical time live in the address and survive a reload", async () => {
  const failed = await trigger("ui-failing");
  const ok = await trigger("ui-lists-one");
  await Promise.all([ended(failed.id), ended(ok.id)]);
  const page = await open("/runs", { bypassCSP: true });
  await rowOf(page, ok.id).waitFor({ timeout: GUARD });
  await page.getByRole("combobox", { name: "State" }).selectOption("failed");
  await page.waitForURL(/[?&]state=failed/, { timeout: GUARD });
  await rowOf(page, failed.id).waitFor({ timeout: GUARD });
  await until("only failed runs listed", async () => (await rowOf(page, ok.id).count()) === 0);
  const states = await page.locator("main tbody tr td:nth-child(3)").allInnerTexts();
  assert.ok(states.length > 0 && states.every(s => s.includes("FAILED")), states.join(" | "));
  await page.reload();
  await rowOf(page, failed.id).waitFor({ timeout: GUARD });
  assert.equal(await page.getByRole("combobox", { name: "State" }).inputValue(), "failed");
  assert.equal(await rowOf(page, ok.id).count(), 0);
  // By workflow and trigger: a trigger without an idempotency key is "manual".
  await page.goto(BASE + "/runs?workflow=ui-lists-one&trigger=manual");
  await rowOf(page, ok.id).waitFor({ timeout: GUARD });
  assert.equal(await page.getByRole("combobox", { name: "Trigger" }).inputValue(), "manual");
  assert.equal(await page.getByRole("searchbox", { name: "Workflow" }).inputValue(), "ui-lists-one");
  assert.equal(await rowOf(page, failed.id).count(), 0);
  await page.getByRole("combobox", { name: "Trigger" }).selectOption("cron");
  await page.getByText("No runs match these filters.").waitFor({ timeout: GUARD });
  // By logical time: a range that ends before the run's logical time holds none of them.
  await page.getByRole("button", { name: "Clear filters" }).click();
  await page.waitForURL(BASE + "/runs", { timeout: GUARD });
  await rowOf(page, ok.id).waitFor({ timeout: GUARD });
  const before = new Date(Number(ok.logicalTimeMs) - 3_600_000).toISOString().slice(0, 19);
  await page.getByLabel("to", { exact: true }).fill(before);
  await page.getByLabel("to", { exact: true }).dispatchEvent("change");
  await page.waitForURL(/[?&]to=\d+/, { timeout: GUARD });
  await until("runs after the bound to go", async () => (await rowOf(page, ok.id).count()) === 0);
  const to = Number(new URL(page.url()).searchParams.get("to"));
  assert.equal(to, Date.parse(before + "Z"), "the page is in UTC: the field is read in UTC");
  await shot(page, "lists-runs-filtered");
  assert.deepEqual(await seriousViolations(page), []);
  // A bad filter in the address is said, not silently ignored.
  await page.goto(BASE + "/runs?workflow=no-such-workflow");
  await page.getByRole("alert").filter({ hasText: "no-such-workflow" }).waitFor({ timeout: GUARD });
  await close(page);
});

test("the runs list and a workflow's runs are live: a new run appears, and its state changes, without a reload", async () => {
  for (const path of ["/runs?workflow=ui-lists-wait", "/workflows/ui-lists-wait"]) {
    const page = await open(path);
    await page.locator("main table").first().waitFor({ timeout: GUARD });
    const run = await trigger("ui-lists-wait");
    const row = rowOf(page, run.id);
    await row.waitFor({ timeout: GUARD });
    // Bug: a RUNNING run whose tasks wait read "0 ok · 0 failed · 0 running".
    await row.locator("td.counts", { hasText: /1 running/ }).waitFor({ timeout: GUARD });
    await row.locator("td.counts", { hasText: /\d+ waiting/ }).waitFor({ timeout: GUARD });
    await shot(page, "lists-live-" + path.split("/")[1].replace(/\W.*/, ""));
    await cancel(run.id);
    await row.locator(".state", { hasText: "CANCELLED" }).waitFor({ timeout: GUARD });
    await close(page);
  }
});

test("live refreshes fetch once on load and keep keyboard focus", async () => {
  for (const [path, call] of [["/", "/api/v1/workflows?"], ["/workers", "/api/v1/workers"]]) {
    const page = await open(null);
    const calls = [];
    page.on("request", r => { if (r.url().includes(call)) calls.push(Date.now()); });
    await page.goto(BASE + path);
    await page.locator("main h1").waitFor({ timeout: GUARD });
    await page.waitForTimeout(2000);
    assert.equal(calls.length, 1, `${path} fetched ${call} ${calls.length} times on load`);
    await close(page);
  }
  // The workflows list redraws a row when its runs change; the focused button stays focused.
  const page = await open("/");
  const pause = page.getByRole("button", { name: "Pause ui-lists-one" });
  await pause.focus();
  const run = await trigger("ui-lists-one");
  await ended(run.id);
  await page.getByRole("link", { name: `run ${run.id}: SUCCESS` }).waitFor({ timeout: GUARD });
  assert.equal(await page.evaluate(() => document.activeElement?.getAttribute("aria-label")), "Pause ui-lists-one");
  // The run page redraws its actions when the run changes; "Cancel run" stays focused.
  const waiting = await trigger("ui-lists-wait");
  await page.goto(BASE + `/runs/${waiting.id}`);
  const cancelButton = page.getByRole("button", { name: "Cancel run", exact: true });
  await cancelButton.focus();
  const second = await instanceOf(waiting.id, "second");
  await until("second to run", async () => (await api(`/api/v1/instances/${second.id}`)).state === "INSTANCE_STATE_RUNNING");
  await page.locator("main table").getByRole("link", { name: "second", exact: true }).waitFor({ timeout: GUARD });
  await page.waitForTimeout(1000);
  assert.equal(await page.evaluate(() => document.activeElement?.textContent), "Cancel run");
  await cancel(waiting.id);
  await close(page);
});

test("the header's toggles keep their names; their pressed state and the zone line say what is on", async () => {
  const page = await open("/", { timezoneId: "Europe/Paris" });
  const zone = page.getByRole("button", { name: "UTC times", exact: true });
  const theme = page.getByRole("button", { name: "Dark theme", exact: true });
  await zone.waitFor({ timeout: GUARD });
  assert.equal(await zone.getAttribute("aria-pressed"), "false");
  assert.equal(await page.locator("#zone-now").innerText(), "Times in Europe/Paris");
  await zone.click();
  assert.equal(await zone.getAttribute("aria-pressed"), "true");
  assert.equal(await page.locator("#zone-now").innerText(), "Times in UTC");
  assert.equal(await theme.getAttribute("aria-pressed"), "false");
  await theme.click();
  assert.equal(await theme.getAttribute("aria-pressed"), "true");
  assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), "dark");
  await shot(page, "lists-toggles-dark");
  await close(page);
});

test("a 2,000-task graph is one tab stop; arrow keys move between its nodes", async () => {
  const page = await open("/workflows/ui-big");
  await until("2,000 nodes", async () => (await page.locator("svg.graph .node").count()) === 2000);
  assert.equal(await page.locator("svg.graph [tabindex='0']").count(), 1);
  await page.getByRole("button", { name: "Fit" }).focus();
  // Fit, the four exports, then the graph.
  const inGraph = () => page.evaluate(() => Boolean(document.activeElement?.closest("svg.graph")));
  for (let i = 0; i < 6 && !(await inGraph()); i++) await page.keyboard.press("Tab");
  assert.ok(await inGraph(), "Tab never reached the graph");
  const task = () => page.evaluate(() => (document.activeElement.closest("[data-task]") || document.activeElement.querySelector("[data-task]"))?.dataset.task);
  const first = await task();
  await page.keyboard.press("ArrowRight");
  const right = await task();
  assert.notEqual(right, first, "ArrowRight moved nowhere");
  await page.keyboard.press("ArrowDown");
  assert.notEqual(await task(), right, "ArrowDown moved nowhere");
  await page.keyboard.press("Home");
  assert.equal(await task(), first);
  await page.keyboard.press("Tab");
  assert.ok(!(await inGraph()), "one Tab leaves the graph");
  await shot(page, "lists-graph-keyboard");
  await close(page);
});

test("next fire times show in the workflow's own zone, with the page's zone beside them", async () => {
  const workflow = await api("/api/v1/workflows/ui-lists-zoned");
  const next = Number(workflow.nextFiresMs[0]);
  const page = await open("/workflows/ui-lists-zoned");
  const first = page.locator(".kv dd ul li").first();
  await first.waitFor({ timeout: GUARD });
  const text = await first.innerText();
  assert.match(text, /02:30:00 E[SD]T \(America\/New_York\)/, text);
  const utc = new Date(next).toISOString().slice(11, 19);
  assert.ok(text.includes(utc + " UTC"), `${text} lacks ${utc} UTC`);
  await page.goto(BASE + "/");
  const row = page.locator("main tbody tr").filter({ has: page.getByRole("link", { name: "ui-lists-zoned", exact: true }) });
  await row.locator(".zone", { hasText: "(America/New_York)" }).waitFor({ timeout: GUARD });
  await shot(page, "lists-next-fires-zone");
  await close(page);
});

test("why, for a past time: the field keeps it, every time is in the workflow's zone, and the tasks point only to decisions shown", async () => {
  const page = await open("/workflows/ui-lists-zoned/why", { bypassCSP: true });
  const field = page.getByLabel("At (America/New_York)");
  await field.waitFor({ timeout: GUARD });
  // Chromium shows whole minutes without their seconds.
  const asked = "2026-03-10T02:40";
  await field.fill(asked);
  await page.getByRole("button", { name: "Explain" }).click();
  await page.waitForURL(/why\?at=\d+/, { timeout: GUARD });
  const at = Number(new URL(page.url()).searchParams.get("at"));
  // 02:40 EDT (the clocks went forward on 8 March) is 06:40 UTC.
  assert.equal(at, Date.parse("2026-03-10T06:40:00Z"));
  await page.locator("main p", { hasText: "At 2026-03-10 02:40:00" }).waitFor({ timeout: GUARD });
  assert.equal(await page.getByLabel("At (America/New_York)").inputValue(), asked);
  const previous = await page.locator(".kv dt", { hasText: "Previous slot" }).locator("xpath=following-sibling::dd[1]").innerText();
  assert.match(previous, /2026-03-10 02:30:00 EDT \(America\/New_York\)/, previous);
  const reason = await page.locator("main table").first().locator("tbody tr td").nth(2).innerText();
  assert.match(reason, /2026-03-10 02:30:00 EDT/, `the tasks explain the slot asked about: ${reason}`);
  const decisions = await page.locator("h2", { hasText: "Decisions" }).locator("xpath=following-sibling::*[1]").evaluate(el => el.tagName === "TABLE" ? el.querySelectorAll("tbody tr").length : 0);
  if (reason.includes("see the decisions")) assert.ok(decisions > 0, "the tasks point to an empty decisions table");
  else assert.match(reason, /no decision about it is recorded/, reason);
  await shot(page, "lists-why-past");
  assert.deepEqual(await seriousViolations(page), []);
  await close(page);
});
