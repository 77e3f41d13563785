// The audit trail.

import { h, show, table } from "./dom.js";
import { time } from "./format.js";
import { api } from "./api.js";
import { go } from "./router.js";

export async function viewAudit(view) {
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
