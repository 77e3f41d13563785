// What a terminal shows of one line of a task's output: SGR colours and styles, `\r`, backspace
// and the cursor moves of progress bars, and every other escape sequence (OSC window titles,
// hyperlinks, private modes) dropped whole. The download stays the raw bytes; this is only the
// view.

import { h } from "./dom.js";

/** Any C0 control but tab: each is a sequence's start, a cursor move, or dropped. */
const CONTROL = /[\x00-\x08\x0a-\x1f\x7f]/g;
/** CSI: parameters, intermediates, a final byte (ECMA-48 5.4). */
const CSI = /\x1b\[([0-?]*)([ -/]*)([@-~])/y;
const CSI_CUT = /\x1b\[[0-?]*[ -/]*/y;
/** Any other escape: intermediates, then a final byte (`ESC ( B`, `ESC =`, …). */
const ESCAPE = /\x1b[ -/]*[0-~]?/y;
/** OSC, DCS, SOS, PM and APC hold a string up to BEL or ST (`ESC \`). */
const STRING_START = new Set(["]", "P", "X", "^", "_"]);
/** Lines that move the cursor need the cell model; the others are written in order. */
const MOVES = /[\r\b]|\x1b\[[0-?]*[ -/]*[KGCD]/;

const NO_STYLE = Object.freeze({});

/** The runs of text a terminal shows for `text`, each `{ text, style }` (a frozen style object
 *  shared by equal neighbours). Text after a `\r` overwrites from column 0, as a terminal does:
 *  `10%\r20%\r100%` shows `100%`, and `text\r` (a CRLF line) shows `text`. */
export function terminalRuns(text) {
  if (!/[\x00-\x08\x0a-\x1f\x7f]/.test(text)) return text ? [{ text, style: NO_STYLE }] : [];
  const cells = MOVES.test(text) ? new Cells() : new Sequence();
  let style = NO_STYLE, i = 0;
  CONTROL.lastIndex = 0;
  while (i < text.length) {
    CONTROL.lastIndex = i;
    const found = CONTROL.exec(text);
    const at = found ? found.index : text.length;
    if (at > i) cells.write(text.slice(i, at), style);
    if (!found) break;
    const c = text[at];
    i = at + 1;
    if (c === "\r") cells.column(0);
    else if (c === "\b") cells.column(Math.max(0, cells.cursor - 1));
    else if (c === "\x1b") {
      const next = text[at + 1];
      if (next === "[") {
        CSI.lastIndex = at;
        const m = CSI.exec(text);
        if (!m) { CSI_CUT.lastIndex = at; CSI_CUT.exec(text); i = CSI_CUT.lastIndex; continue; }
        i = CSI.lastIndex;
        if (m[2]) continue;
        const params = m[1];
        if (m[3] === "m" && /^[0-9;:]*$/.test(params)) style = sgr(style, params);
        else if (/^[0-9;]*$/.test(params)) cells.csi(m[3], Number(params.split(";")[0] || 0));
      } else if (STRING_START.has(next)) {
        // Up to BEL or ST; unterminated, it swallows the rest of the line as a terminal would.
        const bel = text.indexOf("\x07", at + 2), st = text.indexOf("\x1b\\", at + 2);
        const ends = [bel >= 0 ? bel + 1 : Infinity, st >= 0 ? st + 2 : Infinity];
        i = Math.min(text.length, ...ends);
      } else {
        ESCAPE.lastIndex = at;
        ESCAPE.exec(text);
        i = Math.max(ESCAPE.lastIndex, at + 1);
      }
    }
    // Other controls (BEL, NUL, …) show nothing.
  }
  return cells.runs();
}

/** Output written in order: no cursor move. */
class Sequence {
  constructor() { this.out = []; this.cursor = 0; }
  write(text, style) {
    const last = this.out[this.out.length - 1];
    if (last && last.style === style) last.text += text; else this.out.push({ text, style });
    this.cursor += text.length;
  }
  column() { /* never called: MOVES routes such lines to Cells */ }
  csi() { /* no cursor move reaches here */ }
  runs() { return this.out; }
}

/** A line of cells under a cursor, one code point each. */
class Cells {
  constructor() { this.chars = []; this.styles = []; this.cursor = 0; }
  write(text, style) {
    for (const ch of text) {
      while (this.chars.length < this.cursor) { this.chars.push(" "); this.styles.push(NO_STYLE); }
      this.chars[this.cursor] = ch;
      this.styles[this.cursor] = style;
      this.cursor += 1;
    }
  }
  column(n) { this.cursor = n; }
  /** Erase in line (K), cursor to column (G), forward (C), back (D). */
  csi(final, n) {
    if (final === "K") {
      if (n === 0) { this.chars.length = Math.min(this.chars.length, this.cursor); this.styles.length = this.chars.length; }
      else if (n === 1) for (let j = 0; j <= this.cursor && j < this.chars.length; j++) { this.chars[j] = " "; this.styles[j] = NO_STYLE; }
      else if (n === 2) { this.chars.length = 0; this.styles.length = 0; }
    } else if (final === "G") this.cursor = Math.max(0, n - 1);
    else if (final === "C") this.cursor += Math.max(1, n);
    else if (final === "D") this.cursor = Math.max(0, this.cursor - Math.max(1, n));
  }
  runs() {
    const out = [];
    for (let j = 0; j < this.chars.length; j++) {
      const last = out[out.length - 1];
      if (last && last.style === this.styles[j]) last.text += this.chars[j];
      else out.push({ text: this.chars[j], style: this.styles[j] });
    }
    return out;
  }
}

/** 256-colour index to a CSS colour (0–15 stay palette indexes, drawn by classes). */
function color256(n) {
  if (n < 16) return n;
  if (n >= 232) { const v = 8 + (n - 232) * 10; return `rgb(${v},${v},${v})`; }
  const c = n - 16, r = Math.floor(c / 36), g = Math.floor(c / 6) % 6, b = c % 6, f = x => x ? 55 + x * 40 : 0;
  return `rgb(${f(r)},${f(g)},${f(b)})`;
}

/** The style after an SGR sequence's parameters. */
function sgr(style, params) {
  const codes = params === "" ? [0] : params.split(/[;:]/).map(Number);
  const s = { ...style };
  for (let i = 0; i < codes.length; i++) {
    const c = codes[i];
    if (c === 0) { for (const k of Object.keys(s)) delete s[k]; }
    else if (c === 1) s.bold = true;
    else if (c === 2) s.dim = true;
    else if (c === 3) s.italic = true;
    else if (c === 4) s.underline = true;
    else if (c === 7) s.inverse = true;
    else if (c === 22) { delete s.bold; delete s.dim; }
    else if (c === 23) delete s.italic;
    else if (c === 24) delete s.underline;
    else if (c === 27) delete s.inverse;
    else if (c >= 30 && c <= 37) s.fg = c - 30;
    else if (c >= 90 && c <= 97) s.fg = c - 90 + 8;
    else if (c === 39) delete s.fg;
    else if (c >= 40 && c <= 47) s.bg = c - 40;
    else if (c >= 100 && c <= 107) s.bg = c - 100 + 8;
    else if (c === 49) delete s.bg;
    else if ((c === 38 || c === 48) && codes[i + 1] === 5) { s[c === 38 ? "fg" : "bg"] = color256(codes[i + 2] || 0); i += 2; }
    else if ((c === 38 || c === 48) && codes[i + 1] === 2) { s[c === 38 ? "fg" : "bg"] = `rgb(${codes[i + 2] || 0},${codes[i + 3] || 0},${codes[i + 4] || 0})`; i += 4; }
  }
  return Object.keys(s).length ? Object.freeze(s) : NO_STYLE;
}

/** Black or white, whichever reads on an `rgb(r,g,b)` background. */
function readableOn(css) {
  const m = /rgb\((\d+),(\d+),(\d+)\)/.exec(css);
  if (!m) return null;
  const lin = v => { const x = Number(v) / 255; return x <= 0.03928 ? x / 12.92 : ((x + 0.055) / 1.055) ** 2.4; };
  const l = 0.2126 * lin(m[1]) + 0.7152 * lin(m[2]) + 0.0722 * lin(m[3]);
  return l > 0.179 ? "#000000" : "#ffffff";
}

/** A run as an element. A run with a background keeps the task's pair as chosen (class
 *  `a-on`: the terminal's colours, the same in both themes, and a readable default text colour
 *  on each background); a run without one takes colours tuned to the theme. */
function runElement(run) {
  const s = run.style;
  if (s === NO_STYLE) return document.createTextNode(run.text);
  let fg = s.fg, bg = s.bg;
  const classes = [];
  if (s.inverse) {
    [fg, bg] = [bg, fg];
    if (bg === undefined) classes.push("a-inverse");
  }
  if (typeof fg === "number") classes.push("a-fg" + fg);
  if (typeof bg === "number") classes.push("a-bg" + bg);
  if (bg !== undefined || s.inverse) classes.push("a-on");
  if (s.bold) classes.push("a-bold");
  if (s.dim) classes.push("a-dim");
  if (s.italic) classes.push("a-italic");
  if (s.underline) classes.push("a-underline");
  const span = h("span", { class: classes.join(" ") }, run.text);
  if (typeof fg === "string") span.style.color = fg;
  if (typeof bg === "string") {
    span.style.backgroundColor = bg;
    if (fg === undefined && readableOn(bg)) span.style.color = readableOn(bg);
  }
  if (s.inverse && fg === undefined) span.style.color = "var(--panel)";
  return span;
}

/** Appends to `el` what a terminal shows of `text`, at most `max` characters of it; returns
 *  whether some was left out. */
export function renderTerminal(el, runs, max = Infinity) {
  let left = max;
  for (const run of runs) {
    if (left <= 0) return true;
    const piece = run.text.length > left ? { text: run.text.slice(0, left), style: run.style } : run;
    el.append(runElement(piece));
    left -= piece.text.length;
  }
  return false;
}

/** The length of what a terminal shows. */
export const shownLength = runs => runs.reduce((n, run) => n + run.text.length, 0);
