// The run page in a real browser: marking a task SUCCESS or FAILED (a reason asked, audited), a
// selection of tasks cleared and rerun with their downstream, a running task's duration and
// timeline bar that grow while it runs, timeline totals that count the attempts' own time (not a
// rerun's idle gap), task counts that count waiting tasks, and buttons named by their visible
// text. Against the scheduler and fixtures web_ui.rs sets up (fixtures/ui-run-*.yaml).

import { test } from "node:test";
import assert from "node:assert/strict";
import { AXE, GUARD, api, close, ended, instanceOf, open, shot, trigger, until } from "./common.mjs";

const post = async (path, body) => {
  const response = await fetch(process.env.AX_UI_URL + path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: response.status, body: await response.json() };
};

/** The page's fmtDuration, to compare what it shows with what the API says. */
function fmtDuration(ms) {
  const n = Math.max(0, Math.round(Number(ms)));
  if (n < 1000) return n + " ms";
  const s = n / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
  const m = Math.floor(s / 60), rest = Math.round(s % 60);
  if (m < 60) return m + " min " + rest + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

/** A duration as the page writes it, back in ms. */
function parseDuration(text) {
  const t = text.trim();
  let m;
  if ((m = /^(\d+) ms/.exec(t))) return Number(m[1]);
  if ((m = /^([\d.]+) s/.exec(t))) return Number(m[1]) * 1000;
  if ((m = /^(\d+) min (\d+) s/.exec(t))) return (Number(m[1]) * 60 + Number(m[2])) * 1000;
  throw new Error("not a duration: " + text);
}

/** axe's serious and critical violations, and any label-content-name-mismatch (an
 *  experimental rule, off by default: a control's accessible name must contain its visible
 *  text; a graph node's glyph is hidden from it, so "task X: SUCCESS" contains "X SUCCESS"). */
async function violations(page) {
  await page.addScriptTag({ content: AXE });
  const [all, names] = await page.evaluate(async () => [
    await window.axe.run(document, { resultTypes: ["violations"] }),
    await window.axe.run(document, { resultTypes: ["violations"], runOnly: ["label-content-name-mismatch"] }),
  ]);
  return all.violations.filter(v => v.impact === "serious" || v.impact === "critical").concat(names.violations)
    .map(v => `${v.id}: ${v.help} (${v.nodes.slice(0, 3).map(n => n.target.join(" ")).join("; ")})`);
}

const instanceState = async id => (await api(`/api/v1/instances/${id}`)).state;

test("marking a failed task SUCCESS asks a reason, runs what depends on it and ends the run SUCCESS; the mark is audited", async () => {
  const run = await trigger("ui-run-mark");
  assert.equal((await ended(run.id)).state, "RUN_STATE_FAILED");
  const boom = await instanceOf(run.id, "boom");
  // The API refuses a mark without a reason, naming what is missing, and changes nothing.
  const refused = await post(`/api/v1/instances/${boom.id}/mark`, { state: "INSTANCE_STATE_SUCCESS" });
  assert.equal(refused.status, 400);
  assert.match(refused.body.message, /needs a reason/);
  assert.equal(await instanceState(boom.id), "INSTANCE_STATE_FAILED");

  const page = await open(`/runs/${run.id}`, { bypassCSP: true });
  const mark = page.getByRole("button", { name: "Mark success: boom" });
  await mark.waitFor({ timeout: GUARD });
  assert.deepEqual(await violations(page), [], "the ended run's page with its mark buttons and checkboxes");
  await mark.click();
  const dialog = page.getByRole("dialog", { name: "Mark success: boom" });
  await dialog.waitFor({ timeout: GUARD });
  const confirm = dialog.getByRole("button", { name: "Mark success" });
  assert.equal(await confirm.isDisabled(), true, "no reason, no mark");
  await dialog.getByRole("textbox", { name: "Reason" }).fill("fixed the input by hand");
  assert.deepEqual(await violations(page), [], "the reason dialog");
  await shot(page, "run-mark-dialog");
  await confirm.click();
  await until("boom to be SUCCESS", async () => (await instanceState(boom.id)) === "INSTANCE_STATE_SUCCESS");
  assert.equal((await ended(run.id)).state, "RUN_STATE_SUCCESS");
  assert.equal(await instanceState((await instanceOf(run.id, "after")).id), "INSTANCE_STATE_SUCCESS");
  // The page follows the reopened run to its new end without a reload.
  await page.locator("main h1").getByText("SUCCESS").waitFor({ timeout: GUARD });
  await page.locator("main table.run-tasks tr", { hasText: "after" }).getByText("SUCCESS").waitFor({ timeout: GUARD });
  await shot(page, "run-marked-success");
  // Nothing of boom ran again: one attempt, which keeps its FAILED end and says who marked it.
  const detail = await api(`/api/v1/instances/${boom.id}`);
  assert.equal(detail.attempts.length, 1);
  assert.equal(detail.attempts[0].state, "INSTANCE_STATE_FAILED");
  assert.match(detail.attempts[0].message, /marked SUCCESS by web: fixed the input by hand/);
  const audit = await api(`/api/v1/audit?target=instance/${boom.id}`);
  const entry = (audit.entries || []).find(e => e.action === "mark");
  assert.ok(entry, JSON.stringify(audit));
  assert.equal(entry.detail, "SUCCESS (was FAILED): fixed the input by hand");
  await close(page);
});

test("an item of a mapped task is marked SUCCESS on its own page; its task settles and what depends on it runs", async () => {
  const run = await trigger("ui-run-item");
  assert.equal((await ended(run.id)).state, "RUN_STATE_FAILED");
  const list = await api(`/api/v1/runs/${run.id}/instances`);
  const item = (list.instances || []).find(i => i.task === "copy" && i.item === "b.csv");
  assert.ok(item, JSON.stringify(list));
  assert.equal(item.state, "INSTANCE_STATE_FAILED");
  const page = await open(`/instances/${item.id}`, { bypassCSP: true });
  const mark = page.getByRole("button", { name: `Mark success: copy item ${item.shardIndex || 0}` });
  await mark.waitFor({ timeout: GUARD });
  assert.equal(await page.getByRole("button", { name: /^Mark failed/ }).count(), 0, "a FAILED item is not marked FAILED again");
  assert.deepEqual(await violations(page), [], "an item's page with its mark button");
  await mark.click();
  const dialog = page.getByRole("dialog", { name: `Mark success: copy item ${item.shardIndex || 0}` });
  await dialog.getByRole("textbox", { name: "Reason" }).fill("copied b.csv by hand");
  await dialog.getByRole("button", { name: "Mark success" }).click();
  // The run was FAILED before the mark: it is reopened and ends again.
  await until("the item to be SUCCESS", async () => (await instanceState(item.id)) === "INSTANCE_STATE_SUCCESS");
  assert.equal((await ended(run.id)).state, "RUN_STATE_SUCCESS");
  const settled = (await api(`/api/v1/runs/${run.id}/instances`)).instances;
  assert.equal(settled.find(i => i.task === "copy" && !Number(i.shardParentId)).state, "INSTANCE_STATE_SUCCESS");
  assert.equal(settled.find(i => i.task === "join").state, "INSTANCE_STATE_SUCCESS");
  // The page shows the item's new state and now offers the other verdict.
  await page.locator("main h1").getByText("SUCCESS").waitFor({ timeout: GUARD });
  await page.getByRole("button", { name: `Mark failed: copy item ${item.shardIndex || 0}` }).waitFor({ timeout: GUARD });
  await shot(page, "run-item-marked");
  await close(page);
});

test("a running task's duration and bar grow each second; a waiting run counts its waiting task; marking it FAILED kills it for good", async () => {
  const run = await trigger("ui-run-live");
  const slow = await instanceOf(run.id, "slow");
  await until("slow to run", async () => (await instanceState(slow.id)) === "INSTANCE_STATE_RUNNING");
  // One at a time (concurrency: 1): a second run's task waits.
  const second = await trigger("ui-run-live");
  const page = await open(`/runs/${run.id}`, { bypassCSP: true });
  const cell = page.locator("main table.run-tasks tbody tr", { hasText: "slow" }).locator("td.duration");
  const bar = page.locator(".gantt-row", { hasText: "slow" });
  await bar.waitFor({ timeout: GUARD });
  const d1 = parseDuration(await cell.innerText());
  const g1 = parseDuration(await bar.locator(".gantt-time").innerText());
  await until("the duration to grow by 2 s", async () => parseDuration(await cell.innerText()) >= d1 + 2000);
  await until("the timeline's time to grow by 2 s", async () => parseDuration(await bar.locator(".gantt-time").innerText()) >= g1 + 2000);
  const title = await bar.locator(".gantt-bar").first().getAttribute("title");
  assert.ok(parseDuration(/, ([^,]+)$/.exec(title)[1]) >= 2000, title);
  assert.deepEqual(await violations(page), [], "a running run's page");
  await shot(page, "run-live-duration");

  const waiting = await open(`/runs/${second.id}`);
  const counts = waiting.locator(".task-counts");
  await counts.filter({ hasText: "1 waiting" }).waitFor({ timeout: GUARD });
  assert.doesNotMatch(await counts.innerText(), /0 running/);
  await shot(waiting, "run-counts-waiting");
  await close(waiting);

  await page.getByRole("button", { name: "Mark failed: slow" }).click();
  const dialog = page.getByRole("dialog", { name: "Mark failed: slow" });
  await dialog.getByRole("textbox", { name: "Reason" }).fill("stuck on a lock; killing it");
  await dialog.getByRole("button", { name: "Mark failed" }).click();
  assert.equal((await ended(run.id)).state, "RUN_STATE_FAILED");
  assert.equal(await instanceState((await instanceOf(run.id, "next")).id), "INSTANCE_STATE_UPSTREAM_FAILED");
  // The process is killed: the worker's late end adds its signal or exit code to the attempt,
  // whose own record says CANCELLED, and changes nothing else (no retry, no success).
  const killed = await until("the worker's late end", async () => {
    const i = await api(`/api/v1/instances/${slow.id}`);
    const a = i.attempts[0];
    return (a.signal !== undefined || a.exitCode !== undefined) && i;
  });
  assert.equal(killed.state, "INSTANCE_STATE_FAILED");
  assert.equal(killed.attempt, 1);
  assert.equal(killed.attempts.length, 1);
  assert.equal(killed.attempts[0].state, "INSTANCE_STATE_CANCELLED");
  await page.locator("main h1").getByText("FAILED").waitFor({ timeout: GUARD });
  await shot(page, "run-marked-failed");
  await close(page);
  await api(`/api/v1/runs/${second.id}/cancel`, { reason: "the check is done" });
});

test("a selection of tasks is cleared and rerun with its downstream; timeline totals count the attempts' own time", async () => {
  const run = await trigger("ui-run-select");
  assert.equal((await ended(run.id)).state, "RUN_STATE_SUCCESS");
  const page = await open(`/runs/${run.id}`, { bypassCSP: true });
  // Named by their visible text first (axe label-content-name-mismatch).
  await page.getByRole("button", { name: "Rerun from here: b" }).waitFor({ timeout: GUARD });
  const rerun = page.getByRole("button", { name: /^Clear and rerun selected/ });
  assert.equal(await rerun.isDisabled(), true, "nothing selected yet");
  await page.getByRole("checkbox", { name: "Select task b" }).check();
  await page.getByRole("checkbox", { name: "Select task side" }).check();
  await page.getByRole("button", { name: "Clear and rerun selected (2)" }).waitFor({ timeout: GUARD });
  assert.deepEqual(await violations(page), [], "the run page with a selection");
  await shot(page, "run-selection");
  await page.getByRole("button", { name: "Clear and rerun selected (2)" }).click();
  await page.getByRole("dialog", { name: "Clear and rerun selected" }).getByRole("button", { name: "Rerun" }).click();
  const b = await instanceOf(run.id, "b");
  await until("b's second attempt", async () => (await api(`/api/v1/instances/${b.id}`)).attempt === 2);
  assert.equal((await ended(run.id)).state, "RUN_STATE_SUCCESS");
  const list = await api(`/api/v1/runs/${run.id}/instances?attempts=true`);
  const attempts = Object.fromEntries(list.instances.map(i => [i.task, i.attempt]));
  assert.deepEqual(attempts, { a: 1, b: 2, c: 2, side: 2 }, "the selection and what is below it ran again, a did not");
  const audit = await api(`/api/v1/audit?target=run/${run.id}`);
  assert.ok((audit.entries || []).some(e => e.action === "rerun" && e.detail.startsWith("tasks b, side with downstream")), JSON.stringify(audit));

  // The timeline: each row's time is its attempts' own, the total is the work, not the span
  // from the first start to the last end (the idle gap before the rerun).
  await page.reload();
  const row = page.locator(".gantt-row", { hasText: "b (2 attempts)" });
  await row.waitFor({ timeout: GUARD });
  const own = list.instances.find(i => i.task === "b").attempts.map(a => Number(a.finishedAtMs) - Number(a.startedAtMs));
  assert.equal(await row.locator(".gantt-time").innerText(), fmtDuration(own[0] + own[1]) + " (" + own.map(fmtDuration).join(" + ") + ")");
  const all = list.instances.flatMap(i => i.attempts).filter(a => Number(a.startedAtMs));
  const work = all.reduce((sum, a) => sum + Number(a.finishedAtMs) - Number(a.startedAtMs), 0);
  const span = Math.max(...all.map(a => Number(a.finishedAtMs))) - Math.min(...all.map(a => Number(a.startedAtMs)));
  assert.ok(span > work, `the rerun left an idle gap (span ${span} ms, work ${work} ms)`);
  const total = await page.locator(".gantt-total").innerText();
  assert.ok(total.startsWith(fmtDuration(work) + " of work in 7 attempts"), total);
  await shot(page, "run-timeline-after-rerun");
  await close(page);
});
