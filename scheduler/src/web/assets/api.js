// The node's JSON API and its live streams, fetched only while the page is shown.

import { announce } from "./dom.js";

export class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

export let offlineSince = 0;
export function setOffline(on, detail) {
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
export async function api(path, options = {}) {
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

export function post(path, body) {
  return api(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body || {}) });
}

export const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));
export const enc = encodeURIComponent;

/** Runs `start` while the page is visible and the view is current; `start` returns a stop
 *  function. A hidden page costs the scheduler nothing: its streams and timers are closed. */
export function whileVisible(view, start) {
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

/** Refreshes every `ms` while visible, and at once on becoming visible again. The caller has
 *  just loaded the view: the first refresh waits `ms`. */
export function poll(view, ms, refresh) {
  let first = true;
  whileVisible(view, () => {
    let timer = null, stopped = false;
    const tick = async () => {
      try { await refresh(); } catch (err) { if (!(err instanceof ApiError)) throw err; }
      if (!stopped) timer = setTimeout(tick, ms);
    };
    if (first) timer = setTimeout(tick, ms); else tick();
    first = false;
    return () => { stopped = true; clearTimeout(timer); };
  });
}

/** An SSE stream with `handlers` by event name; it resumes from the last event id by itself.
 *  When streaming fails repeatedly (a proxy that buffers, say) it falls back to `fallback`,
 *  a polling refresh. Returns a stop function. */
export function stream(url, handlers, fallback) {
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
