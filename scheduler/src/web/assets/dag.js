// A workflow's task graph, drawn as SVG from the node's layout.

import { h, svgLink } from "./dom.js";
import { STATES, stateName } from "./format.js";
import { api, enc } from "./api.js";

/** Transitive upstream and downstream of each node, from the edges. */
export function reach(nodes, edges) {
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
export function dagView(dag, options = {}) {
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
      h("text", { x: 10, y: 35, class: "sub" }, state ? subState(state) : n.handler ? n.handler : n.isolated ? "isolated" : ""),
      h("title", { "aria-hidden": "true" }, label(n)));
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
  // The graph is one tab stop, whatever its size: the arrow keys move between its nodes (by
  // their places in the drawing), Home and End go to the first and the last.
  let roving = dag.nodes.length ? dag.nodes[0].task : null;
  const stop = task => { const g = nodeEls.get(task); return g && (g.parentNode.tagName.toLowerCase() === "a" ? g.parentNode : g); };
  const rove = () => { for (const n of dag.nodes) { const el = stop(n.task); if (el) el.setAttribute("tabindex", n.task === roving ? "0" : "-1"); } };
  const nearest = (from, key) => {
    const dir = { ArrowRight: [1, 0], ArrowLeft: [-1, 0], ArrowDown: [0, 1], ArrowUp: [0, -1] }[key];
    let best = null, bestCost = Infinity;
    for (const n of dag.nodes) {
      const dx = n.x - from.x, dy = n.y - from.y;
      const along = dx * dir[0] + dy * dir[1], across = Math.abs(dx * dir[1]) + Math.abs(dy * dir[0]);
      if (along <= 0) continue;
      const cost = along + across * 3;
      if (cost < bestCost) { best = n; bestCost = cost; }
    }
    return best;
  };
  nodesLayer.addEventListener("keydown", event => {
    const from = byTask.get(roving);
    if (!from) return;
    let to = null;
    if (event.key === "Home") to = dag.nodes[0];
    else if (event.key === "End") to = dag.nodes[dag.nodes.length - 1];
    else if (event.key.startsWith("Arrow")) to = nearest(from, event.key);
    else return;
    event.preventDefault();
    if (!to) return;
    roving = to.task;
    rove();
    stop(to.task).focus();
  });
  nodesLayer.addEventListener("focusin", event => {
    const g = event.target.closest("[data-task]") || event.target.querySelector?.("[data-task]");
    if (g && g.dataset.task !== roving) { roving = g.dataset.task; rove(); }
  });
  rove();
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
        g.querySelector(".sub").replaceChildren(...subState(state));
        g.querySelector("title").textContent = label(n);
        const holder = g.parentNode;
        if (holder && holder.tagName.toLowerCase() === "a") holder.setAttribute("aria-label", label(n));
        else g.setAttribute("aria-label", label(n));
        if (s.instanceId && s.instanceId !== "0" && holder && holder.tagName.toLowerCase() !== "a") {
          const a = svgLink("/instances/" + s.instanceId, { "aria-label": label(n), class: "node-link" });
          holder.replaceChild(a, g);
          g.removeAttribute("tabindex"); g.removeAttribute("role"); g.removeAttribute("aria-label");
          a.append(g);
          a.setAttribute("tabindex", task === roving ? "0" : "-1");
        }
      }
    },
  };
}

/** A node's state line: the glyph hidden from assistive technology, so the text read out
 *  ("SUCCESS") is the one the node's name ("task X: SUCCESS") contains (its hover title is
 *  hidden from it too, being the name again). */
function subState(state) {
  return [h("tspan", { "aria-hidden": "true" }, STATES[state] || ""), " " + state];
}
