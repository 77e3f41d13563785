// Workers and scheduler nodes.

import { fill, h, num, show, table } from "./dom.js";
import { chip, since, stateName } from "./format.js";
import { api, poll } from "./api.js";

export async function viewWorkers(view) {
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
