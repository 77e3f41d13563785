// Signing in to the web UI of a node that asks for tokens (web_ui.rs sets AX_UI_URL,
// AX_UI_TOKEN, a viewer's token, and AX_UI_SHOTS). A wrong token is refused on the form; the
// right one opens the pages, is kept only as a session cookie the page's scripts cannot read,
// and signing out forgets it.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

const BASE = process.env.AX_UI_URL;
const TOKEN = process.env.AX_UI_TOKEN;
const SHOTS = process.env.AX_UI_SHOTS;
if (!BASE || !TOKEN || !SHOTS) throw new Error("AX_UI_URL, AX_UI_TOKEN and AX_UI_SHOTS must be set");
const GUARD = 30_000;

let browser;
before(async () => {
  browser = await chromium.launch({ executablePath: process.env.AX_CHROMIUM || "/usr/bin/chromium", args: ["--no-sandbox"] });
});
after(async () => { await browser?.close(); });

test("a token signs in for the browser session, and signing out forgets it", async () => {
  const context = await browser.newContext({ viewport: { width: 1200, height: 700 }, locale: "en-US", timezoneId: "UTC" });
  const page = await context.newPage();
  const problems = [];
  page.on("pageerror", err => problems.push(err.message));
  await page.goto(BASE + "/");
  await page.getByRole("heading", { name: "Sign in" }).waitFor({ timeout: GUARD });
  assert.match(await page.locator("main").innerText(), /This scheduler asks for a token/);
  await page.screenshot({ path: `${SHOTS}/sign-in.png` });

  await page.fill("#token", "axt_wrong");
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("alert").filter({ hasText: "not valid" }).waitFor({ timeout: GUARD });
  assert.equal((await context.cookies()).filter(c => c.name === "ax_session").length, 0);

  await page.fill("#token", TOKEN);
  await page.getByRole("button", { name: "Sign in" }).click();
  await page.getByRole("link", { name: "signed-in-wf" }).waitFor({ timeout: GUARD });
  assert.equal(await page.locator("#who").innerText(), "ui-viewer (viewer)");
  const [cookie] = (await context.cookies()).filter(c => c.name === "ax_session");
  assert.ok(cookie, "the session cookie is set");
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.sameSite, "Strict");
  assert.equal(cookie.expires, -1, "a session cookie: gone when the browser session ends");
  assert.equal(await page.evaluate(() => document.cookie.includes("ax_session")), false);
  await page.screenshot({ path: `${SHOTS}/signed-in.png` });

  // A deep link opens cold with the cookie alone.
  await page.goto(BASE + "/workflows/signed-in-wf");
  await page.getByRole("heading", { name: "signed-in-wf" }).waitFor({ timeout: GUARD });

  await page.getByRole("button", { name: "Sign out" }).click();
  await page.getByRole("heading", { name: "Sign in" }).waitFor({ timeout: GUARD });
  assert.equal((await context.cookies()).filter(c => c.name === "ax_session").length, 0);
  assert.equal(await page.locator("#sign-out").isHidden(), true);
  assert.deepEqual(problems, []);
  await context.close();
});
