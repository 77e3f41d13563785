// Times in the chosen zone, durations, and each state's name, glyph and colour.

import { h } from "./dom.js";

export const prefs = {
  get utc() { return localStorage.getItem("ax.utc") === "1"; },
  set utc(on) { localStorage.setItem("ax.utc", on ? "1" : "0"); },
  get theme() { return localStorage.getItem("ax.theme") || (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light"); },
  set theme(t) { localStorage.setItem("ax.theme", t); },
};

/** The header's two toggles keep their names; their pressed state says which is on, and the
 *  zone in use is said beside them. */
export function showPrefs() {
  const localZone = Intl.DateTimeFormat().resolvedOptions().timeZone;
  document.getElementById("zone-now").textContent = "Times in " + (prefs.utc ? "UTC" : localZone);
  const zone = document.getElementById("zone-toggle");
  zone.setAttribute("aria-pressed", String(prefs.utc));
  zone.title = prefs.utc ? "Show times in " + localZone : "Show times in UTC";
  const theme = document.getElementById("theme-toggle");
  document.documentElement.dataset.theme = prefs.theme;
  theme.setAttribute("aria-pressed", String(prefs.theme === "dark"));
}

/** Formatters by zone ("" for the browser's): making one costs far more than formatting with
 *  it, and a page such as the grid formats hundreds of times. */
const formatters = new Map();

/** A stored time (ms since the epoch, as a string or number) in the chosen zone, or in `zone`
 *  (an IANA name) when given. */
export function fmtTime(ms, zone) {
  const n = Number(ms || 0);
  if (!n) return "–";
  const timeZone = zone || (prefs.utc ? "UTC" : "");
  try {
    let format = formatters.get(timeZone);
    if (!format) {
      const options = { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23", timeZoneName: "short" };
      if (timeZone) options.timeZone = timeZone;
      format = new Intl.DateTimeFormat("en-CA", options);
      formatters.set(timeZone, format);
    }
    return format.format(new Date(n)).replace(",", "");
  } catch (_) {
    // A zone this browser does not know: the chosen zone, named as such.
    return fmtTime(n);
  }
}

/** The zone the page shows times in: "UTC" or the browser's. */
export const shownZone = () => prefs.utc ? "UTC" : Intl.DateTimeFormat().resolvedOptions().timeZone;

/** A slot of a schedule: in the schedule's own zone (as its cron reads), and in the page's
 *  zone beside it when that differs. */
export function slotTime(ms, zone) {
  const n = Number(ms || 0);
  if (!n) return "–";
  const own = zone || "UTC";
  const at = h("time", { datetime: new Date(n).toISOString(), class: "t" }, fmtTime(n, own), " ", h("span", { class: "zone" }, "(" + own + ")"));
  if (own === shownZone()) return at;
  return h("span", { class: "slot" }, at, h("span", { class: "muted" }, " · " + fmtTime(n)));
}

/** A time as a datetime-local field shows it, in `zone` (the page's zone by default); "" for
 *  none. */
export function toInput(ms, zone = shownZone()) {
  const n = Number(ms || 0);
  if (!n) return "";
  const parts = Object.fromEntries(new Intl.DateTimeFormat("en-CA", {
    timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit", hourCycle: "h23",
  }).formatToParts(new Date(n)).map(p => [p.type, p.value]));
  return `${parts.year}-${parts.month}-${parts.day}T${parts.hour}:${parts.minute}:${parts.second}`;
}

/** A datetime-local field's value, read as a wall-clock time in `zone` (the page's zone by
 *  default), as ms since the epoch; 0 for none. */
export function fromInput(text, zone = shownZone()) {
  if (!text) return 0;
  const wall = Date.parse(text + (text.length === 16 ? ":00" : "") + "Z");
  if (!Number.isFinite(wall)) return 0;
  // The zone's offset at that instant, found by showing a guess in the zone and correcting by
  // the difference (twice: once more across a change of offset).
  let guess = wall;
  for (let i = 0; i < 2; i++) guess += wall - Date.parse(toInput(guess, zone) + "Z");
  return guess;
}

export function time(ms) {
  const n = Number(ms || 0);
  return n ? h("time", { datetime: new Date(n).toISOString(), class: "t" }, fmtTime(n)) : "–";
}

export function fmtDuration(ms) {
  const n = Math.max(0, Math.round(Number(ms)));
  if (n < 1000) return n + " ms";
  const s = n / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 2 : 1) + " s";
  const m = Math.floor(s / 60), rest = Math.round(s % 60);
  if (m < 60) return m + " min " + rest + " s";
  return Math.floor(m / 60) + " h " + (m % 60) + " min";
}

export function since(ms) {
  const n = Number(ms || 0);
  return n ? fmtDuration(Date.now() - n) + " ago" : "never";
}

// Each state has a name in text, a glyph and a colour (a palette told apart with the common
// colour-vision deficiencies; failed and upstream-failed also differ in glyph and border).
export const STATES = {
  SUCCESS: "✓", FAILED: "✕", UPSTREAM_FAILED: "⊘", SKIPPED: "↷", TIMEOUT: "◷", RUNNING: "▶", DISPATCHED: "↗",
  WAITING: "…", PENDING: "○", CANCELLED: "■", QUEUED: "≡", LIVE: "●", DEAD: "✕", DRAINING: "◐", PAUSED: "∥",
  DEADLINE_MISSED: "!",
};

/** "RUN_STATE_FAILED", "failed", "upstream_failed" → "FAILED", "UPSTREAM_FAILED". */
export function stateName(raw) {
  return String(raw || "").replace(/^(RUN_STATE|INSTANCE_STATE|WORKER_STATE)_/, "").toUpperCase() || "UNKNOWN";
}

export function chip(raw) {
  const name = stateName(raw);
  return h("span", { class: "state s-" + name.toLowerCase() },
    h("span", { class: "glyph", "aria-hidden": "true" }, STATES[name] || "?"), " ", name);
}

export const TERMINAL_RUN = new Set(["SUCCESS", "FAILED", "CANCELLED"]);
export const TERMINAL_INSTANCE = new Set(["SUCCESS", "FAILED", "TIMEOUT", "CANCELLED"]);
