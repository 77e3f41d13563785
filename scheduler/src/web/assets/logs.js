// The log viewer: a window over an attempt's lines, paged from the node, with a live tail.

import { alertBox, h, num } from "./dom.js";
import { TERMINAL_INSTANCE, stateName } from "./format.js";
import { api, stream, whileVisible } from "./api.js";
import { renderTerminal, shownLength, terminalRuns } from "./ansi.js";

export const LINE_HEIGHT = 20;
export const PAGE_LINES = 1000;
export const SHOWN_CHARS = 2000;
/** The tallest scroll area the viewer makes. Browsers cap an element's height (Chromium at
 *  33,554,428 px, Firefox near 17.9 M): a log taller than this (750,000 lines) is scrolled
 *  through a scroll area of this height mapped onto its lines (see `ScrollWindow`). */
export const MAX_SCROLL_PX = 15_000_000;

/** The reader's place in a log of any length. `pos` is the top of the view in the log's own
 *  pixels (line n starts at (n − 1) × LINE_HEIGHT); the scroll area is at most MAX_SCROLL_PX
 *  tall, and past that its scrollbar maps proportionally onto the log, so dragging it or
 *  pressing End reaches every line. Wheel and keys move the log itself by their usual amounts,
 *  not the scaled scroll area, so a page down is still a page. */
class ScrollWindow {
  constructor(scroller) { this.scroller = scroller; this.pos = 0; this.setTop = 0; this.lines = 0; }
  get view() { return this.scroller.clientHeight || 600; }
  get logHeight() { return this.lines * LINE_HEIGHT; }
  get areaHeight() { return Math.min(this.logHeight, MAX_SCROLL_PX); }
  get maxPos() { return Math.max(0, this.logHeight - this.view); }
  get maxTop() { return Math.max(0, this.areaHeight - this.view); }
  /** Log pixels per scroll-area pixel: 1 until the log outgrows MAX_SCROLL_PX. */
  get ratio() { return this.maxTop > 0 && this.maxPos > this.maxTop ? this.maxPos / this.maxTop : 1; }
  get scaled() { return this.ratio > 1; }
  /** The log's length changed: the scroll area follows, and the reader stays on their lines. */
  resize(lines, spacer) {
    this.lines = lines;
    spacer.style.height = this.areaHeight + "px";
    if (this.scaled) this.place();
  }
  /** Takes a scroll the reader made (scrollbar, native keys) into `pos`; one this made itself
   *  changes nothing. */
  sync() {
    const top = this.scroller.scrollTop;
    if (Math.abs(top - this.setTop) < 1) return;
    this.setTop = top;
    this.pos = top >= this.maxTop - 0.5 && this.maxTop > 0 ? this.maxPos : Math.min(this.maxPos, top * this.ratio);
  }
  /** Moves the view's top to `pos` (log pixels). */
  moveTo(pos) {
    this.pos = Math.max(0, Math.min(this.maxPos, pos));
    this.place();
  }
  place() {
    this.scroller.scrollTop = this.pos >= this.maxPos ? this.maxTop : this.pos / this.ratio;
    this.setTop = this.scroller.scrollTop;
  }
  atBottom() { this.sync(); return this.pos + this.view >= this.logHeight - LINE_HEIGHT * 2; }
  /** Where, in the scroll area, the log pixel `y` is drawn now. */
  areaY(y) { return this.scroller.scrollTop + (y - this.pos); }
}

/** The log viewer: a window over the attempt's lines, fetched in pages as the reader scrolls
 *  (a million-line log is never loaded whole), line numbers that are #L links, stderr marked,
 *  what a terminal would show of each line (colours, `\r` overwrites), search on the server,
 *  and a live tail that follows new lines until the reader scrolls up. `onCount` hears the
 *  number of lines whenever it changes (the attempts table shows it live). */
export function logViewer(view, instance, info, onEnd, onCount = () => {}) {
  const base = "/api/v1/instances/" + instance.id;
  const attempt = info.attempt;
  let total = Number(info.logLines || 0);
  let ended = TERMINAL_INSTANCE.has(stateName(info.state));
  const pages = new Map(); // page index → array of lines (seq = index*PAGE_LINES + i + 1)
  const loading = new Set();
  const shown = new WeakMap(); // line → what a terminal shows of it
  let following = !ended;
  let highlighted = 0;
  let version = 0; // bumped when lines arrive: what paint() drew may be stale
  let drawnLines = "";

  const count = h("span", { class: "count", role: "status" });
  const search = h("input", { type: "search", placeholder: "Search this log", "aria-label": "Search this log" });
  const matchesEl = h("div", { class: "matches" });
  const followBtn = h("button", { type: "button", hidden: true }, "Follow new lines");
  const download = h("a", { href: base + "/logs/download?attempt=" + attempt, download: "", class: "button" }, "Download full log");
  const rows = h("div", { class: "log-rows" });
  const spacer = h("div", { class: "log-spacer" }, rows);
  const scroller = h("div", { class: "log", tabindex: "0", role: "log", "aria-label": "Log of attempt " + attempt }, spacer);
  const legend = h("p", { class: "legend" }, h("span", { class: "lg-out" }, "out"), " stdout · ", h("span", { class: "lg-err" }, "err"), " stderr");
  const place = new ScrollWindow(scroller);

  const setCount = () => {
    count.textContent = num(total) + " lines" + (ended ? "" : ", still running") + (following && !ended ? " · following" : "");
    if (place.lines !== total) {
      place.resize(total, spacer);
      scroller.style.setProperty("--ln-digits", String(Math.max(4, String(total).length)));
      onCount(total);
    }
  };

  const lineAt = seq => { const p = pages.get(Math.floor((seq - 1) / PAGE_LINES)); return p ? p[(seq - 1) % PAGE_LINES] : undefined; };
  const runsOf = line => { let runs = shown.get(line); if (!runs) { runs = terminalRuns(line.text || ""); shown.set(line, runs); } return runs; };

  const fetchPage = async index => {
    if (pages.has(index) && pages.get(index).length === PAGE_LINES) return;
    if (loading.has(index)) return;
    loading.add(index);
    try {
      const q = new URLSearchParams({ attempt, after: String(index * PAGE_LINES), limit: String(PAGE_LINES) });
      const answer = await api(base + "/logs?" + q);
      const have = pages.get(index) || [];
      const lines = answer.lines || [];
      if (lines.length >= have.length) { pages.set(index, lines); version += 1; }
      const last = lines.length ? Number(lines[lines.length - 1].seq) : 0;
      if (last > total) { total = last; setCount(); }
    } finally {
      loading.delete(index);
    }
    paint();
  };

  const paint = () => {
    place.sync();
    const top = place.pos, height = place.view;
    const first = Math.max(1, Math.floor(top / LINE_HEIGHT) - 20);
    const last = Math.min(total, Math.ceil((top + height) / LINE_HEIGHT) + 20);
    // The spacer clips rows past its end (app.css), so they never lengthen the scroll area.
    const rowsTop = place.areaY((first - 1) * LINE_HEIGHT);
    rows.style.transform = `translateY(${rowsTop}px)`;
    // A scroll that shows the same lines (sideways, or within a line) keeps the rows: a click
    // under way on one of them must not lose its element.
    const drawn = [first, last, highlighted, version].join();
    if (drawn === drawnLines) return;
    drawnLines = drawn;
    const want = new Set();
    const out = [];
    for (let seq = first; seq <= last; seq++) {
      const line = lineAt(seq);
      if (!line) { want.add(Math.floor((seq - 1) / PAGE_LINES)); }
      out.push(renderLine(seq, line));
    }
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
      const runs = runsOf(line);
      if (renderTerminal(text, runs, SHOWN_CHARS) || shownLength(runs) > SHOWN_CHARS) {
        text.append(h("button", { type: "button", class: "more", onclick: () => showWholeLine(seq, full, runs) }, "… show all " + num(full.length) + " characters"));
      }
    }
    el.append(text);
    return el;
  };

  const highlight = (seq, scroll = true) => {
    highlighted = seq;
    if (scroll) {
      following = false;
      place.moveTo((seq - 1) * LINE_HEIGHT - place.view / 3);
    }
    paint();
    setCount();
  };

  // Following ends when the reader leaves the bottom and resumes when they return to it. The
  // tail itself only ever scrolls to the bottom, so a scroll that ends elsewhere is the reader's.
  const moved = () => {
    if (!ended) {
      const bottom = place.atBottom();
      if (following && !bottom) { following = false; followBtn.hidden = false; setCount(); }
      else if (!following && bottom) { following = true; followBtn.hidden = true; setCount(); }
    }
    requestAnimationFrame(paint);
  };
  scroller.addEventListener("scroll", moved);
  // In a scaled scroll area the wheel and the keys move the log by their usual amounts.
  scroller.addEventListener("wheel", e => {
    if (!place.scaled || e.ctrlKey || Math.abs(e.deltaY) <= Math.abs(e.deltaX)) return;
    e.preventDefault();
    const unit = e.deltaMode === 1 ? LINE_HEIGHT : e.deltaMode === 2 ? place.view : 1;
    place.moveTo(place.pos + e.deltaY * unit);
    moved();
  }, { passive: false });
  scroller.addEventListener("keydown", e => {
    if (!place.scaled || e.altKey || e.ctrlKey || e.metaKey || e.target.tagName === "BUTTON") return;
    const page = place.view - LINE_HEIGHT;
    const to = { ArrowDown: place.pos + 40, ArrowUp: place.pos - 40, PageDown: place.pos + page, PageUp: place.pos - page,
      Home: 0, End: place.maxPos, " ": place.pos + (e.shiftKey ? -page : page) }[e.key];
    if (to === undefined || (e.key === " " && e.target !== scroller)) return;
    e.preventDefault();
    place.moveTo(to);
    moved();
  });
  const toBottom = () => { place.moveTo(place.maxPos); paint(); };
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
    const shownHits = list.childNodes.length;
    matchesEl.querySelector(".hit-count")?.remove();
    matchesEl.prepend(h("p", { class: "hit-count", role: "status" }, shownHits ? num(shownHits) + (found.length === 200 ? "+ matches" : " matches") + " for “" + q + "”" : "No line contains “" + q + "”."));
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
        if (following && !place.atBottom()) { following = false; followBtn.hidden = false; }
        for (const line of chunk.lines || []) {
          const seq = Number(line.seq), index = Math.floor((seq - 1) / PAGE_LINES);
          const page = pages.get(index) || [];
          page[(seq - 1) % PAGE_LINES] = line;
          pages.set(index, page);
          version += 1;
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

/** A line too long for the view, whole, as a terminal shows it, in a dialog. */
export function showWholeLine(seq, text, runs = terminalRuns(text)) {
  const pre = h("pre", {});
  renderTerminal(pre, runs);
  const dialog = h("dialog", { class: "whole-line", "aria-label": "Line " + seq },
    h("h2", {}, "Line " + seq + " (" + num(text.length) + " characters)"),
    pre,
    h("button", { type: "button", onclick: () => dialog.close(), autofocus: true }, "Close"));
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
}
