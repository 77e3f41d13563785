// The page routes itself: a path names a view, links and history move between them.

import { h, link, main, show } from "./dom.js";
import { ApiError } from "./api.js";
import { signIn } from "./session.js";

/** The views by path, set once by app.js. */
let ROUTES = [];
export function setRoutes(routes) { ROUTES = routes; }

let current = null;

export class View {
  constructor() { this.left = false; this.cleanups = []; }
  onLeave(fn) { this.cleanups.push(fn); }
  leave() { this.left = true; for (const fn of this.cleanups.splice(0)) { try { fn(); } catch (_) { /* best effort */ } } }
}

export async function route() {
  if (current) current.leave();
  const view = current = new View();
  // `/workflows/x/` is `/workflows/x`: a trailing slash (typed, or added by a proxy) names the
  // same page, and the address bar shows its one spelling.
  if (/.\/+$/.test(location.pathname)) {
    history.replaceState(history.state, "", location.pathname.replace(/\/+$/, "") + location.search + location.hash);
  }
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

export function notFound(message) {
  show("Not found", h("h1", {}, "Not found"), h("p", { class: "error", role: "alert" }, message),
    h("p", {}, link("/", "All workflows")));
}

export function failed(err) {
  show("Error", h("h1", {}, "Something went wrong"), h("p", { class: "error", role: "alert" }, err.message || String(err)));
}

export function go(path) {
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
