// Elements made safely (every value a text node), and the page's common pieces.

/** An element: attributes (on* are listeners, class/text/style are special) and children;
 *  strings and numbers become text nodes. */
export function h(tag, attrs, ...children) {
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
export const SVG_TAGS = new Set(["svg", "g", "rect", "path", "text", "tspan", "title"]);

export function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function svgLink(href, attrs, ...children) {
  const a = document.createElementNS("http://www.w3.org/2000/svg", "a");
  a.setAttribute("href", href);
  for (const [k, v] of Object.entries(attrs)) a.setAttribute(k, v);
  append(a, children);
  return a;
}

export const link = (href, ...children) => h("a", { href }, ...children);
export const num = n => Number(n || 0).toLocaleString("en-US");
export const main = () => document.getElementById("main");

export function announce(text) {
  const el = document.getElementById("announce");
  el.textContent = "";
  setTimeout(() => { el.textContent = text; }, 50);
}

/** Replaces an element's children, skipping the absent ones (null, false, undefined). A
 *  control focused inside keeps the focus when the new children hold the same control (same
 *  tag and name), so a live refresh never throws a keyboard user back to the page's top; when
 *  the control is gone, the focus stays in `el`. */
export function fill(el, ...children) {
  const focused = document.activeElement;
  const held = focused && focused !== el && el.contains(focused) ? { tag: focused.tagName, name: nameOf(focused), path: pathOf(el, focused) } : null;
  el.replaceChildren();
  append(el, children);
  if (held) refocus(el, held);
}

const nameOf = el => el.getAttribute("aria-label") || el.id || el.textContent.trim();

function pathOf(root, node) {
  const steps = [];
  for (let n = node; n && n !== root; n = n.parentElement) steps.unshift([...n.parentElement.children].indexOf(n));
  return steps;
}

function refocus(root, held) {
  let at = root;
  for (const i of held.path) at = at && at.children[i];
  const same = e => e && e.tagName === held.tag && nameOf(e) === held.name;
  const target = same(at) ? at : [...root.querySelectorAll(held.tag)].find(same);
  if (target) { target.focus({ preventScroll: true }); return; }
  if (!root.hasAttribute("tabindex")) root.setAttribute("tabindex", "-1");
  root.focus({ preventScroll: true });
}

/** Whether `data` is what `el` last showed (and notes it): a refresh that brings nothing new
 *  leaves the page as it is. */
export function unchanged(el, data) {
  const text = JSON.stringify(data);
  if (shown.get(el) === text) return true;
  shown.set(el, text);
  return false;
}
const shown = new WeakMap();

export function show(title, ...children) {
  document.title = title + " · ax";
  const el = main();
  el.replaceChildren(...children.flat().filter(Boolean).map(c => c instanceof Node ? c : document.createTextNode(String(c))));
}

export function table(caption, headers, rows, attrs = {}) {
  return h("table", attrs,
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, headers.map(x => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows.map(cells => h("tr", {}, cells.map(c => h("td", {}, c))))));
}

export function kv(pairs) {
  return h("dl", { class: "kv" }, pairs.filter(Boolean).map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}

export function button(label, onClick) {
  const b = h("button", { type: "button" }, label);
  b.addEventListener("click", onClick);
  return b;
}

export function alertBox(where, text) {
  const old = where.querySelector(":scope > .error");
  if (old) old.remove();
  where.append(h("p", { class: "error", role: "alert" }, text));
}
