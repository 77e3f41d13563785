// Cross-site attacks on a node, made by real pages in Chromium (run by
// integration-tests/tests/security/cross_site.rs, which reads the store afterwards).
//
// AX_UI_URL is the node; AX_UI_TOKEN an admin's token when the node asks for tokens (empty for
// the loopback default); AX_GRPC_APPLY and AX_GRPC_TRIGGER are gRPC-framed ApplyWorkflow and
// TriggerWorkflow requests (hex). An attacker's server on another port of 127.0.0.1 serves a
// page that, opened as http://127.0.0.1:PORT and as http://localhost:PORT in the admin's
// browser, tries no-cors fetches with the gRPC framing, forms, a beacon, JSON requests and an
// event stream. A DNS-rebinding page (the attacker's name resolving to 127.0.0.1, its first
// answer served by the attacker) tries the same as same-origin requests and reads the answers.
// Last, the node's own page triggers a run, which must still work.
//
// Chromium's own defences against pages reaching loopback (Local/Private Network Access) are
// turned off: these checks are about what the node refuses, whatever browser a user has.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { chromium } from "playwright-core";

const NODE = process.env.AX_UI_URL;
const TOKEN = process.env.AX_UI_TOKEN || "";
const SHOTS = process.env.AX_UI_SHOTS;
const APPLY = process.env.AX_GRPC_APPLY;
const TRIGGER = process.env.AX_GRPC_TRIGGER;
if (!NODE || !SHOTS || !APPLY || !TRIGGER) throw new Error("AX_UI_URL, AX_UI_SHOTS, AX_GRPC_APPLY and AX_GRPC_TRIGGER must be set");
const NODE_PORT = new URL(NODE).port;
const REBIND_HOST = "attacker.test";
/** A hang guard for waits, not a timing assertion. */
const GUARD = 30_000;

/** The attacker's page: every request a page of another origin can make the browser send. */
const ATTACK_PAGE = `<!doctype html><title>attacker</title><h1>An ordinary page</h1>
<iframe name="sink" style="width:300px;height:60px"></iframe>
<script>
const params = new URLSearchParams(location.search);
const node = params.get("node");
const bytes = hex => new Uint8Array(hex.match(/../g).map(h => parseInt(h, 16)));
const apply = bytes(params.get("apply"));
const trigger = bytes(params.get("trigger"));
const results = {};
const attempt = async (name, run) => {
  try { results[name] = await run(); } catch (err) { results[name] = "blocked: " + err.name; }
};
function submit(action, enctype, name, value) {
  const form = document.createElement("form");
  form.action = node + action; form.method = "POST"; form.enctype = enctype; form.target = "sink";
  const input = document.createElement("input");
  input.name = name; input.value = value; form.appendChild(input);
  document.body.appendChild(form); form.submit();
}
(async () => {
  const noCors = (path, body, type) => fetch(node + path, {
    method: "POST", mode: "no-cors", credentials: "include", headers: { "Content-Type": type }, body,
  }).then(r => "sent (" + r.type + ")");
  await attempt("grpc apply, no-cors text/plain", () => noCors("/ax.v1.ControlService/ApplyWorkflow", apply, "text/plain"));
  await attempt("grpc trigger, no-cors text/plain", () => noCors("/ax.v1.ControlService/TriggerWorkflow", trigger, "text/plain"));
  await attempt("api trigger, no-cors text/plain", () => noCors("/api/v1/workflows/victim/trigger", "{}", "text/plain"));
  await attempt("api trigger, no-cors form", () => noCors("/api/v1/workflows/victim/trigger", "a=b", "application/x-www-form-urlencoded"));
  await attempt("grpc trigger, beacon", async () => navigator.sendBeacon(node + "/ax.v1.ControlService/TriggerWorkflow", new Blob([trigger], { type: "text/plain" })) ? "queued" : "refused");
  await attempt("api trigger, cors json", () => fetch(node + "/api/v1/workflows/victim/trigger", {
    method: "POST", credentials: "include", headers: { "Content-Type": "application/json" }, body: "{}",
  }).then(r => "answered " + r.status));
  await attempt("api read, cors", () => fetch(node + "/api/v1/workflows", { credentials: "include" }).then(r => "answered " + r.status));
  await attempt("grpc trigger, cors application/grpc", () => fetch(node + "/ax.v1.ControlService/TriggerWorkflow", {
    method: "POST", credentials: "include", headers: { "Content-Type": "application/grpc" }, body: trigger,
  }).then(r => "answered " + r.status));
  await attempt("event stream", () => new Promise(resolve => {
    const source = new EventSource(node + "/api/v1/runs/1/events", { withCredentials: true });
    source.onmessage = () => { source.close(); resolve("read an event"); };
    source.onerror = () => { source.close(); resolve("blocked: error"); };
    setTimeout(() => { source.close(); resolve("blocked: nothing within 3 s"); }, 3000);
  }));
  submit("/api/v1/workflows/victim/trigger", "text/plain", '{"a":"', '"}');
  submit("/ax.v1.ControlService/TriggerWorkflow", "text/plain", "x", "y");
  submit("/api/v1/workflows/victim/pause", "application/x-www-form-urlencoded", "reason", "x");
  // The forms' requests are on their way once the frame starts loading; give them a moment.
  await new Promise(r => setTimeout(r, 1500));
  results.forms = "submitted";
  window.attackResults = results;
  const shown = document.createElement("pre");
  shown.textContent = JSON.stringify(results, null, 2);
  document.body.appendChild(shown);
  document.title = "done";
})();
</script>`;

/** The rebinding page: served as http://attacker.test:NODE_PORT/, so the node is same-origin. */
const REBIND_PAGE = `<!doctype html><title>rebinding</title><h1>Same origin, another name</h1><script>
const bytes = hex => new Uint8Array(hex.match(/../g).map(h => parseInt(h, 16)));
const results = {};
(async () => {
  const call = async (name, path, options) => {
    try {
      const r = await fetch(path, options);
      const grpc = r.headers.get("grpc-status");
      const text = grpc === null ? await r.text() : decodeURIComponent(r.headers.get("grpc-message") || "");
      results[name] = { status: r.status, grpc, text };
    } catch (err) { results[name] = { status: 0, text: "blocked: " + err.name }; }
  };
  await call("read workflows", "/api/v1/workflows", {});
  await call("grpc apply", "/ax.v1.ControlService/ApplyWorkflow", {
    method: "POST", headers: { "Content-Type": "application/grpc", "te": "trailers" }, body: bytes("${APPLY}"),
  });
  await call("api trigger", "/api/v1/workflows/victim/trigger", {
    method: "POST", headers: { "Content-Type": "application/json", "x-ax-request": "1" }, body: "{}",
  });
  await call("page", "/", {});
  window.rebindResults = results;
  const shown = document.createElement("pre");
  shown.style.whiteSpace = "pre-wrap";
  shown.textContent = JSON.stringify(results, null, 2);
  document.body.appendChild(shown);
  document.title = "done";
})();
</script>`;

let browser;
let attacker;
let attackerPort;
before(async () => {
  browser = await chromium.launch({
    executablePath: process.env.AX_CHROMIUM || "/usr/bin/chromium",
    args: [
      "--no-sandbox",
      `--host-resolver-rules=MAP ${REBIND_HOST} 127.0.0.1`,
      "--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessSendPreflights,PrivateNetworkAccessRespectPreflightResults,BlockInsecurePrivateNetworkRequests",
    ],
  });
  attacker = createServer((request, response) => {
    response.writeHead(200, { "content-type": "text/html" });
    response.end(ATTACK_PAGE);
  });
  await new Promise(resolve => attacker.listen(0, "127.0.0.1", resolve));
  attackerPort = attacker.address().port;
});
after(async () => {
  await browser?.close();
  await new Promise(resolve => attacker?.close(resolve));
});

async function signedInContext() {
  const context = await browser.newContext({ viewport: { width: 1200, height: 700 }, locale: "en-US", timezoneId: "UTC" });
  const page = await context.newPage();
  await page.goto(NODE + "/");
  if (TOKEN) {
    await page.getByRole("heading", { name: "Sign in" }).waitFor({ timeout: GUARD });
    await page.fill("#token", TOKEN);
    await page.getByRole("button", { name: "Sign in" }).click();
    await page.getByRole("link", { name: "victim" }).waitFor({ timeout: GUARD });
    assert.equal((await context.cookies()).filter(c => c.name === "ax_session").length, 1);
  } else {
    await page.getByRole("link", { name: "victim" }).waitFor({ timeout: GUARD });
  }
  return { context, page };
}

async function runsNow(page) {
  // Read through the node's own page, as the UI does.
  return page.evaluate(async () => {
    const response = await fetch("/api/v1/runs", { headers: { "x-ax-request": "1" } });
    const body = await response.json();
    return (body.runs || []).length;
  });
}

for (const host of ["127.0.0.1", "localhost"]) {
  test(`a page on http://${host}:<another port> cannot act on the node`, async () => {
    const { context, page } = await signedInContext();
    const attack = await context.newPage();
    const url = `http://${host}:${attackerPort}/?node=${encodeURIComponent(NODE)}&apply=${APPLY}&trigger=${TRIGGER}`;
    await attack.goto(url);
    await attack.waitForFunction(() => document.title === "done", null, { timeout: GUARD });
    const results = await attack.evaluate(() => window.attackResults);
    await attack.screenshot({ path: `${SHOTS}/attack-from-${host}.png` });
    // What the page could read: nothing of the node's answers.
    for (const name of ["api trigger, cors json", "api read, cors", "grpc trigger, cors application/grpc"]) {
      assert.match(results[name], /^blocked/, `${name}: ${results[name]}`);
    }
    assert.match(results["event stream"], /^blocked/, results["event stream"]);
    assert.equal(await runsNow(page), 0, "no run was triggered: " + JSON.stringify(results));
    const workflows = await page.evaluate(async () => (await (await fetch("/api/v1/workflows", { headers: { "x-ax-request": "1" } })).json()).workflows.map(w => w.name));
    assert.deepEqual(workflows, ["victim"], "nothing was applied");
    await context.close();
  });
}

test("a rebinding page (the node under the attacker's name) is refused and reads nothing", async () => {
  const { context } = await signedInContext();
  const page = await context.newPage();
  const origin = `http://${REBIND_HOST}:${NODE_PORT}`;
  // The first DNS answer: the attacker's server gives the page; later requests reach the node.
  await page.route(origin + "/rebind", route => route.fulfill({ contentType: "text/html", body: REBIND_PAGE }));
  await page.goto(origin + "/rebind");
  await page.waitForFunction(() => document.title === "done", null, { timeout: GUARD });
  const results = await page.evaluate(() => window.rebindResults);
  await page.screenshot({ path: `${SHOTS}/rebinding.png` });
  for (const [name, answer] of Object.entries(results)) {
    if (name === "grpc apply") {
      // A gRPC refusal: HTTP 200 with grpc-status 7 (PermissionDenied).
      assert.equal(answer.grpc, "7", `${name}: ${JSON.stringify(answer)}`);
    } else {
      assert.equal(answer.status, 403, `${name}: ${JSON.stringify(answer)}`);
    }
    assert.match(answer.text, /--public-url/, `${name} names the setting`);
    assert.doesNotMatch(answer.text, /victim/, `${name} reads nothing of the node`);
  }
  await context.close();
});

test("the node's own page still triggers a run", async () => {
  const { context, page } = await signedInContext();
  await page.goto(NODE + "/workflows/victim/trigger");
  await page.getByRole("button", { name: "Trigger victim" }).click();
  await page.waitForURL(/\/runs\/\d+$/, { timeout: GUARD });
  await page.locator("main").getByText("victim").first().waitFor({ timeout: GUARD });
  await page.screenshot({ path: `${SHOTS}/own-page-trigger.png` });
  assert.equal(await runsNow(page), 1);
  await context.close();
});
