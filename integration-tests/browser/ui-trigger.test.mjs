// The trigger form and the backfill page in a real browser: a field per declared param (defaults
// filled in, required refused with the API's message), free params, an idempotency key and a
// logical time read in the page's zone; a backfill's dry-run preview of the slots in the
// workflow's zone and the page's, which slots have a run already, then the runs created, and the
// refusals. Against the scheduler and fixtures web_ui.rs sets up (fixtures/ui-trigger-*.yaml).

import { test } from "node:test";
import assert from "node:assert/strict";
import { GUARD, api, close, open, seriousViolations, shot, until } from "./common.mjs";

const post = async (path, body) => {
  const response = await fetch(process.env.AX_UI_URL + path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: response.status, body: await response.json() };
};

const runsOf = async (workflow, trigger) => {
  const list = await api(`/api/v1/runs?workflow=${workflow}&limit=100`);
  return (list.runs || []).filter(r => !trigger || r.trigger === trigger);
};

const PARAMS = "ui-trigger-params";
const BACKFILL = "ui-trigger-backfill";

test("the API fills declared defaults, refuses a missing required param and a value outside the choices", async () => {
  const filled = await post(`/api/v1/workflows/${PARAMS}/trigger`, { params: { env: "staging", extra: "kept" } });
  assert.equal(filled.status, 200, JSON.stringify(filled.body));
  assert.deepEqual(filled.body.run.params, { day: "2026-01-01", env: "staging", limit: "10", extra: "kept" });
  const missing = await post(`/api/v1/workflows/${PARAMS}/trigger`, {});
  assert.equal(missing.status, 400);
  assert.match(missing.body.message, /missing required param "env"/);
  const outside = await post(`/api/v1/workflows/${PARAMS}/trigger`, { params: { env: "qa" } });
  assert.equal(outside.status, 400);
  assert.match(outside.body.message, /param "env": "qa" is not one of its choices \(staging, prod\)/);
  // The declarations are in the workflow's answer, in file order.
  const workflow = await api(`/api/v1/workflows/${PARAMS}`);
  assert.deepEqual(workflow.params.map(p => [p.name, p.hasDefault, p.defaultValue, p.required, p.choices]), [
    ["day", true, "2026-01-01", false, []],
    ["env", false, "", true, ["staging", "prod"]],
    ["limit", true, "10", false, []],
    ["note", false, "", false, []],
  ]);
});

test("the trigger form builds a field per declared param; a required one left out is refused inline; the run gets what the form had", async () => {
  const page = await open(`/workflows/${PARAMS}/trigger`, { bypassCSP: true, timezoneId: "Europe/Paris" });
  const day = page.getByLabel("day", { exact: true });
  await day.waitFor({ timeout: GUARD });
  assert.equal(await day.inputValue(), "2026-01-01", "the default is filled in");
  assert.equal(await page.getByLabel("limit", { exact: true }).inputValue(), "10");
  assert.equal(await page.getByLabel("note", { exact: true }).inputValue(), "");
  const env = page.getByLabel("env (required)", { exact: true });
  assert.equal(await env.evaluate(el => el.tagName), "SELECT", "choices are a select");
  assert.deepEqual(await env.locator("option").allInnerTexts(), ["choose one", "staging", "prod"]);
  assert.equal(await env.getAttribute("aria-required"), "true");
  assert.match(await page.locator("main form").innerText(), /The day to load · Default: 2026-01-01/);
  // The logical time says its zone: the browser's, until the header's button says UTC.
  assert.match(await page.locator("#logical-help").innerText(), /in Europe\/Paris \(this browser's zone\)/);
  assert.deepEqual(await seriousViolations(page), [], "the trigger form");
  await shot(page, "trigger-form");

  // env not chosen: the API's refusal, shown beside the form, names it; the field is marked.
  await page.getByRole("button", { name: `Trigger ${PARAMS}` }).click();
  const alert = page.locator("#trigger-errors [role=alert]");
  await alert.waitFor({ timeout: GUARD });
  assert.match(await alert.innerText(), /The trigger was refused: .*param "env"/);
  assert.equal(await env.getAttribute("aria-invalid"), "true");
  assert.equal(await env.evaluate(el => el === document.activeElement), true, "the refused field has the focus");
  assert.equal(new URL(page.url()).pathname, `/workflows/${PARAMS}/trigger`, "nothing was triggered");
  assert.deepEqual(await seriousViolations(page), [], "the refused trigger");
  await shot(page, "trigger-refused");

  await env.selectOption("prod");
  await page.getByLabel("limit", { exact: true }).fill("25");
  // Params the workflow does not declare go in rows of their own, added on demand.
  await page.getByRole("button", { name: "Add a param" }).click();
  await page.getByLabel("Param 1 name").fill("extra");
  await page.getByLabel("Param 1 value").fill("x y");
  await page.getByLabel("Idempotency key").fill("ui-trigger-key-1");
  await page.getByLabel("Logical time").fill("2025-06-01T12:30");
  await page.getByRole("button", { name: `Trigger ${PARAMS}` }).click();
  await page.waitForURL(/\/runs\/\d+$/, { timeout: GUARD });
  const id = /\/runs\/(\d+)$/.exec(page.url())[1];
  const run = await api(`/api/v1/runs/${id}`);
  // The optional param left empty (no default) is not sent; the default left alone is.
  assert.deepEqual(run.params, { day: "2026-01-01", env: "prod", limit: "25", extra: "x y" });
  assert.equal(run.idempotencyKey, "ui-trigger-key-1");
  // 12:30 in Paris in June (UTC+2) is 10:30 UTC.
  assert.equal(Number(run.logicalTimeMs), Date.UTC(2025, 5, 1, 10, 30, 0));
  await shot(page, "trigger-run");
  await close(page);
});

test("with the page in UTC the logical time is read in UTC", async () => {
  const page = await open(`/workflows/${PARAMS}/trigger`, { timezoneId: "Asia/Kolkata" });
  await page.getByLabel("day", { exact: true }).waitFor({ timeout: GUARD });
  await page.locator("#zone-toggle").click();
  await until("the field to say UTC", async () => /in UTC;/.test(await page.locator("#logical-help").innerText()));
  await page.getByLabel("env (required)", { exact: true }).selectOption("staging");
  await page.getByLabel("Logical time").fill("2025-01-15T23:05:07");
  await shot(page, "trigger-utc");
  await page.getByRole("button", { name: `Trigger ${PARAMS}` }).click();
  await page.waitForURL(/\/runs\/\d+$/, { timeout: GUARD });
  const run = await api(`/api/v1/runs/${/\/runs\/(\d+)$/.exec(page.url())[1]}`);
  assert.equal(Number(run.logicalTimeMs), Date.UTC(2025, 0, 15, 23, 5, 7));
  assert.deepEqual(run.params, { day: "2026-01-01", env: "staging", limit: "10" });
  await close(page);
});

test("a backfill previews the slots in the schedule's zone and the page's, creates the missing runs, and then none", async () => {
  // One slot of the range has its run already: 2025-03-03 06:00 in Tokyo, 03-02 21:00 UTC.
  const had = await api(`/api/v1/workflows/${BACKFILL}/backfill`, { fromMs: String(Date.UTC(2025, 2, 2, 20)), toMs: String(Date.UTC(2025, 2, 2, 22)) });
  assert.equal(had.created, 1);
  const page = await open(`/workflows/${BACKFILL}/backfill`, { bypassCSP: true, timezoneId: "America/New_York" });
  await page.getByLabel("From").waitFor({ timeout: GUARD });
  assert.match(await page.locator("#bf-zone").innerText(), /read in America\/New_York \(this browser's zone\).*in Asia\/Tokyo/);
  // From 2025-03-01 00:00 to 2025-03-04 00:00 in New York (UTC-5 then).
  await page.getByLabel("From").fill("2025-03-01T00:00");
  await page.getByLabel("To").fill("2025-03-04T00:00");
  const range = { fromMs: String(Date.UTC(2025, 2, 1, 5)), toMs: String(Date.UTC(2025, 2, 4, 5)) };
  const dry = await api(`/api/v1/workflows/${BACKFILL}/backfill`, { ...range, dryRun: true });
  assert.equal(dry.slots.length, 3);
  await page.getByRole("button", { name: "Preview" }).click();
  const rows = page.locator("table.slots tbody tr");
  await until("the preview's rows", async () => (await rows.count()) === 3);
  const shown = await rows.evaluateAll(trs => trs.map(tr => [tr.dataset.ms, tr.dataset.run]));
  assert.deepEqual(shown, dry.slots.map(s => [String(s.logicalTimeMs), s.run ? String(s.run.id) : ""]), "the preview is the API's dry run");
  assert.deepEqual(shown.map(([, run]) => Boolean(run)), [false, true, false], "the middle slot has its run");
  const first = await rows.first().innerText();
  assert.match(first, /2025-03-02 06:00:00 GMT\+9/, "the slot in the schedule's zone");
  assert.match(first, /2025-03-01 16:00:00 EST/, "and in the page's");
  assert.match(await page.locator("#bf-result").innerText(), /3 slots: 2 would get a new run, 1 has one already/);
  assert.deepEqual(await seriousViolations(page), [], "the backfill preview");
  await shot(page, "backfill-preview");

  await page.getByRole("button", { name: "Create 2 runs" }).click();
  const dialog = page.getByRole("dialog", { name: "Create 2 runs" });
  await dialog.waitFor({ timeout: GUARD });
  assert.deepEqual(await seriousViolations(page), [], "the confirm dialog");
  await dialog.getByRole("button", { name: "Create 2 runs" }).click();
  await page.getByText("2 runs created; 1 slot had a run already.").waitFor({ timeout: GUARD });
  const made = await rows.evaluateAll(trs => trs.map(tr => [tr.dataset.ms, tr.querySelector("a")?.getAttribute("href")]));
  await shot(page, "backfill-created");

  const runs = (await runsOf(BACKFILL, "TRIGGER_KIND_BACKFILL")).sort((a, b) => Number(a.logicalTimeMs) - Number(b.logicalTimeMs));
  assert.deepEqual(runs.map(r => String(r.logicalTimeMs)), dry.slots.map(s => String(s.logicalTimeMs)), "exactly the previewed slots have runs");
  assert.deepEqual(made, runs.map(r => [String(r.logicalTimeMs), "/runs/" + r.id]), "each listed with a link to its run");
  for (const run of runs) assert.deepEqual(run.params, { region: "eu" }, "a backfill run gets the declared default");
  // The page's backfill is audited as the web's, with what it did.
  const audit = await api(`/api/v1/audit?target=workflow/${BACKFILL}`);
  const entry = (audit.entries || []).find(e => e.action === "backfill" && e.actor === "web");
  assert.ok(entry, JSON.stringify(audit));
  assert.match(entry.detail, /2 runs created, 1 slots already had one/);

  // Again: nothing left to create, on the page and through the API.
  await page.getByRole("button", { name: "Preview" }).click();
  await page.getByText("3 slots: 0 would get a new run, 3 have one already.").waitFor({ timeout: GUARD });
  assert.equal(await page.getByRole("button", { name: /^Create/ }).count(), 0);
  const again = await api(`/api/v1/workflows/${BACKFILL}/backfill`, range);
  assert.deepEqual([again.created, again.existing], [0, 3]);
  assert.equal((await runsOf(BACKFILL, "TRIGGER_KIND_BACKFILL")).length, 3);
  await close(page);
});

test("a backfill's refusals are said: a reversed range, too many slots, a workflow without a cron schedule", async () => {
  const page = await open(`/workflows/${BACKFILL}/backfill`, { bypassCSP: true });
  await page.getByLabel("From").waitFor({ timeout: GUARD });
  const alert = page.locator("#bf-result [role=alert]");
  await page.getByLabel("From").fill("2025-03-04T00:00");
  await page.getByLabel("To").fill("2025-03-01T00:00");
  await page.getByRole("button", { name: "Preview" }).click();
  await until("the reversed range's refusal", async () => /The preview was refused: .*reversed/.test(await alert.innerText().catch(() => "")));
  await page.getByLabel("From").fill("2020-01-01T00:00");
  await page.getByLabel("To").fill("2025-01-01T00:00");
  await page.getByRole("button", { name: "Preview" }).click();
  await until("the too-many refusal", async () => /more than 1000 slots/.test(await alert.innerText().catch(() => "")));
  assert.deepEqual(await seriousViolations(page), [], "a refused preview");
  await shot(page, "backfill-refused");
  await close(page);

  const manual = await open(`/workflows/${PARAMS}/backfill`, { bypassCSP: true });
  await manual.getByText(`${PARAMS} has no cron schedule`).waitFor({ timeout: GUARD });
  await manual.getByRole("button", { name: "Preview" }).click();
  await until("the no-cron refusal", async () => /has no cron schedule: backfill needs one/.test(await manual.locator("#bf-result").innerText()));
  assert.deepEqual(await seriousViolations(manual), [], "a manual workflow's backfill page");
  await shot(manual, "backfill-no-cron");
  await close(manual);
});

test("the workflow page links to its backfill", async () => {
  const page = await open(`/workflows/${BACKFILL}`);
  await page.getByRole("link", { name: "Backfill" }).click();
  await page.waitForURL(new RegExp(`/workflows/${BACKFILL}/backfill$`), { timeout: GUARD });
  await page.getByRole("heading", { name: `Backfill ${BACKFILL}` }).waitFor({ timeout: GUARD });
  await close(page);
});
