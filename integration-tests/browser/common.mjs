// What the browser suites (ui*.test.mjs) share: the scheduler they test (AX_UI_URL, with the
// fixtures of ./fixtures applied by web_ui.rs), a chromium per suite, pages that fail their
// check on any script error or dialog, screenshots in AX_UI_SHOTS, the JSON API, and axe.

import { after, before } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

export const BASE = process.env.AX_UI_URL;
export const SHOTS = process.env.AX_UI_SHOTS;
if (!BASE || !SHOTS) throw new Error("AX_UI_URL and AX_UI_SHOTS must be set (web_ui.rs sets them)");
export const AXE = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

/** A hang guard for waits, not a timing assertion. */
export const GUARD = 30_000;

let browser;
before(async () => {
  browser = await chromium.launch({ executablePath: process.env.AX_CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
});
after(async () => { await browser?.close(); });

/** A fresh page; any script error or dialog on it fails the check that made it. */
export async function open(path, options = {}) {
  const context = await browser.newContext({
    viewport: { width: 1360, height: 900 },
    timezoneId: options.timezoneId || "UTC",
    locale: "en-US",
    colorScheme: options.colorScheme || "light",
    bypassCSP: Boolean(options.bypassCSP),
    acceptDownloads: true,
  });
  const page = await context.newPage();
  page.problems = [];
  page.on("pageerror", err => page.problems.push("page error: " + err.message));
  page.on("dialog", dialog => { page.problems.push("a dialog opened: " + dialog.message()); dialog.dismiss(); });
  page.on("console", msg => { if (msg.type() === "error" && !/Failed to load resource|net::ERR_FAILED|EventSource/.test(msg.text())) page.problems.push("console error: " + msg.text()); });
  if (path !== null) await page.goto(BASE + path);
  return page;
}

export async function close(page) {
  assert.deepEqual(page.problems, [], "the page had problems");
  await page.context().close();
}

export const shot = (page, name) => page.screenshot({ path: `${SHOTS}/${name}.png` });

export async function api(path, body) {
  const response = await fetch(BASE + path, body === undefined ? undefined : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  const json = await response.json();
  if (!response.ok) throw new Error(`${path}: ${response.status} ${json.message}`);
  return json;
}

export async function until(what, check, guard = GUARD) {
  const deadline = Date.now() + guard;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error("timed out waiting for " + what);
    await new Promise(r => setTimeout(r, 100));
  }
}

export const ENDED = ["RUN_STATE_SUCCESS", "RUN_STATE_FAILED", "RUN_STATE_CANCELLED"];
export const trigger = async (workflow, body = {}) => (await api(`/api/v1/workflows/${workflow}/trigger`, body)).run;
export const ended = id => until(`run ${id} to end`, async () => { const r = await api(`/api/v1/runs/${id}`); return ENDED.includes(r.state) && r; });
export async function instanceOf(runId, task) {
  return until(`an instance of ${task} in run ${runId}`, async () => {
    const list = await api(`/api/v1/runs/${runId}/instances`);
    return (list.instances || []).find(i => i.task === task);
  });
}

/** axe's serious and critical violations on the page as it is now, one line each (the page
 *  must have been opened with `bypassCSP: true`). */
export async function seriousViolations(page) {
  await page.addScriptTag({ content: AXE });
  const result = await page.evaluate(async () => await window.axe.run(document, { resultTypes: ["violations"] }));
  return result.violations.filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => `${v.id}: ${v.help} (${v.nodes.slice(0, 3).map(n => n.target.join(" ")).join("; ")})`);
}
