// Why a workflow ran or did not, at a time. Every time on the page is in the workflow's own
// zone, the one its schedule and the node's explanations are written in; the page's zone is
// shown beside a slot when it differs.

import { h, kv, link, show, table } from "./dom.js";
import { chip, fmtTime, fromInput, slotTime, toInput } from "./format.js";
import { api, enc } from "./api.js";
import { go } from "./router.js";
import { scheduleText } from "./workflows.js";

export async function viewWhy(view, name) {
  const at = new URLSearchParams(location.search).get("at");
  const explanation = await api("/api/v1/workflows/" + enc(name) + "/why" + (at ? "?at=" + enc(at) : ""));
  if (view.left) return;
  const s = explanation.schedule || {};
  const zone = explanation.timezone || s.timezone || "UTC";
  // The field shows the time explained, so a second question starts from the first.
  const input = h("input", { type: "datetime-local", id: "why-at", step: "1", value: at ? toInput(explanation.atMs, zone) : "" });
  const form = h("form", { class: "toolbar", onsubmit: e => {
    e.preventDefault();
    const ms = fromInput(input.value, zone);
    go("/workflows/" + enc(name) + "/why" + (ms ? "?at=" + ms : ""));
  } }, h("label", { for: "why-at" }, "At (" + zone + ") "), input, h("button", { type: "submit" }, "Explain"),
    at ? [" ", link("/workflows/" + enc(name) + "/why", "Now")] : null);
  const decisions = explanation.decisions || [];
  show("Why · " + name,
    h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(name), name), " / why"),
    h("h1", {}, "Why did ", name, " run or not?"), form,
    h("p", {}, at ? "At " : "Now, ", slotTime(explanation.atMs, zone)),
    h("ul", { class: "verdict" }, (explanation.verdict || []).map(v => h("li", {}, v))),
    kv([["Schedule", scheduleText(s)], ["Paused", s.paused ? "yes" : "no"], ["Previous slot", slotTime(s.previousSlotMs, zone)], ["Next slot", slotTime(s.nextSlotMs, zone)],
      ["Misfire", s.misfire || "–"], ["Overlap", s.overlap || "–"],
      ["Nearest run", explanation.run ? link("/runs/" + explanation.run.id, "run " + explanation.run.id) : "none"]]),
    h("h2", {}, "Tasks"), table(null, ["Task", "State", "Reason"], (explanation.tasks || []).map(t => [t.instanceId && t.instanceId !== "0" ? link("/instances/" + t.instanceId, t.task) : t.task, t.state === "-" ? "–" : chip(t.state), t.text || t.reason])),
    h("h2", {}, "Decisions"),
    decisions.length
      ? table(null, ["At (" + zone + ")", "Kind", "What happened"], decisions.map(d => [h("time", { datetime: new Date(Number(d.atMs)).toISOString() }, fmtTime(d.atMs, zone)), d.kind, d.text]))
      : h("p", { class: "muted" }, "No decision is recorded around this time."));
}
