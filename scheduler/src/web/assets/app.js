// The ax web UI: one page that routes itself, reading the node's JSON API (/api/v1) and its
// Server-Sent Events. Names, params and task output are data, never markup: every value
// reaches the page through text nodes (h() below), nothing through innerHTML.

"use strict";

// ---------- elements ----------

/** An element: attributes (on* are listeners, class/text/style are special) and children;
 *  strings and numbers become text nodes. */
function h(tag, attrs, ...children) {
  const svg = SVG_TAGS.has(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.setAttribute("class", value);
    else if (key === "text") el.textContent = value;
    else if (key === "style") Object.assign(el.style, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}
// Links inside the graph are made with svgLink(); an <a> from h() is always HTML.
const SVG_TAGS = new Set(["svg", "g", "rect", "path", "text", "title"]);

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

function svgLink(href, attrs, ...children) {
  const a = document.createElementNS("http://www.w3.org/2000/svg", "a");
  a.setAttribute("href", href);
  for (const [k, v] of Object.entries(attrs)) a.setAttribute(k, v);
  append(a, children);
  return a;
}

const link = (href, ...children) => h("a", { href }, ...children);
const num = n => Number(n || 0).toLocaleString("en-US");
const main = () => document.getElementById("main");

function announce(text) {
  const el = document.getElementById("announce");
  el.textContent = "";
  setTimeout(() => { el.textContent = text; }, 50);
}

// ---------- preferences: time zone, theme ----------

const prefs = {
  get utc() { return localStorage.getItem("ax.utc") === "1"; },
  set utc(on) { localStorage.setItem("ax.utc", on ? "1" : "0"); },
  get theme() { return localStorage.getItem("ax.theme") || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"); },
  set theme(t) { localStorage.setItem("ax.theme", t); },
};

function showPrefs() {
  const zone = document.getElementById("zone-toggle");
  const localZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  zone.textContent = prefs.utc ? "Times in UTC" : "Times in " + localZone;
  zone.setAttribute("aria-pressed", String(prefs.utc));
  zone.title = prefs.utc ? "Show times in " + localZone : "Show times in UTC";
  const theme = document.getElementById("theme-toggle");
  document.documentElement.dataset.theme = prefs.theme;
  theme.textContent = prefs.theme === "dark" ? "Dark theme" : "Light theme";
  theme.setAttribute("aria-pressed", String(prefs.theme === "dark"));
}

/** A stored time (ms since the epoch, as a string or number) in the chosen zone. */
function fmtTime(ms) {
  const n = Number(ms || 0);
  if (!n) return "–";
  const options = { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" };
  if (prefs.utc) options.timeZone = "UTC";
  return new Intl.DateTimeFormat("en-CA", options).format(new Date(n)).replace(",", "");
}

function time(ms) {
  const n = Number(ms || 0);
  return n ? h("time", { datetime: new Date(n).toISOString(), class: "t" }, fmtTime(n)) : "–";
}

function fmtDuration(ms) {
  const n = Math.max(0, Math.round(Number(ms)));
  if (n < 1000) return n + " ms";
  const s = n / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
  const m = Math.floor(s / 60), rest = Math.round(s % 60);
  if (m < 60) return m + " min " + rest + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

function since(ms) {
  const n = Number(ms || 0);
  return n ? fmtDuration(Date.now() - n) + " ago" : "never";
}

// ---------- states ----------

// Each state has a name in text, a glyph and a colour (a palette told apart with the common
// colour-vision deficiencies; failed and upstream-failed also differ in glyph and border).
const STATES = {
  SUCCESS: "✓", FAILED: "✕", UPSTREAM_FAILED: "⊘", SKIPPED: "↷", TIMEOUT: "⏱", RUNNING: "▶", DISPATCHED: "↗",
  WAITING: "…", PENDING: "○", CANCELLED: "■", QUEUED: "≡", LIVE: "●", DEAD: "✕", DRAINING: "◐", PAUSED: "⏸",
  DEADLINE_MISSED: "!",
};

/** "RUN_STATE_FAILED", "failed", "upstream_failed" → "FAILED", "UPSTREAM_FAILED". */
function stateName(raw) {
  return String(raw || "").replace(/^(RUN_STATE|INSTANCE_STATE|WORKER_STATE)_/, "").toUpperCase() || "UNKNOWN";
}

function chip(raw) {
  const name = stateName(raw);
  return h("span", { class: "state s-" + name.toLowerCase() },
    h("span", { class: "glyph", "aria-hidden": "true" }, STATES[name] || "?"), " ", name);
}

const TERMINAL_RUN = new Set(["SUCCESS", "FAILED", "CANCELLED"]);
const TERMINAL_INSTANCE = new Set(["SUCCESS", "FAILED", "TIMEOUT", "CANCELLED"]);

// ---------- the API ----------

class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

let offlineSince = 0;
function setOffline(on, detail) {
  const banner = document.getElementById("offline");
  if (on) {
    offlineSince = offlineSince || Date.now();
    banner.textContent = "The scheduler cannot be reached" + (detail ? " (" + detail + ")" : "") + "; retrying.";
    banner.hidden = false;
  } else if (offlineSince) {
    offlineSince = 0;
    banner.hidden = true;
    announce("The scheduler is reachable again.");
  }
}

/** JSON from the API. A network failure (or a proxy's 502/503/504) shows the banner and
 *  retries until the node answers; an answer of the API's own is returned or thrown. */
async function api(path, options = {}) {
  for (let wait = 1000; ; wait = Math.min(wait * 2, 10000)) {
    let response;
    try {
      // The header marks the page's own requests: a page of another origin cannot send it
      // without a preflight, which the node never grants.
      response = await fetch(path, { ...options, headers: { ...(options.headers || {}), "x-ax-request": "1" } });
    } catch (err) {
      setOffline(true, err.message);
      await sleep(wait);
      continue;
    }
    const type = response.headers.get("content-type") || "";
    if (!type.includes("application/json")) {
      if ([502, 503, 504].includes(response.status)) { setOffline(true, "HTTP " + response.status); await sleep(wait); continue; }
      setOffline(false);
      if (!response.ok) throw new ApiError(response.status, "", response.statusText || "HTTP " + response.status);
      return response;
    }
    const body = await response.json();
    setOffline(false);
    if (!response.ok) throw new ApiError(response.status, body.code, body.message || response.statusText);
    return body;
  }
}

function post(path, body) {
  return api(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body || {}) });
}

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
const enc = encodeURIComponent;

// ---------- live data: only while the page is shown ----------

/** Runs `start` while the page is visible and the view is current; `start` returns a stop
 *  function. A hidden page costs the scheduler nothing: its streams and timers are closed. */
function whileVisible(view, start) {
  let stop = null;
  const sync = () => {
    const want = document.visibilityState === "visible" && !view.left;
    if (want && !stop) stop = start() || (() => {});
    else if (!want && stop) { stop(); stop = null; }
  };
  document.addEventListener("visibilitychange", sync);
  view.onLeave(() => { document.removeEventListener("visibilitychange", sync); if (stop) stop(); stop = null; });
  sync();
}

/** Refreshes every `ms` while visible (and once on becoming visible). */
function poll(view, ms, refresh) {
  whileVisible(view, () => {
    let timer = null, stopped = false;
    const tick = async () => {
      try { await refresh(); } catch (err) { if (!(err instanceof ApiError)) throw err; }
      if (!stopped) timer = setTimeout(tick, ms);
    };
    tick();
    return () => { stopped = true; clearTimeout(timer); };
  });
}

/** An SSE stream with `handlers` by event name; it resumes from the last event id by itself.
 *  When streaming fails repeatedly (a proxy that buffers, say) it falls back to `fallback`,
 *  a polling refresh. Returns a stop function. */
function stream(url, handlers, fallback) {
  let source = null, failures = 0, pollTimer = null, stopped = false;
  const open = () => {
    source = new EventSource(url);
    source.addEventListener("open", () => { failures = 0; setOffline(false); });
    for (const [name, handle] of Object.entries(handlers)) {
      source.addEventListener(name, event => {
        if (name === "end") { source.close(); }
        handle(event.data ? JSON.parse(event.data) : {}, event);
      });
    }
    source.onerror = () => {
      if (stopped) return;
      failures += 1;
      if (failures >= 3 && fallback) {
        source.close();
        setOffline(true, "live updates interrupted");
        const tick = async () => {
          try { const more = await fallback(); setOffline(false); if (more === false) return; } catch (_) { /* retried */ }
          if (!stopped) pollTimer = setTimeout(tick, 2000);
        };
        tick();
      }
    };
  };
  open();
  return () => { stopped = true; if (source) source.close(); clearTimeout(pollTimer); };
}

// ---------- routing ----------

const ROUTES = [
  [/^\/$/, viewWorkflows],
  [/^\/workflows\/([^/]+)$/, viewWorkflow],
  [/^\/workflows\/([^/]+)\/why$/, viewWhy],
  [/^\/workflows\/([^/]+)\/trigger$/, viewTrigger],
  [/^\/runs$/, viewRuns],
  [/^\/runs\/(\d+)$/, viewRun],
  [/^\/instances\/(\d+)$/, viewInstance],
  [/^\/workers$/, viewWorkers],
  [/^\/audit$/, viewAudit],
];

let current = null;

class View {
  constructor() { this.left = false; this.cleanups = []; }
  onLeave(fn) { this.cleanups.push(fn); }
  leave() { this.left = true; for (const fn of this.cleanups.splice(0)) { try { fn(); } catch (_) { /* best effort */ } } }
}

async function route() {
  if (current) current.leave();
  const view = current = new View();
  const path = location.pathname;
  for (const [pattern, render] of ROUTES) {
    const match = pattern.exec(path);
    if (!match) continue;
    const args = match.slice(1).map(decodeURIComponent);
    try {
      await render(view, ...args);
    } catch (err) {
      if (view.left) return;
      if (err instanceof ApiError && err.status === 404) notFound(err.message);
      else if (err instanceof ApiError && err.status === 401) {
        // A missing token is the normal first visit; anything else (a token gone stale) is said.
        signIn(err.message.startsWith("this call needs a token") ? "This scheduler asks for a token." : err.message);
      }
      else failed(err);
    }
    return;
  }
  notFound("No page at " + path);
}

/** Replaces an element's children, skipping the absent ones (null, false, undefined). */
function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

function show(title, ...children) {
  document.title = title + " · ax";
  const el = main();
  el.replaceChildren(...children.flat().filter(Boolean).map(c => c instanceof Node ? c : document.createTextNode(String(c))));
}

function notFound(message) {
  show("Not found", h("h1", {}, "Not found"), h("p", { class: "error", role: "alert" }, message),
    h("p", {}, link("/", "All workflows")));
}

function failed(err) {
  show("Error", h("h1", {}, "Something went wrong"), h("p", { class: "error", role: "alert" }, err.message || String(err)));
}

function go(path) {
  history.pushState(null, "", path);
  route().then(() => main().focus({ preventScroll: true }));
}

document.addEventListener("click", event => {
  const a = event.target.closest && event.target.closest("a");
  if (!a || event.defaultPrevented || event.button !== 0 || event.metaKey || event.ctrlKey || event.shiftKey || event.altKey) return;
  const href = a.getAttribute("href");
  if (!href || !href.startsWith("/") || href.startsWith("/api/") || a.hasAttribute("download") || a.target) return;
  event.preventDefault();
  if (href.startsWith(location.pathname + "#")) { location.hash = href.slice(href.indexOf("#")); return; }
  go(href);
});
window.addEventListener("popstate", () => route());

// ---------- confirmation ----------

/** Asks before an action; resolves true when confirmed. */
function confirmAction(title, text, verb) {
  return new Promise(resolve => {
    const dialog = h("dialog", { class: "confirm", "aria-labelledby": "confirm-title" },
      h("h2", { id: "confirm-title" }, title), h("p", {}, text),
      h("div", { class: "buttons" },
        h("button", { type: "button", class: "danger", onclick: () => { dialog.close("yes"); } }, verb),
        h("button", { type: "button", onclick: () => { dialog.close("no"); }, autofocus: true }, "Keep it")));
    dialog.addEventListener("close", () => { dialog.remove(); resolve(dialog.returnValue === "yes"); });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** A button that confirms, posts and reports. `after` gets the answer. */
function actionButton(label, question, verb, path, body, after, attrs = {}) {
  const button = h("button", Object.assign({ type: "button" }, attrs), label);
  button.addEventListener("click", async () => {
    if (!(await confirmAction(label, question, verb))) return;
    button.disabled = true;
    try {
      const answer = await post(path, body);
      announce(label + ": done.");
      if (after) await after(answer);
    } catch (err) {
      alertBox(button.parentElement, label + " failed: " + err.message);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

function alertBox(where, text) {
  const old = where.querySelector(":scope > .error");
  if (old) old.remove();
  where.append(h("p", { class: "error", role: "alert" }, text));
}

// ---------- tables ----------

function table(caption, headers, rows, attrs = {}) {
  return h("table", attrs,
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, headers.map(x => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows.map(cells => h("tr", {}, cells.map(c => h("td", {}, c))))));
}

function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

// ---------- workflows ----------

function scheduleText(schedule) {
  if (!schedule) return "manual";
  const trigger = String(schedule.trigger || "").replace("TRIGGER_KIND_", "").toLowerCase();
  if (trigger === "cron") return schedule.cron + " (" + (schedule.timezone || "UTC") + ")";
  if (trigger === "dependency") return "after " + (schedule.after || []).join(", ");
  return trigger || "manual";
}

function runStrip(runs) {
  const strip = h("span", { class: "strip" });
  for (const run of (runs || []).slice().reverse()) {
    const name = stateName(run.state);
    strip.append(h("a", { href: "/runs/" + run.id, class: "cell s-" + name.toLowerCase(), "aria-label": "run " + run.id + ": " + name, title: "run " + run.id + ": " + name + " · " + fmtTime(run.logicalTimeMs) },
      h("span", { "aria-hidden": "true" }, STATES[name] || "?")));
  }
  if (!strip.childNodes.length) strip.append("no runs yet");
  return strip;
}

function pauseButton(workflow, after) {
  const verb = workflow.paused ? "Resume" : "Pause";
  const question = workflow.paused
    ? "Resume the schedule of " + workflow.name + "? Missed slots follow its misfire policy."
    : "Pause the schedule of " + workflow.name + "? Running runs go on; no new slot fires.";
  return actionButton(verb, question, verb, "/api/v1/workflows/" + enc(workflow.name) + "/" + verb.toLowerCase(), {}, after,
    { "aria-label": verb + " " + workflow.name });
}

async function viewWorkflows(view) {
  const body = h("tbody");
  const status = h("p", { role: "status" }, "Loading workflows…");
  const filter = h("input", { type: "search", id: "wf-filter", placeholder: "Filter by name or app", "aria-label": "Filter workflows" });
  let workflows = [];
  const render = () => {
    const q = filter.value.trim().toLowerCase();
    const shown = workflows.filter(w => !q || w.name.toLowerCase().includes(q) || (w.app || "").toLowerCase().includes(q));
    body.replaceChildren(...shown.map(w => h("tr", {},
      h("td", {}, link("/workflows/" + enc(w.name), w.name)),
      h("td", {}, w.app || "–"),
      h("td", { class: "num" }, num(w.taskCount || 0)),
      h("td", {}, scheduleText(w.schedule)),
      h("td", {}, w.paused ? "paused" : time((w.nextFiresMs || [])[0])),
      h("td", {}, runStrip(w.recentRuns)),
      h("td", {}, w.paused ? chip("PAUSED") : "active", " ", pauseButton(w, refresh)),
    )));
    status.textContent = num(workflows.length) + " workflows" + (shown.length !== workflows.length ? ", " + num(shown.length) + " shown" : "");
  };
  const refresh = async () => {
    const answer = await api("/api/v1/workflows?recent=12&summary=true");
    if (view.left) return;
    workflows = answer.workflows || [];
    render();
  };
  filter.addEventListener("input", render);
  show("Workflows", h("h1", {}, "Workflows"), h("div", { class: "toolbar" }, filter), status,
    h("table", {}, h("thead", {}, h("tr", {}, ["Workflow", "App", "Tasks", "Schedule", "Next fire", "Last runs (oldest → newest)", "Schedule state"].map(x => h("th", { scope: "col" }, x)))), body));
  await refresh();
  poll(view, 10000, refresh);
}

// ---------- the DAG ----------

/** Transitive upstream and downstream of each node, from the edges. */
function reach(nodes, edges) {
  const ups = new Map(nodes.map(n => [n.task, []])), downs = new Map(nodes.map(n => [n.task, []]));
  for (const e of edges) { ups.get(e.to)?.push(e.from); downs.get(e.from)?.push(e.to); }
  const walk = (start, next) => {
    const seen = new Set(), stack = [...(next.get(start) || [])];
    while (stack.length) { const t = stack.pop(); if (seen.has(t)) continue; seen.add(t); stack.push(...(next.get(t) || [])); }
    return seen;
  };
  return { up: t => walk(t, ups), down: t => walk(t, downs) };
}

/** The laid-out graph as SVG, nodes named "task NAME: STATE" for assistive technology;
 *  hovering or focusing a node highlights what it depends on and what depends on it. */
function dagView(dag, options = {}) {
  const layout = dag.layout || {};
  const wrap = h("div", { class: "dag" });
  if (layout.omitted) {
    wrap.append(h("p", { class: "note", role: "note" }, "The graph is not drawn: " + layout.omitted));
    return { el: wrap, update() {} };
  }
  const W = layout.nodeWidth || 200, H = layout.nodeHeight || 44, pad = 16;
  const width = (layout.width || 0) + pad * 2, height = (layout.height || 0) + pad * 2;
  let zoom = 1;
  const svg = h("svg", { class: "graph", viewBox: `0 0 ${width} ${height}`, width, height, role: "group", "aria-label": "Task graph of " + dag.workflow + " (" + dag.nodes.length + " tasks)" });
  const byTask = new Map(dag.nodes.map(n => [n.task, n]));
  const edgesLayer = h("g", { class: "edges", transform: `translate(${pad},${pad})` });
  const edgeEls = [];
  for (const e of dag.edges) {
    const a = byTask.get(e.from), b = byTask.get(e.to);
    if (!a || !b) continue;
    const x1 = a.x + W / 2, y1 = a.y, x2 = b.x - W / 2, y2 = b.y, bend = Math.abs(x2 - x1) / 2;
    const p = h("path", { d: `M${x1},${y1} C${x1 + bend},${y1} ${x2 - bend},${y2} ${x2},${y2}`, "data-from": e.from, "data-to": e.to });
    edgeEls.push(p);
    edgesLayer.append(p);
  }
  const nodesLayer = h("g", { class: "nodes", transform: `translate(${pad},${pad})` });
  const nodeEls = new Map();
  const reaches = reach(dag.nodes, dag.edges);
  const label = n => "task " + n.task + (n.state ? ": " + stateName(n.state) : "") + (n.handler ? " (runs " + n.handler.replace("_", " ") + ")" : "") + (n.isolated ? " (isolated: no upstream or downstream)" : "");
  for (const n of dag.nodes) {
    const state = n.state ? stateName(n.state) : "";
    const box = h("g", { class: "node" + (state ? " s-" + state.toLowerCase() : "") + (n.isolated ? " isolated" : ""), transform: `translate(${n.x - W / 2},${n.y - H / 2})`, "data-task": n.task },
      h("rect", { width: W, height: H, rx: 6 }),
      h("text", { x: 10, y: state || n.isolated || n.handler ? 18 : 27, class: "name" }, n.task.length > 26 ? n.task.slice(0, 25) + "…" : n.task),
      h("text", { x: 10, y: 35, class: "sub" }, state ? (STATES[state] || "") + " " + state : n.handler ? n.handler : n.isolated ? "isolated" : ""),
      h("title", {}, label(n)));
    const href = n.instanceId && n.instanceId !== "0" ? "/instances/" + n.instanceId : options.taskHref ? options.taskHref(n) : null;
    const el = href ? svgLink(href, { "aria-label": label(n), class: "node-link" }, box)
      : (box.setAttribute("tabindex", "0"), box.setAttribute("role", "img"), box.setAttribute("aria-label", label(n)), box);
    const highlight = on => {
      svg.classList.toggle("focusing", on);
      const up = on ? reaches.up(n.task) : new Set(), down = on ? reaches.down(n.task) : new Set();
      for (const [task, g] of nodeEls) {
        g.classList.toggle("hl-self", on && task === n.task);
        g.classList.toggle("hl-up", up.has(task));
        g.classList.toggle("hl-down", down.has(task));
      }
      for (const p of edgeEls) {
        const f = p.dataset.from, t = p.dataset.to;
        p.classList.toggle("hl", on && ((up.has(f) || f === n.task) && (up.has(t) || t === n.task) || (down.has(t) || t === n.task) && (down.has(f) || f === n.task)));
      }
    };
    el.addEventListener("mouseenter", () => highlight(true));
    el.addEventListener("mouseleave", () => highlight(false));
    el.addEventListener("focus", () => highlight(true));
    el.addEventListener("blur", () => highlight(false));
    nodeEls.set(n.task, box);
    nodesLayer.append(el);
  }
  svg.append(edgesLayer, nodesLayer);
  const scroller = h("div", { class: "graph-scroll" }, svg);
  const setZoom = z => { zoom = Math.min(2, Math.max(0.1, z)); svg.setAttribute("width", width * zoom); svg.setAttribute("height", height * zoom); };
  // Fitting a very wide graph would shrink its names past reading: it stops at a third.
  const fit = () => setZoom(Math.max(0.33, Math.min(1, (scroller.clientWidth || 900) / width)));
  const exports = h("span", { class: "exports" }, "Export the whole graph: ",
    ["dot", "mermaid", "json", "svg"].map((f, i) => [i ? " · " : "", h("a", { href: `/api/v1/workflows/${enc(dag.workflow)}/dag/export?format=${f}&version=${dag.version}${dag.runId && dag.runId !== "0" ? "&run=" + dag.runId : ""}`, download: "" }, f.toUpperCase())]));
  wrap.append(h("div", { class: "toolbar" },
    h("button", { type: "button", onclick: () => setZoom(zoom * 1.25), "aria-label": "Zoom in" }, "+"),
    h("button", { type: "button", onclick: () => setZoom(zoom / 1.25), "aria-label": "Zoom out" }, "−"),
    h("button", { type: "button", onclick: fit }, "Fit"), exports), scroller);
  requestAnimationFrame(fit);
  return {
    el: wrap,
    /** New states for the nodes: task → {state, instanceId}. */
    update(states) {
      for (const [task, g] of nodeEls) {
        const s = states.get(task);
        if (!s) continue;
        const state = stateName(s.state);
        const n = byTask.get(task);
        n.state = state;
        g.setAttribute("class", g.getAttribute("class").replace(/\bs-[a-z_]+/g, "").trim() + " s-" + state.toLowerCase());
        g.querySelector(".sub").textContent = (STATES[state] || "") + " " + state;
        g.querySelector("title").textContent = label(n);
        const holder = g.parentNode;
        if (holder && holder.tagName.toLowerCase() === "a") holder.setAttribute("aria-label", label(n));
        else g.setAttribute("aria-label", label(n));
        if (s.instanceId && s.instanceId !== "0" && holder && holder.tagName.toLowerCase() !== "a") {
          const a = svgLink("/instances/" + s.instanceId, { "aria-label": label(n), class: "node-link" });
          holder.replaceChild(a, g);
          g.removeAttribute("tabindex"); g.removeAttribute("role"); g.removeAttribute("aria-label");
          a.append(g);
        }
      }
    },
  };
}

// ---------- a workflow ----------

async function viewWorkflow(view, name) {
  const [workflow, dag] = await Promise.all([
    api("/api/v1/workflows/" + enc(name)),
    api("/api/v1/workflows/" + enc(name) + "/dag?layout=true"),
  ]);
  if (view.left) return;
  const tasks = workflow.tasks || [];
  const isolated = new Set(dag.nodes.filter(n => n.isolated).map(n => n.task));
  const graph = dagView(dag, { taskHref: n => "#task-" + n.task });
  const taskFilter = h("input", { type: "search", placeholder: "Filter tasks", "aria-label": "Filter tasks" });
  const taskBody = h("tbody");
  const taskStatus = h("p", { role: "status" });
  const MAX_ROWS = 500;
  const renderTasks = () => {
    const q = taskFilter.value.trim().toLowerCase();
    const shown = tasks.filter(t => !q || t.name.toLowerCase().includes(q) || (t.command || "").toLowerCase().includes(q));
    taskBody.replaceChildren(...shown.slice(0, MAX_ROWS).map(t => h("tr", { id: "task-" + t.name },
      h("th", { scope: "row" }, t.name, isolated.has(t.name) && tasks.length > 1 ? h("span", { class: "flag" }, " isolated") : ""),
      h("td", {}, h("code", {}, t.command || (t.argv || []).join(" "))),
      h("td", {}, (t.upstream || []).join(", ") || "–"),
      h("td", {}, String(t.retries || 0)),
      h("td", {}, t.timeoutMs && t.timeoutMs !== "0" ? fmtDuration(t.timeoutMs) : "none"),
      h("td", {}, Object.entries(t.labels || {}).map(([k, v]) => k + "=" + v).join(", ") || "–"))));
    taskStatus.textContent = num(tasks.length) + " tasks" + (q ? ", " + num(shown.length) + " match" : "") + (shown.length > MAX_ROWS ? "; the first " + MAX_ROWS + " are listed, filter to see others" : "");
  };
  taskFilter.addEventListener("input", renderTasks);
  renderTasks();
  const isolatedNote = isolated.size && tasks.length > 1
    ? h("p", { class: "warn", role: "note" }, "Isolated tasks (no upstream, no downstream): ", [...isolated].slice(0, 20).join(", "), isolated.size > 20 ? " and " + (isolated.size - 20) + " more" : "")
    : null;
  const runs = runsTable({ workflow: name });
  const schedule = workflow.schedule || {};
  show(workflow.name,
    h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", workflow.name),
    h("h1", {}, workflow.name, " ", h("span", { class: "muted" }, "version " + workflow.version)),
    workflow.description ? h("p", {}, workflow.description) : null,
    h("div", { class: "toolbar" },
      link("/workflows/" + enc(name) + "/trigger", "Trigger a run"), " ",
      link("/workflows/" + enc(name) + "/why", "Why did it (not) run?"), " ",
      pauseButton(workflow, () => route())),
    kv([["App", workflow.app || "–"], ["Owner", workflow.owner || "–"], ["Schedule", scheduleText(schedule)],
      ["Schedule state", workflow.paused ? "paused" : "active"],
      ["Next fires", (workflow.nextFiresMs || []).length ? h("ul", { class: "plain" }, workflow.nextFiresMs.map(t => h("li", {}, time(t)))) : "none"],
      ["Updated", time(workflow.updatedAtMs)]]),
    h("h2", {}, "Graph"), isolatedNote, graph.el,
    h("h2", {}, "Tasks"), h("div", { class: "toolbar" }, taskFilter), taskStatus,
    h("table", {}, h("thead", {}, h("tr", {}, ["Task", "Command", "Upstream", "Retries", "Timeout", "Labels"].map(x => h("th", { scope: "col" }, x)))), taskBody),
    h("h2", {}, "Runs"), runs.el);
  await runs.load();
}

/** A paged table of runs, newest first (paging by id: a page deep in a million runs costs
 *  what the first does). */
function runsTable(filter) {
  const body = h("tbody");
  const status = h("p", { role: "status" });
  const older = h("button", { type: "button", hidden: true }, "Older runs");
  const stateSelect = h("select", { "aria-label": "Run state" },
    ["", "running", "queued", "success", "failed", "cancelled"].map(s => h("option", { value: s }, s || "any state")));
  let before = "0", shown = 0;
  const load = async (more) => {
    if (!more) { before = "0"; shown = 0; body.replaceChildren(); }
    const q = new URLSearchParams({ limit: "50" });
    if (filter.workflow) q.set("workflow", filter.workflow);
    if (stateSelect.value) q.set("state", stateSelect.value);
    if (before !== "0") q.set("before", before);
    const answer = await api("/api/v1/runs?" + q);
    for (const run of answer.runs || []) {
      const c = run.counts || {};
      body.append(h("tr", {},
        h("td", {}, link("/runs/" + run.id, "run " + run.id)),
        filter.workflow ? null : h("td", {}, link("/workflows/" + enc(run.workflow), run.workflow)),
        h("td", {}, chip(run.state), Number(run.deadlineMissedAtMs) ? [" ", chip("DEADLINE_MISSED")] : null),
        h("td", {}, String(run.trigger || "").replace("TRIGGER_KIND_", "").toLowerCase()),
        h("td", {}, time(run.logicalTimeMs)),
        h("td", {}, Number(run.finishedAtMs) ? fmtDuration(run.finishedAtMs - run.createdAtMs) : "running"),
        h("td", {}, `${c.success || 0} ok · ${(c.failed || 0) + (c.timeout || 0)} failed · ${(c.running || 0) + (c.dispatched || 0)} running` +
          (c.skipped ? ` · ${c.skipped} skipped` : "") + (c.upstreamFailed ? ` · ${c.upstreamFailed} upstream failed` : ""))));
      shown += 1;
    }
    before = answer.nextBeforeId || "0";
    older.hidden = before === "0";
    status.textContent = shown ? num(shown) + " runs shown" + (before !== "0" ? "; older runs follow" : "") : "No runs.";
  };
  older.addEventListener("click", () => load(true));
  stateSelect.addEventListener("change", () => load(false));
  const headers = ["Run", filter.workflow ? null : "Workflow", "State", "Trigger", "Logical time", "Duration", "Tasks"].filter(Boolean);
  const el = h("div", {}, h("div", { class: "toolbar" }, stateSelect), status,
    h("table", {}, h("thead", {}, h("tr", {}, headers.map(x => h("th", { scope: "col" }, x)))), body), older);
  return { el, load: () => load(false) };
}

async function viewRuns(view) {
  const runs = runsTable({});
  show("Runs", h("h1", {}, "Runs"), runs.el);
  await runs.load();
}

// ---------- a run ----------

async function viewRun(view, id) {
  const run = await api("/api/v1/runs/" + id);
  if (view.left) return;
  const dag = await api("/api/v1/workflows/" + enc(run.workflow) + "/dag?layout=true&run=" + id);
  if (view.left) return;
  const graph = dagView(dag);
  const header = h("div");
  const actions = h("div", { class: "toolbar" });
  const instancesBody = h("tbody");
  const gantt = h("div", { class: "gantt", role: "img" });
  let latest = { run, instances: { instances: [], tasks: [] } };

  const render = snapshot => {
    latest = snapshot;
    const r = snapshot.run, state = stateName(r.state);
    fill(header, 
      h("h1", {}, "Run " + r.id + " ", chip(r.state)),
      kv([["Workflow", link("/workflows/" + enc(r.workflow), r.workflow + " (version " + r.workflowVersion + ")")],
        ["Trigger", String(r.trigger || "").replace("TRIGGER_KIND_", "").toLowerCase() + (r.triggeredBy ? " by " + r.triggeredBy : "")],
        ["Logical time", time(r.logicalTimeMs)], ["Created", time(r.createdAtMs)], ["Finished", time(r.finishedAtMs)],
        deadlineRow(r), parentRow(r), childrenRow(r),
        r.idempotencyKey ? ["Idempotency key", r.idempotencyKey] : null,
        ["Params", Object.keys(r.params || {}).length ? table(null, ["Name", "Value"], Object.entries(r.params).map(([k, v]) => [k, h("code", {}, v)])) : "none"]]));
    fill(actions, 
      !TERMINAL_RUN.has(state) ? actionButton("Cancel run", "Cancel run " + r.id + "? Its running tasks are killed and the rest will not run.", "Cancel run", "/api/v1/runs/" + r.id + "/cancel", { reason: "cancelled from the web UI" }, refresh) : null,
      ["FAILED", "CANCELLED"].includes(state) ? actionButton("Rerun failed tasks", "Run the failed, timed-out and cancelled tasks of run " + r.id + " again, and what depends on them?", "Rerun", "/api/v1/runs/" + r.id + "/rerun", { failed: true }, () => route()) : null);
    const statuses = snapshot.instances.tasks || [];
    const byTask = new Map((snapshot.instances.instances || []).filter(i => !Number(i.shardParentId)).map(i => [i.task, i]));
    graph.update(new Map(statuses.map(t => [t.task, { state: t.status, instanceId: t.instanceId }])));
    instancesBody.replaceChildren(...statuses.map(t => {
      const inst = byTask.get(t.task);
      const s = stateName(t.status);
      const started = inst && Number(inst.startedAtMs), finished = inst && Number(inst.finishedAtMs);
      return h("tr", {},
        h("th", { scope: "row" }, inst ? link("/instances/" + inst.id, t.task) : t.task),
        h("td", {}, chip(s), t.items ? itemCounts(t.items, inst) : null),
        h("td", {}, inst ? String(inst.attempt) : "–"),
        h("td", {}, whereItRuns(inst)),
        h("td", {}, started ? time(started) : "–"),
        h("td", {}, started ? fmtDuration((finished || Date.now()) - started) : "–"),
        h("td", {}, inst && inst.exitCode !== undefined && inst.exitCode !== null && TERMINAL_INSTANCE.has(s) ? String(inst.exitCode) : "–"),
        h("td", {},
          inst && ["FAILED", "TIMEOUT", "CANCELLED"].includes(s) && TERMINAL_RUN.has(state) ? actionButton("Retry", "Run task " + t.task + " again as a new attempt?", "Retry", "/api/v1/instances/" + inst.id + "/retry", {}, () => route(), { "aria-label": "Retry " + t.task }) : null,
          inst && TERMINAL_INSTANCE.has(s) && TERMINAL_RUN.has(state) ? actionButton("Rerun from here", "Run task " + t.task + " and everything below it again?", "Rerun", "/api/v1/runs/" + r.id + "/rerun", { fromTask: t.task }, () => route(), { "aria-label": "Rerun from " + t.task }) : null));
    }));
    renderGantt(gantt, r, [...byTask.values()]);
  };
  const refresh = async () => {
    const [r, instances] = await Promise.all([api("/api/v1/runs/" + id), api("/api/v1/runs/" + id + "/instances?attempts=true&group_items=true")]);
    if (!view.left) render({ run: r, instances });
    return !TERMINAL_RUN.has(stateName(r.state));
  };

  show("Run " + id,
    h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(run.workflow), run.workflow), " / run " + id),
    header, actions, h("h2", {}, "Graph"), graph.el, h("h2", {}, "Timeline"), gantt,
    h("h2", {}, "Tasks"),
    h("table", {}, h("thead", {}, h("tr", {}, ["Task", "State", "Attempt", "Worker", "Started", "Duration", "Exit code", "Actions"].map(x => h("th", { scope: "col" }, x)))), instancesBody));
  await refresh();
  whileVisible(view, () => {
    // An ended run changes no more: its page was read whole above.
    if (TERMINAL_RUN.has(stateName(latest.run.state))) return null;
    return stream("/api/v1/runs/" + id + "/events", { run: render, end: () => {}, error: e => alertBox(actions, e.message) }, refresh);
  });
}

/** A mapped task's items in one line under its state: "10,000 items: 9,990 success · 8
 *  failed", linked to the task's page where they are listed. */
function itemCounts(items, inst) {
  const parts = Object.entries(items.states || {}).sort((a, b) => b[1] - a[1]).map(([state, n]) => num(n) + " " + state.toLowerCase());
  const text = num(items.total) + " items: " + parts.join(" · ");
  return h("div", { class: "items-count" }, inst ? link("/instances/" + inst.id + "#items", text) : text);
}

/** The items of a mapped task on its page, a page of 100 at a time, filtered by state. */
function itemsSection(view, instance) {
  const el = h("section", { id: "items", "aria-label": "Items", hidden: true });
  const body = h("div");
  const filter = h("select", { "aria-label": "Only items in state" },
    ["", "waiting", "running", "success", "failed", "timeout", "cancelled"].map(v => h("option", { value: v }, v || "any state")));
  let from = 0;
  const pages = [];
  const load = async () => {
    const q = "items_of=" + instance.id + "&items_from=" + from + "&limit=100" + (filter.value ? "&state=" + filter.value : "");
    const page = await api("/api/v1/runs/" + instance.runId + "/instances?" + q);
    if (view.left) return;
    const items = page.instances || [];
    const next = Number(page.nextItemsFrom || 0);
    if (!items.length && !filter.value && !from) { el.hidden = true; return; }
    el.hidden = false;
    fill(body,
      items.length ? table(null, ["Index", "Item", "State", "Attempt", "Worker", "Started", "Duration", "Exit code"], items.map(i => {
        const s = stateName(i.state), started = Number(i.startedAtMs), finished = Number(i.finishedAtMs);
        return [String(i.shardIndex || 0), link("/instances/" + i.id, i.item || "(empty)"), chip(s), String(i.attempt), i.workerId || "–",
          started ? time(started) : "–", started ? fmtDuration((finished || Date.now()) - started) : "–",
          i.exitCode !== undefined && i.exitCode !== null && TERMINAL_INSTANCE.has(s) ? String(i.exitCode) : "–"];
      })) : h("p", { class: "muted" }, "No item" + (filter.value ? " is " + filter.value : "") + "."),
      h("div", { class: "toolbar" },
        pages.length ? button("Previous items", () => { from = pages.pop(); load(); }) : null,
        next ? button("Next items", () => { pages.push(from); from = next; load(); }) : null));
  };
  filter.addEventListener("change", () => { from = 0; pages.length = 0; load(); });
  el.append(h("h2", {}, "Items"), h("div", { class: "toolbar" }, filter), body);
  return { el, load };
}

function button(label, onClick) {
  const b = h("button", { type: "button" }, label);
  b.addEventListener("click", onClick);
  return b;
}

/** A run's deadline for its page: the time it must end by and, once judged missed, a chip and
 *  when; none for a run without a deadline. */
function deadlineRow(r) {
  const at = Number(r.deadlineAtMs || 0), missed = Number(r.deadlineMissedAtMs || 0);
  if (!at) return null;
  return ["Deadline", h("span", { class: "deadline" }, time(at),
    missed ? [" ", chip("DEADLINE_MISSED"), " judged ", time(missed)] : null)];
}

/** Where an instance's current attempt runs: its worker, or the child run a run_workflow task
 * waits on (it takes no worker). */
function whereItRuns(inst) {
  if (!inst) return "–";
  if (inst.workerId) return inst.workerId;
  const current = (inst.attempts || []).find(a => Number(a.attempt) === Number(inst.attempt));
  return current && Number(current.childRunId) ? link("/runs/" + current.childRunId, "child run " + current.childRunId) : "–";
}

/** A child run's parent: the run and task that started it (run_workflow); none otherwise. */
function parentRow(r) {
  if (!Number(r.parentRunId)) return null;
  return ["Parent", h("span", { class: "parent-run" }, link("/runs/" + r.parentRunId, "run " + r.parentRunId),
    r.parentTask ? [", task ", link("/instances/" + r.parentInstanceId, r.parentTask)] : null)];
}

/** The runs this run's run_workflow tasks started, newest first; none without any. */
function childrenRow(r) {
  const ids = r.childRunIds || [];
  if (!ids.length) return null;
  return ["Children", h("span", { class: "child-runs" },
    ids.flatMap((id, n) => [n ? ", " : null, link("/runs/" + id, "run " + id)]))];
}

/** One row per task, one bar per attempt: a retried task shows its failed attempts beside
 *  the one that followed. */
function renderGantt(el, run, instances) {
  const spans = i => (i.attempts && i.attempts.length ? i.attempts : [i])
    .filter(a => Number(a.startedAtMs))
    .map(a => ({ attempt: a.attempt || i.attempt, state: stateName(a.state), s: Number(a.startedAtMs), f: Number(a.finishedAtMs) || Date.now() }));
  const rows = instances.map(i => ({ task: i.task, bars: spans(i) })).filter(r => r.bars.length);
  if (!rows.length) { el.replaceChildren(h("p", { class: "muted" }, "No task has started yet.")); el.setAttribute("aria-label", "No task has started yet"); return; }
  const bars = rows.flatMap(r => r.bars);
  const t0 = Math.min(...bars.map(b => b.s));
  const t1 = Math.max(...bars.map(b => b.f), t0 + 1);
  const span = t1 - t0;
  el.setAttribute("aria-label", "Timeline of " + rows.length + " tasks, " + bars.length + " attempts, over " + fmtDuration(span));
  rows.sort((a, b) => a.bars[0].s - b.bars[0].s);
  el.replaceChildren(...rows.slice(0, 300).map(r => {
    const last = r.bars[r.bars.length - 1];
    return h("div", { class: "gantt-row" },
      h("span", { class: "gantt-label" }, r.task + (r.bars.length > 1 ? " (" + r.bars.length + " attempts)" : "")),
      h("span", { class: "gantt-track" }, ...r.bars.map(b => h("span", {
        class: "gantt-bar s-" + b.state.toLowerCase(),
        "data-attempt": String(b.attempt),
        title: r.task + ", attempt " + b.attempt + ": " + b.state + ", " + fmtDuration(b.f - b.s),
        style: { left: ((b.s - t0) / span * 100) + "%", width: Math.max(0.5, (b.f - b.s) / span * 100) + "%" },
      }))),
      h("span", { class: "gantt-time" }, fmtDuration(last.f - r.bars[0].s)));
  }), rows.length > 300 ? h("p", { class: "muted" }, "The first 300 of " + num(rows.length) + " tasks are drawn.") : "");
}

// ---------- an instance and its log ----------

async function viewInstance(view, id) {
  let instance = await api("/api/v1/instances/" + id);
  if (view.left) return;
  const header = h("div"), attemptsEl = h("div"), logEl = h("div");
  let attempt = Number(new URLSearchParams(location.search).get("attempt")) || instance.attempt;
  const isItem = instance.item !== undefined && instance.item !== null;
  // A mapped task's own instance runs nowhere: its items are what ran. Any task's own
  // instance may be one; the section shows once a first page of items is found.
  const items = !isItem && !Number(instance.shardParentId) ? itemsSection(view, instance) : null;
  const renderHeader = () => {
    const s = stateName(instance.state);
    const current = (instance.attempts || []).find(a => a.attempt === instance.attempt) || {};
    const exit = TERMINAL_INSTANCE.has(s) && current.exitCode !== undefined && current.exitCode !== null ? "exit code " + current.exitCode : null;
    fill(header, 
      h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(instance.workflow), instance.workflow), " / ", link("/runs/" + instance.runId, "run " + instance.runId), " / ",
        isItem ? [link("/instances/" + instance.shardParentId + "#items", instance.task), " / item " + (instance.shardIndex || 0)] : instance.task),
      h("h1", {}, "Task ", h("span", { class: "task-name" }, instance.task), " ", chip(s), exit ? h("span", { class: "exit" }, " " + exit) : null,
        current.signal ? h("span", { class: "exit" }, " signal " + current.signal) : null),
      isItem ? kv([["Item", h("code", {}, instance.item)], ["Index", (instance.shardIndex || 0) + " of " + num(instance.shardTotal)]]) : null,
      current.message ? h("p", { class: "message" }, current.message) : null);
    fill(attemptsEl, h("h2", {}, "Attempts"), table(null, ["Attempt", "State", "Worker", "Node", "Dispatched", "Started", "Finished", "Exit code", "Signal", "Lines", "Message"],
      (instance.attempts || []).map(a => [
        a.attempt === attempt ? h("strong", {}, "attempt " + a.attempt + " (shown)") : link("/instances/" + instance.id + "?attempt=" + a.attempt, "attempt " + a.attempt),
        chip(a.state), a.workerId || (Number(a.childRunId) ? link("/runs/" + a.childRunId, "child run " + a.childRunId) : "–"), a.nodeId || "–", time(a.dispatchedAtMs), time(a.startedAtMs), time(a.finishedAtMs),
        a.exitCode !== undefined && a.exitCode !== null && TERMINAL_INSTANCE.has(stateName(a.state)) ? String(a.exitCode) : "–",
        a.signal ? String(a.signal) : "–", num(a.logLines), a.message || "–"])));
  };
  renderHeader();
  const reload = async () => {
    instance = await api("/api/v1/instances/" + id);
    if (!view.left) { renderHeader(); viewer.setAttemptInfo(attemptOf()); }
  };
  const attemptOf = () => (instance.attempts || []).find(a => a.attempt === attempt) || { attempt, logLines: "0", state: instance.state };
  const viewer = logViewer(view, instance, attemptOf(), reload);
  logEl.append(viewer.el);
  const logTitle = h("h2", {}, "Log of attempt " + attempt);
  show(instance.task + " · run " + instance.runId, header, attemptsEl, items ? items.el : null, logTitle, logEl);
  if (items) {
    await items.load();
    // A mapped task's own instance never ran: no attempt, no log, only its items.
    if (!items.el.hidden && !(instance.attempts || []).length) [attemptsEl, logTitle, logEl].forEach(e => { e.hidden = true; });
  }
  viewer.start();
}

const LINE_HEIGHT = 20;
const PAGE_LINES = 1000;
const SHOWN_CHARS = 2000;

/** The log viewer: a window over the attempt's lines, fetched in pages as the reader scrolls
 *  (a million-line log is never loaded whole), line numbers that are #L links, stderr marked,
 *  ANSI colours rendered, search on the server, and a live tail that follows new lines until
 *  the reader scrolls up. */
function logViewer(view, instance, info, onEnd) {
  const base = "/api/v1/instances/" + instance.id;
  const attempt = info.attempt;
  let total = Number(info.logLines || 0);
  let ended = TERMINAL_INSTANCE.has(stateName(info.state));
  const pages = new Map(); // page index → array of lines (seq = index*PAGE_LINES + i + 1)
  const loading = new Set();
  let following = !ended;
  let highlighted = 0;

  const count = h("span", { class: "count", role: "status" });
  const search = h("input", { type: "search", placeholder: "Search this log", "aria-label": "Search this log" });
  const matchesEl = h("div", { class: "matches" });
  const followBtn = h("button", { type: "button", hidden: true }, "Follow new lines");
  const download = h("a", { href: base + "/logs/download?attempt=" + attempt, download: "", class: "button" }, "Download full log");
  const spacer = h("div", { class: "log-spacer" });
  const rows = h("div", { class: "log-rows" });
  const scroller = h("div", { class: "log", tabindex: "0", role: "log", "aria-label": "Log of attempt " + attempt }, spacer, rows);
  const legend = h("p", { class: "legend" }, h("span", { class: "lg-out" }, "out"), " stdout · ", h("span", { class: "lg-err" }, "err"), " stderr");

  const setCount = () => {
    count.textContent = num(total) + " lines" + (ended ? "" : ", still running") + (following && !ended ? " · following" : "");
    spacer.style.height = (total * LINE_HEIGHT) + "px";
  };

  const lineAt = seq => { const p = pages.get(Math.floor((seq - 1) / PAGE_LINES)); return p ? p[(seq - 1) % PAGE_LINES] : undefined; };

  const fetchPage = async index => {
    if (pages.has(index) && pages.get(index).length === PAGE_LINES) return;
    if (loading.has(index)) return;
    loading.add(index);
    try {
      const q = new URLSearchParams({ attempt, after: String(index * PAGE_LINES), limit: String(PAGE_LINES) });
      const answer = await api(base + "/logs?" + q);
      const have = pages.get(index) || [];
      const lines = answer.lines || [];
      if (lines.length >= have.length) pages.set(index, lines);
      const last = lines.length ? Number(lines[lines.length - 1].seq) : 0;
      if (last > total) { total = last; setCount(); }
    } finally {
      loading.delete(index);
    }
    paint();
  };

  const paint = () => {
    const top = scroller.scrollTop, height = scroller.clientHeight || 600;
    const first = Math.max(1, Math.floor(top / LINE_HEIGHT) - 20);
    const last = Math.min(total, Math.ceil((top + height) / LINE_HEIGHT) + 20);
    const want = new Set();
    const out = [];
    for (let seq = first; seq <= last; seq++) {
      const line = lineAt(seq);
      if (!line) { want.add(Math.floor((seq - 1) / PAGE_LINES)); }
      out.push(renderLine(seq, line));
    }
    rows.style.transform = `translateY(${(first - 1) * LINE_HEIGHT}px)`;
    rows.replaceChildren(...out);
    for (const index of want) fetchPage(index);
  };

  const renderLine = (seq, line) => {
    const err = line && String(line.stream).includes("STDERR");
    const el = h("div", { class: "line" + (err ? " err" : "") + (seq === highlighted ? " hl" : ""), id: "L" + seq },
      h("a", { class: "ln", href: "#L" + seq, "aria-label": "line " + seq, onclick: e => { e.preventDefault(); history.replaceState(null, "", "#L" + seq); highlight(seq, false); } }, String(seq)),
      h("span", { class: "stream", "aria-hidden": "true" }, err ? "err" : "out"));
    const text = h("span", { class: "text" });
    if (!line) text.textContent = "…";
    else {
      const full = line.text || "";
      ansi(text, full.length > SHOWN_CHARS ? full.slice(0, SHOWN_CHARS) : full);
      if (full.length > SHOWN_CHARS) {
        text.append(h("button", { type: "button", class: "more", onclick: () => showWholeLine(seq, full) }, "… show all " + num(full.length) + " characters"));
      }
    }
    el.append(text);
    return el;
  };

  const highlight = (seq, scroll = true) => {
    highlighted = seq;
    if (scroll) {
      following = false;
      scroller.scrollTop = Math.max(0, (seq - 1) * LINE_HEIGHT - scroller.clientHeight / 3);
    }
    paint();
    setCount();
  };

  const atBottom = () => scroller.scrollTop + scroller.clientHeight >= scroller.scrollHeight - LINE_HEIGHT * 2;
  // Following ends when the reader leaves the bottom and resumes when they return to it. The
  // tail itself only ever scrolls to the bottom, so a scroll that ends elsewhere is the reader's.
  scroller.addEventListener("scroll", () => {
    if (!ended) {
      const bottom = atBottom();
      if (following && !bottom) { following = false; followBtn.hidden = false; setCount(); }
      else if (!following && bottom) { following = true; followBtn.hidden = true; setCount(); }
    }
    requestAnimationFrame(paint);
  });
  const toBottom = () => { scroller.scrollTop = scroller.scrollHeight; paint(); };
  followBtn.addEventListener("click", () => { following = true; followBtn.hidden = true; toBottom(); setCount(); });

  // Search runs on the server: the matches, a page at a time, each a link to its line.
  let searchAfter = 0;
  const runSearch = async more => {
    const q = search.value;
    if (!more) { searchAfter = 0; matchesEl.replaceChildren(); }
    if (!q) return;
    const answer = await api(base + "/logs?" + new URLSearchParams({ attempt, contains: q, after: String(searchAfter), limit: "200" }));
    const found = answer.lines || [];
    const list = matchesEl.querySelector("ol") || matchesEl.appendChild(h("ol", { class: "hits" }));
    for (const line of found) {
      list.append(h("li", {}, h("a", { href: "#L" + line.seq, onclick: e => { e.preventDefault(); history.replaceState(null, "", "#L" + line.seq); highlight(Number(line.seq)); } }, "line " + line.seq), " ", (line.text || "").slice(0, 160)));
      searchAfter = Number(line.seq);
    }
    matchesEl.querySelector(".more-hits")?.remove();
    const shown = list.childNodes.length;
    matchesEl.querySelector(".hit-count")?.remove();
    matchesEl.prepend(h("p", { class: "hit-count", role: "status" }, shown ? num(shown) + (found.length === 200 ? "+ matches" : " matches") + " for “" + q + "”" : "No line contains “" + q + "”."));
    if (found.length === 200) matchesEl.append(h("button", { type: "button", class: "more-hits", onclick: () => runSearch(true) }, "More matches"));
  };
  search.addEventListener("keydown", e => { if (e.key === "Enter") { e.preventDefault(); runSearch(false); } });

  const el = h("div", { class: "log-viewer" },
    h("div", { class: "toolbar" }, count, " ", search, h("button", { type: "button", onclick: () => runSearch(false) }, "Search"), " ", download, " ", followBtn),
    matchesEl, legend, scroller);

  const setAttemptInfo = next => {
    const n = Number(next.logLines || 0);
    if (n > total) total = n;
    ended = TERMINAL_INSTANCE.has(stateName(next.state));
    setCount();
  };

  const tail = () => whileVisible(view, () => {
    if (ended) return null;
    return stream(base + "/logs/tail?" + new URLSearchParams({ attempt, after: String(total) }), {
      lines: chunk => {
        // Where the reader is now, not what the last scroll event said: a scroll up that has
        // not reached its event yet must not be undone by these lines.
        if (following && !atBottom()) { following = false; followBtn.hidden = false; }
        for (const line of chunk.lines || []) {
          const seq = Number(line.seq), index = Math.floor((seq - 1) / PAGE_LINES);
          const page = pages.get(index) || [];
          page[(seq - 1) % PAGE_LINES] = line;
          pages.set(index, page);
          if (seq > total) total = seq;
        }
        setCount();
        if (following) toBottom(); else paint();
      },
      end: async () => { ended = true; following = false; followBtn.hidden = true; await onEnd(); setCount(); paint(); },
      error: e => alertBox(el, "The live tail stopped: " + e.message),
    }, async () => { await onEnd(); paint(); return !ended; });
  });

  return {
    el, setAttemptInfo,
    start() {
      setCount();
      const m = /^#L(\d+)$/.exec(location.hash);
      if (m) highlight(Math.min(Number(m[1]), Math.max(total, 1)));
      else if (following) toBottom();
      else paint();
      window.addEventListener("hashchange", onHash);
      view.onLeave(() => window.removeEventListener("hashchange", onHash));
      tail();
    },
  };
  function onHash() { const m = /^#L(\d+)$/.exec(location.hash); if (m) highlight(Number(m[1])); }
}

function showWholeLine(seq, text) {
  const dialog = h("dialog", { class: "whole-line", "aria-label": "Line " + seq },
    h("h2", {}, "Line " + seq + " (" + num(text.length) + " characters)"),
    h("pre", {}, text),
    h("button", { type: "button", onclick: () => dialog.close(), autofocus: true }, "Close"));
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
}

// ANSI SGR colours: 30–37/90–97 and 40–47/100–107 as classes, 38;5;n and 38;2;r;g;b as
// colours, bold, dim, italic, underline; every other escape sequence is dropped.
const ANSI_RE = /\x1b\[([0-9;]*)([A-Za-z])/g;
const PALETTE = ["#000000", "#cd3131", "#0dbc79", "#e5e510", "#2472c8", "#bc3fbc", "#11a8cd", "#e5e5e5",
  "#666666", "#f14c4c", "#23d18b", "#f5f543", "#3b8eea", "#d670d6", "#29b8db", "#ffffff"];
function color256(n) {
  if (n < 16) return PALETTE[n];
  if (n >= 232) { const v = 8 + (n - 232) * 10; return `rgb(${v},${v},${v})`; }
  const c = n - 16, r = Math.floor(c / 36), g = Math.floor(c / 6) % 6, b = c % 6, f = x => x ? 55 + x * 40 : 0;
  return `rgb(${f(r)},${f(g)},${f(b)})`;
}
function ansi(el, text) {
  let style = {}, last = 0, m;
  const push = s => {
    if (!s) return;
    const clean = s.replace(/\x1b[^\[]?/g, "");
    if (!Object.keys(style).length) { el.append(clean); return; }
    const span = h("span", { class: [style.fgc, style.bgc, style.bold && "a-bold", style.dim && "a-dim", style.italic && "a-italic", style.underline && "a-underline"].filter(Boolean).join(" ") }, clean);
    if (style.fg) span.style.color = style.fg;
    if (style.bg) span.style.backgroundColor = style.bg;
    el.append(span);
  };
  ANSI_RE.lastIndex = 0;
  while ((m = ANSI_RE.exec(text))) {
    push(text.slice(last, m.index));
    last = ANSI_RE.lastIndex;
    if (m[2] !== "m") continue;
    const codes = m[1] === "" ? [0] : m[1].split(";").map(Number);
    for (let i = 0; i < codes.length; i++) {
      const c = codes[i];
      if (c === 0) style = {};
      else if (c === 1) style.bold = true;
      else if (c === 2) style.dim = true;
      else if (c === 3) style.italic = true;
      else if (c === 4) style.underline = true;
      else if (c === 22) { style.bold = false; style.dim = false; }
      else if (c >= 30 && c <= 37) { style.fgc = "a-fg" + (c - 30); delete style.fg; }
      else if (c >= 90 && c <= 97) { style.fgc = "a-fg" + (c - 90 + 8); delete style.fg; }
      else if (c === 39) { delete style.fgc; delete style.fg; }
      else if (c >= 40 && c <= 47) { style.bgc = "a-bg" + (c - 40); delete style.bg; }
      else if (c >= 100 && c <= 107) { style.bgc = "a-bg" + (c - 100 + 8); delete style.bg; }
      else if (c === 49) { delete style.bgc; delete style.bg; }
      else if ((c === 38 || c === 48) && codes[i + 1] === 5) { const v = color256(codes[i + 2] || 0); if (c === 38) { style.fg = v; delete style.fgc; } else { style.bg = v; delete style.bgc; } i += 2; }
      else if ((c === 38 || c === 48) && codes[i + 1] === 2) { const v = `rgb(${codes[i + 2] || 0},${codes[i + 3] || 0},${codes[i + 4] || 0})`; if (c === 38) { style.fg = v; delete style.fgc; } else { style.bg = v; delete style.bgc; } i += 4; }
    }
    style = Object.fromEntries(Object.entries(style).filter(([, v]) => v));
  }
  push(text.slice(last));
}

// ---------- workers ----------

async function viewWorkers(view) {
  const workersEl = h("div"), nodesEl = h("div");
  show("Workers", h("h1", {}, "Workers"), workersEl, h("h2", {}, "Scheduler nodes"), nodesEl);
  const refresh = async () => {
    const [workers, nodes] = await Promise.all([api("/api/v1/workers"), api("/api/v1/nodes")]);
    if (view.left) return;
    const list = workers.workers || [];
    fill(workersEl, h("p", { role: "status" }, num(list.length) + " workers, " + num(list.filter(w => stateName(w.state) === "LIVE").length) + " live"),
      table(null, ["Worker", "State", "Load", "Labels", "Heartbeat", "Node", "Host", "Version"], list.map(w => [
        w.id, chip(w.state),
        h("span", { class: "load" }, h("meter", { min: 0, max: w.capacity || 1, value: w.running || 0, "aria-label": "load of " + w.id }), " " + (w.running || 0) + " / " + (w.capacity || 0)),
        Object.entries(w.labels || {}).map(([k, v]) => k + "=" + v).join(", ") || "–",
        since(w.lastHeartbeatMs), w.schedulerNode || "–", w.hostname || "–", w.version || "unknown"])));
    // The schema's release: which release migrated the store and which may still run on it.
    const schema = nodes.schemaRelease
      ? "Store schema: ax " + nodes.schemaRelease + " (migration " + nodes.schemaMigration + "); nodes of ax " + nodes.schemaOldestRelease + " or later may run on it."
      : "Store schema: unknown (migrated by ax 0.1.0, or this node is older than 0.2.0).";
    fill(nodesEl, table(null, ["Node", "Live", "Address", "Workers", "Lease renewed", "Clock offset", "Version"],
      (nodes.nodes || []).map(n => [n.nodeId, n.live ? "live" : "expired", n.address || "–", String(n.workers || 0), since(n.renewedAtMs), (n.clockOffsetMs || 0) + " ms", n.version || "unknown"])),
      h("p", { class: "schema" }, schema));
  };
  await refresh();
  poll(view, 5000, refresh);
}

// ---------- why ----------

async function viewWhy(view, name) {
  const at = new URLSearchParams(location.search).get("at");
  const explanation = await api("/api/v1/workflows/" + enc(name) + "/why" + (at ? "?at=" + enc(at) : ""));
  if (view.left) return;
  const input = h("input", { type: "datetime-local", id: "why-at", step: "1" });
  const form = h("form", { class: "toolbar", onsubmit: e => {
    e.preventDefault();
    const ms = input.value ? (prefs.utc ? Date.parse(input.value + "Z") : new Date(input.value).getTime()) : 0;
    go("/workflows/" + enc(name) + "/why" + (ms ? "?at=" + ms : ""));
  } }, h("label", { for: "why-at" }, "At (" + (prefs.utc ? "UTC" : "local time") + ") "), input, h("button", { type: "submit" }, "Explain"));
  const s = explanation.schedule || {};
  show("Why · " + name,
    h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(name), name), " / why"),
    h("h1", {}, "Why did ", name, " run or not?"), form,
    h("p", {}, "Around ", time(explanation.atMs)),
    h("ul", { class: "verdict" }, (explanation.verdict || []).map(v => h("li", {}, v))),
    kv([["Schedule", scheduleText(s)], ["Paused", s.paused ? "yes" : "no"], ["Previous slot", time(s.previousSlotMs)], ["Next slot", time(s.nextSlotMs)],
      ["Misfire", s.misfire || "–"], ["Overlap", s.overlap || "–"],
      ["Nearest run", explanation.run ? link("/runs/" + explanation.run.id, "run " + explanation.run.id) : "none"]]),
    h("h2", {}, "Tasks"), table(null, ["Task", "State", "Reason"], (explanation.tasks || []).map(t => [t.instanceId && t.instanceId !== "0" ? link("/instances/" + t.instanceId, t.task) : t.task, t.state === "-" ? "–" : chip(t.state), t.text || t.reason])),
    h("h2", {}, "Decisions"), table(null, ["At", "Kind", "What happened"], (explanation.decisions || []).map(d => [time(d.atMs), d.kind, d.text])));
}

// ---------- audit ----------

async function viewAudit(view) {
  const params = new URLSearchParams(location.search);
  const fields = ["actor", "action", "target"].map(f => h("input", { type: "text", name: f, value: params.get(f) || "", "aria-label": "Filter by " + f, placeholder: f }));
  const form = h("form", { class: "toolbar", onsubmit: e => {
    e.preventDefault();
    const q = new URLSearchParams();
    for (const f of fields) if (f.value) q.set(f.name, f.value);
    go("/audit" + (q.toString() ? "?" + q : ""));
  } }, fields, h("button", { type: "submit" }, "Filter"));
  const q = new URLSearchParams({ limit: "200" });
  for (const f of fields) if (f.value) q.set(f.name, f.value);
  const answer = await api("/api/v1/audit?" + q);
  if (view.left) return;
  show("Audit", h("h1", {}, "Audit trail"), form,
    table("Newest first", ["At", "Who", "Action", "Target", "Detail", "From"], (answer.entries || []).map(e => [time(e.atMs), e.actor, e.action, e.target, e.detail || "–", e.remote || "–"])));
}

// ---------- trigger ----------

async function viewTrigger(view, name) {
  const workflow = await api("/api/v1/workflows/" + enc(name));
  if (view.left) return;
  const rowsEl = h("div", { class: "params" });
  const addRow = (k = "", v = "") => {
    const n = rowsEl.childNodes.length + 1;
    const row = h("div", { class: "param" },
      h("input", { type: "text", class: "pk", value: k, "aria-label": "Param " + n + " name", placeholder: "name" }), " = ",
      h("input", { type: "text", class: "pv", value: v, "aria-label": "Param " + n + " value", placeholder: "value" }),
      h("button", { type: "button", onclick: () => row.remove(), "aria-label": "Remove param " + n }, "Remove"));
    rowsEl.append(row);
  };
  addRow();
  const key = h("input", { type: "text", id: "idem", placeholder: "optional" });
  const errors = h("div");
  const form = h("form", { onsubmit: async e => {
    e.preventDefault();
    const params = {};
    for (const row of rowsEl.querySelectorAll(".param")) {
      const k = row.querySelector(".pk").value.trim(), v = row.querySelector(".pv").value;
      if (k) params[k] = v;
    }
    try {
      const answer = await post("/api/v1/workflows/" + enc(name) + "/trigger", { params, idempotencyKey: key.value.trim() });
      announce(answer.created ? "Run " + answer.run.id + " created." : "Run " + answer.run.id + " already existed for that key.");
      go("/runs/" + answer.run.id);
    } catch (err) {
      errors.replaceChildren(h("p", { class: "error", role: "alert" }, "The trigger was refused: " + err.message));
    }
  } },
    h("fieldset", {}, h("legend", {}, "Params (the tasks see them as AX_PARAM_<NAME>)"), rowsEl, h("button", { type: "button", onclick: () => addRow() }, "Add a param")),
    h("p", {}, h("label", { for: "idem" }, "Idempotency key "), key, h("span", { class: "muted" }, " (a repeated key returns the run the first trigger made)")),
    errors, h("button", { type: "submit", class: "primary" }, "Trigger " + workflow.name));
  show("Trigger · " + name, h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(name), name), " / trigger"),
    h("h1", {}, "Trigger ", name), form);
}

// ---------- signing in ----------

/** Shows who the node sees (the token's name and role) and the sign-out button, when the
 *  node asks for tokens. */
async function showIdentity() {
  const who = document.getElementById("who");
  const out = document.getElementById("sign-out");
  let identity = {};
  try { identity = await api("/api/v1/whoami"); } catch (_) { /* signed out: the page asks */ }
  const signedIn = Boolean(identity.authentication && identity.token);
  who.textContent = signedIn ? identity.token + " (" + identity.role + (identity.app ? ", app " + identity.app : "") + ")" : "";
  who.hidden = !signedIn;
  out.hidden = !signedIn;
}

/** The node asks for a token: a form that posts it; the node keeps it in a session cookie, so
 *  the browser forgets it when its session ends. */
function signIn(message) {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true, size: 50 });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const form = h("form", { class: "sign-in" },
    h("p", {}, h("label", { for: "token" }, "Token "), input, " ", h("button", { type: "submit", class: "primary" }, "Sign in")),
    error);
  form.addEventListener("submit", async event => {
    event.preventDefault();
    try {
      await post("/api/v1/session", { token: input.value.trim() });
      input.value = "";
      await showIdentity();
      await route();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
      input.focus();
    }
  });
  show("Sign in", h("h1", {}, "Sign in"), h("p", {}, message),
    h("p", { class: "muted" }, "Paste a token made with axctl token create. It is kept for this browser session only."), form);
  input.focus();
}

document.getElementById("sign-out").addEventListener("click", async () => {
  await api("/api/v1/session", { method: "DELETE" });
  await showIdentity();
  signIn("Signed out.");
});

// ---------- start ----------

document.getElementById("zone-toggle").addEventListener("click", () => { prefs.utc = !prefs.utc; showPrefs(); route(); });
document.getElementById("theme-toggle").addEventListener("click", () => { prefs.theme = prefs.theme === "dark" ? "light" : "dark"; showPrefs(); });
showPrefs();
showIdentity();
route();
