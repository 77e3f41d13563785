// The task page's log viewer in a real browser (issue 38: bugs 3, 4, 7 and 8): a 2,000,000-line
// log reached to its end and at #L links, long lines kept whole up to ax-worker's limit and
// downloaded as printed, the attempts table live while tailing, and what a terminal would show
// of escape sequences, carriage returns and coloured pairs. Fixtures: ./fixtures/ui-logs-*.yaml.
// Run by `AX_UI_SUITE=ui-logs cargo test -p ax-integration-tests --test main -- web_ui::`.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { chromium } from "playwright-core";

const BASE = process.env.AX_UI_URL;
const SHOTS = process.env.AX_UI_SHOTS;
if (!BASE || !SHOTS) throw new Error("AX_UI_URL and AX_UI_SHOTS must be set (web_ui.rs sets them)");
const AXE = readFileSync(createRequire(import.meta.url).resolve("axe-core/axe.min.js"), "utf8");

/** A hang guard for waits, not a timing assertion. */
const GUARD = 30_000;
/** Storing 2,000,000 lines takes a while on a busy machine: a hang guard only. */
const HUGE_GUARD = 400_000;
/** ax-worker's default line limit (`ax_worker::logs::MAX_LINE_BYTES`). */
const MAX_LINE_BYTES = 1 << 20;
/** Chromium's tallest element; the viewer's scroll area must stay below it. */
const CHROMIUM_MAX_PX = 33_554_428;

let browser;
before(async () => {
  browser = await chromium.launch({ executablePath: process.env.AX_CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
});
after(async () => { await browser?.close(); });

/** A fresh page; any script error or dialog on it fails the check that made it. */
async function open(path, options = {}) {
  const context = await browser.newContext({
    viewport: { width: 1360, height: 900 },
    timezoneId: "UTC",
    locale: "en-US",
    colorScheme: "light",
    bypassCSP: Boolean(options.bypassCSP),
    acceptDownloads: true,
  });
  const page = await context.newPage();
  page.problems = [];
  page.on("pageerror", err => page.problems.push("page error: " + err.message));
  page.on("dialog", dialog => { page.problems.push("a dialog opened: " + dialog.message()); dialog.dismiss(); });
  page.on("console", msg => { if (msg.type() === "error" && !/Failed to load resource|net::ERR_FAILED|EventSource/.test(msg.text())) page.problems.push("console error: " + msg.text()); });
  if (options.theme) await page.addInitScript(t => localStorage.setItem("ax.theme", t), options.theme);
  if (path !== null) await page.goto(BASE + path);
  return page;
}

async function close(page) {
  assert.deepEqual(page.problems, [], "the page had problems");
  await page.context().close();
}

const shot = (page, name) => page.screenshot({ path: `${SHOTS}/${name}.png` });

async function api(path, body) {
  const response = await fetch(BASE + path, body === undefined ? undefined : {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  const json = await response.json();
  if (!response.ok) throw new Error(`${path}: ${response.status} ${json.message}`);
  return json;
}

async function until(what, check, guard = GUARD) {
  const deadline = Date.now() + guard;
  for (;;) {
    const value = await check();
    if (value) return value;
    if (Date.now() > deadline) throw new Error("timed out waiting for " + what);
    await new Promise(r => setTimeout(r, 100));
  }
}

const ENDED = ["RUN_STATE_SUCCESS", "RUN_STATE_FAILED", "RUN_STATE_CANCELLED"];
const trigger = async workflow => (await api(`/api/v1/workflows/${workflow}/trigger`, {})).run;
const ended = (id, guard = GUARD) => until(`run ${id} to end`, async () => { const r = await api(`/api/v1/runs/${id}`); return ENDED.includes(r.state) && r; }, guard);
async function instanceOf(runId, task) {
  return until(`an instance of ${task} in run ${runId}`, async () => {
    const list = await api(`/api/v1/runs/${runId}/instances`);
    return (list.instances || []).find(i => i.task === task);
  });
}
/** A finished task of `workflow`: its instance. */
async function finishedTask(workflow, task, guard = GUARD) {
  const run = await trigger(workflow);
  const r = await ended(run.id, guard);
  assert.equal(r.state, "RUN_STATE_SUCCESS", `${workflow} run ${run.id}`);
  return instanceOf(run.id, task);
}

/** The line numbers drawn fully inside the log's view. */
const visibleLines = page => page.locator(".log").evaluate(log => {
  const box = log.getBoundingClientRect();
  return [...log.querySelectorAll(".line")].filter(line => {
    const r = line.getBoundingClientRect();
    return r.top >= box.top - 0.5 && r.bottom <= box.bottom + 0.5;
  }).map(line => Number(line.id.slice(1)));
});
const count = async page => Number((/^[\d,]+/.exec(await page.locator(".log-viewer .count").innerText()) || ["0"])[0].replace(/,/g, ""));

/** The downloaded log of the page's attempt. */
async function downloadOf(page) {
  const [download] = await Promise.all([page.waitForEvent("download"), page.getByRole("link", { name: "Download full log" }).click()]);
  return readFileSync(await download.path());
}

/** Serious or critical axe violations of `selector` (the whole page by default). */
async function axeSerious(page, selector = null, rules = null) {
  await page.addScriptTag({ content: AXE });
  const result = await page.evaluate(async ([sel, only]) => await window.axe.run(sel ? document.querySelector(sel) : document,
    { resultTypes: ["violations"], ...(only ? { runOnly: { type: "rule", values: only } } : {}) }), [selector, rules]);
  return result.violations.filter(v => v.impact === "serious" || v.impact === "critical")
    .map(v => `${v.id}: ${v.help} (${v.nodes.slice(0, 3).map(n => n.target.join(" ") + " " + (n.failureSummary || "")).join("; ")})`);
}

test("a 2,000,000-line log: End shows the last line, #L1999990 shows that line highlighted, and keys, wheel, the scrollbar and search reach their lines", async () => {
  const inst = await finishedTask("ui-logs-huge", "count", HUGE_GUARD);
  const page = await open(`/instances/${inst.id}`);
  await page.locator(".log-viewer .count", { hasText: /^2,000,000 lines$/ }).waitFor({ timeout: GUARD });
  const log = page.locator(".log");
  const height = await log.evaluate(el => el.scrollHeight);
  assert.ok(height < CHROMIUM_MAX_PX, `the scroll area is ${height} px, past Chromium's ${CHROMIUM_MAX_PX}`);
  // End, from the keyboard, shows the very last line.
  await log.focus();
  await page.keyboard.press("End");
  await page.locator("#L2000000 .text", { hasText: /^2000000$/ }).waitFor({ timeout: GUARD });
  await until("line 2,000,000 in view", async () => (await visibleLines(page)).includes(2_000_000));
  await shot(page, "logs-huge-end");
  // Page up moves one view up: the lines just above, none skipped.
  const before = await visibleLines(page);
  await page.keyboard.press("PageUp");
  await until("a page up", async () => { const now = await visibleLines(page); return now.length && now[0] < before[0]; });
  const paged = await visibleLines(page);
  assert.ok(paged.at(-1) >= before[0] - 1, `page up skipped lines: ${before[0]}… was shown, then …${paged.at(-1)}`);
  assert.ok(before[0] - paged[0] >= before.length - 3, `page up moved only ${before[0] - paged[0]} lines`);
  await page.locator(`#L${paged[0]} .text`, { hasText: new RegExp(`^${paged[0]}$`) }).waitFor({ timeout: GUARD });
  // The wheel moves by its own amount (20 px a line), not the scaled scroll area's.
  await log.hover();
  const top = (await visibleLines(page))[0];
  await page.mouse.wheel(0, 200);
  await until("the wheel to move 10 lines", async () => (await visibleLines(page))[0] === top + 10);
  // Dragging the scrollbar to the middle lands in the middle of the log.
  await log.evaluate(el => { el.scrollTop = (el.scrollHeight - el.clientHeight) / 2; });
  await until("the middle of the log", async () => { const now = await visibleLines(page); return now.length && Math.abs(now[0] - 1_000_000) < 1000; });
  const middle = (await visibleLines(page))[5];
  await page.locator(`#L${middle} .text`, { hasText: new RegExp(`^${middle}$`) }).waitFor({ timeout: GUARD });
  await shot(page, "logs-huge-middle");
  // A search hit far down opens its line, highlighted.
  await page.getByRole("searchbox", { name: "Search this log" }).fill("1999999");
  await page.getByRole("button", { name: "Search", exact: true }).click();
  await page.getByRole("link", { name: "line 1999999", exact: true }).click();
  const hit = page.locator("#L1999999");
  await hit.locator(".text", { hasText: /^1999999$/ }).waitFor({ timeout: GUARD });
  assert.match(await hit.getAttribute("class"), /\bhl\b/);
  assert.ok((await visibleLines(page)).includes(1_999_999), "the search hit is not in view");
  await close(page);

  // A cold #L link past where the scroll area used to end.
  const linked = await open(`/instances/${inst.id}#L1999990`);
  const target = linked.locator("#L1999990");
  await target.locator(".text", { hasText: /^1999990$/ }).waitFor({ timeout: GUARD });
  assert.match(await target.getAttribute("class"), /\bhl\b/);
  assert.ok((await visibleLines(linked)).includes(1_999_990), "line 1,999,990 is not in view");
  // Its line number is a link to itself; the page holds only a window of lines.
  assert.equal(await target.locator("a.ln").getAttribute("href"), "#L1999990");
  assert.ok(await linked.locator(".log .line").count() < 400);
  await shot(linked, "logs-huge-L1999990");
  // The arrow keys move 40 px (two lines) at a time here too.
  const firstShown = (await visibleLines(linked))[0];
  await linked.locator(".log").focus();
  await linked.keyboard.press("ArrowUp");
  await linked.keyboard.press("ArrowUp");
  await until("four lines up", async () => (await visibleLines(linked))[0] === firstShown - 4);
  await close(linked);
});

test("a 200 KiB line stays one line, shown whole on demand, and downloads byte for byte; a line past 1 MiB is cut there, as documented", async () => {
  const inst = await finishedTask("ui-logs-long", "print");
  const pattern = (unit, n) => unit.repeat(Math.ceil(n / unit.length)).slice(0, n);
  const long = pattern("0123456789abcdef", 204_800);
  const longer = pattern("ghijklmnopqrstuv", 1_200_000);
  const printed = `start\n${long}\n${longer}\nend\n`;
  const page = await open(`/instances/${inst.id}`);
  // Five lines: the 1,200,000-byte one is two, cut at ax-worker's 1 MiB limit.
  await page.locator(".log-viewer .count", { hasText: /^5 lines$/ }).waitFor({ timeout: GUARD });
  const line2 = page.locator("#L2");
  await line2.getByRole("button", { name: "… show all 204,800 characters" }).waitFor({ timeout: GUARD });
  assert.equal((await line2.locator(".text").evaluate(el => el.firstChild.textContent)).length, 2000, "the view shows the line's start");
  await line2.getByRole("button", { name: /show all/ }).click();
  const dialog = page.getByRole("dialog", { name: "Line 2" });
  await dialog.waitFor({ timeout: GUARD });
  assert.equal(await dialog.locator("pre").evaluate(el => el.textContent), long, "the whole line, as printed");
  await shot(page, "logs-long-line");
  await dialog.getByRole("button", { name: "Close" }).click();
  await page.locator("#L3").getByRole("button", { name: `… show all ${MAX_LINE_BYTES.toLocaleString("en-US")} characters` }).waitFor({ timeout: GUARD });
  await page.locator("#L4").getByRole("button", { name: `… show all ${(1_200_000 - MAX_LINE_BYTES).toLocaleString("en-US")} characters` }).waitFor({ timeout: GUARD });
  // The download: what the task printed, byte for byte, but for the newline at the documented cut.
  const file = await downloadOf(page);
  const cut = `start\n${long}\n${longer.slice(0, MAX_LINE_BYTES)}\n${longer.slice(MAX_LINE_BYTES)}\nend\n`;
  const sha = b => createHash("sha256").update(b).digest("hex");
  assert.equal(sha(file), sha(Buffer.from(cut)), `the download (${file.length} bytes) is not the printed log cut at 1 MiB (${cut.length} bytes)`);
  const upToLimit = Buffer.from(`start\n${long}\n`);
  assert.ok(file.subarray(0, upToLimit.length).equals(upToLimit), "the lines within the limit differ from what was printed");
  assert.equal(file.length, Buffer.byteLength(printed) + 1, "one newline more than printed: the cut");
  await close(page);
});

test("the attempts table follows the tail: its line count matches the log while the attempt runs, its state and end when it ends", async () => {
  const run = await trigger("ui-logs-tail");
  const inst = await instanceOf(run.id, "ticker");
  await until("the ticker to run", async () => (await api(`/api/v1/instances/${inst.id}`)).state === "INSTANCE_STATE_RUNNING");
  const page = await open(`/instances/${inst.id}`);
  const attempts = page.locator("main table").first();
  await attempts.locator("thead th", { hasText: "Lines" }).waitFor({ timeout: GUARD });
  const headers = await attempts.locator("thead th").allInnerTexts();
  const cell = name => attempts.locator("tbody tr").first().locator("td").nth(headers.indexOf(name));
  const cellNumber = async name => Number((await cell(name).innerText()).replace(/,/g, ""));
  await page.locator(".log .text", { hasText: /^tick 5$/ }).waitFor({ timeout: GUARD });
  // While it runs, at several points, the table says what the log shows (never the count it
  // had when the page loaded).
  const seen = [];
  for (const at of [15, 30, 45]) {
    await page.locator(".log .text", { hasText: new RegExp(`^tick ${at}$`) }).waitFor({ timeout: GUARD });
    const [lines, shown] = await until(`the table to count the log's lines (tick ${at})`, async () => {
      const c = await count(page), n = await cellNumber("Lines");
      return c === n && c >= 5 + at && [c, n];
    });
    assert.equal(lines, shown);
    seen.push(lines);
    if (at === 30) await shot(page, "logs-attempts-live");
  }
  assert.ok(seen[2] > seen[0], `the table's count did not move: ${seen}`);
  assert.match(await cell("State").innerText(), /RUNNING/);
  assert.equal(await cell("Finished").innerText(), "–");
  // At the end: its state, its finish time and every line, without a reload.
  await page.locator("main h1").getByText("SUCCESS").waitFor({ timeout: GUARD });
  await until("the table's state to say SUCCESS", async () => /SUCCESS/.test(await cell("State").innerText()));
  await until("the table's finish time", async () => (await cell("Finished").innerText()) !== "–");
  await until("the table to count 65 lines", async () => (await cellNumber("Lines")) === 65);
  assert.equal(await count(page), 65);
  await shot(page, "logs-attempts-ended");
  await close(page);
});

test("escape sequences: window titles dropped whole, \\r overwrites as in a terminal, chosen colour pairs kept readable in both themes; the download stays raw", async () => {
  const inst = await finishedTask("ui-logs-ansi", "paint");
  for (const theme of ["light", "dark"]) {
    const page = await open(`/instances/${inst.id}`, { theme, bypassCSP: true });
    await page.locator(".log-viewer .count", { hasText: /^7 lines$/ }).waitFor({ timeout: GUARD });
    const text = n => page.locator(`#L${n} .text`).innerText();
    await page.locator("#L7 .text", { hasText: "done" }).waitFor({ timeout: GUARD });
    assert.equal(await text(1), "after the title", "an OSC title ended by BEL");
    assert.equal(await text(2), "after the ST title", "an OSC title ended by ST");
    assert.equal(await text(3), "progress 100%", "text after the last \\r overwrites from column 0");
    assert.equal(await text(4), "XYcdef", "a \\r overwrites only as far as the new text goes");
    assert.equal(await text(5), " white on red  and plain");
    assert.equal(await text(7), "done", "\\r then erase-line");
    // Bright white on red stays light text on a red background.
    const colours = await page.locator("#L5 .text span").first().evaluate(el => {
      const s = getComputedStyle(el);
      const rgb = c => c.match(/\d+/g).slice(0, 3).map(Number);
      return { fg: rgb(s.color), bg: rgb(s.backgroundColor), text: el.textContent };
    });
    assert.equal(colours.text, " white on red ");
    assert.ok(colours.fg.every(v => v >= 230), `${theme}: white on red drew its text in rgb(${colours.fg})`);
    assert.ok(colours.bg[0] > 150 && colours.bg[1] < 80 && colours.bg[2] < 80, `${theme}: white on red drew its background in rgb(${colours.bg})`);
    await shot(page, `logs-ansi-${theme}`);
    // Every chosen pair reads (axe's contrast rule on the log), and the page has no serious
    // violation at all.
    assert.deepEqual(await axeSerious(page, ".log", ["color-contrast"]), [], `${theme}: colour contrast in the log`);
    assert.deepEqual(await axeSerious(page), [], `${theme}: the task page`);
    if (theme === "light") {
      const file = await downloadOf(page);
      const raw = "\x1b]0;window-title\x07after the title\n" + "\x1b]0;t\x1b\\after the ST title\n"
        + "progress 10%\rprogress 50%\rprogress 100%\n" + "abcdef\rXY\n"
        + "\x1b[41;97m white on red \x1b[0m and plain\n"
        + "\x1b[42;30m black on green \x1b[0m \x1b[44;97m white on blue \x1b[0m \x1b[43;30m black on yellow \x1b[0m \x1b[47;30m black on white \x1b[0m \x1b[41m default on red \x1b[0m\n"
        + "downloading 50%\r\x1b[Kdone\n";
      assert.equal(file.toString("utf8"), raw, "the download is what the task printed, escapes and \\r included");
    }
    await close(page);
  }
});
