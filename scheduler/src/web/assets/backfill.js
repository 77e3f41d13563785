// A backfill: the cron slots of a range, previewed (a dry run of BackfillWorkflow, each slot in
// the workflow's own zone and the page's, with the run it already has), then created.

import { announce, h, link, num, show } from "./dom.js";
import { api, enc, post } from "./api.js";
import { confirmAction } from "./actions.js";
import { chip, fmtTime, fromInput, shownZone, toInput } from "./format.js";

const DAY_MS = 86_400_000;

/** "1 run", "2 runs". */
const count = (n, one, many) => num(n) + " " + (Number(n) === 1 ? one : many);

/** The slots of a dry run or a backfill as a table: the slot in the workflow's zone, in the
 *  page's zone, and its run (or that it has none yet). */
function slotsTable(caption, slots, ownZone, pageZone) {
  const rows = slots.map((slot, i) => {
    const at = Number(slot.logicalTimeMs);
    const run = slot.run;
    return h("tr", { "data-ms": String(at), "data-run": run ? String(run.id) : "" },
      h("td", {}, String(i + 1)),
      h("td", {}, h("time", { datetime: new Date(at).toISOString() }, fmtTime(at, ownZone))),
      h("td", {}, h("time", { datetime: new Date(at).toISOString() }, fmtTime(at, pageZone))),
      h("td", {}, run ? [link("/runs/" + run.id, "Run " + run.id), " ", chip(run.state)] : "none yet"),
      h("td", {}, slot.created ? "created now" : run ? "had a run already" : "would be created"));
  });
  return h("table", { class: "slots" }, h("caption", {}, caption),
    h("thead", {}, h("tr", {}, ["#", "Slot (" + ownZone + ", the schedule's zone)", "Slot (" + pageZone + ")", "Run", "Outcome"].map(x => h("th", { scope: "col" }, x)))),
    h("tbody", {}, rows));
}

export async function viewBackfill(view, name) {
  const workflow = await api("/api/v1/workflows/" + enc(name));
  if (view.left) return;
  const schedule = workflow.schedule || {};
  const ownZone = schedule.timezone || "UTC";
  const pageZone = shownZone();
  const cron = String(schedule.trigger || "").endsWith("CRON") && schedule.cron;
  const now = Date.now();
  const from = h("input", { type: "datetime-local", id: "bf-from", step: "1", value: toInput(now - DAY_MS, pageZone), "aria-describedby": "bf-zone" });
  const to = h("input", { type: "datetime-local", id: "bf-to", step: "1", value: toInput(now, pageZone), "aria-describedby": "bf-zone" });
  const result = h("div", { id: "bf-result", "aria-live": "polite" });
  const preview = h("button", { type: "submit", class: "primary" }, "Preview");
  const refused = (what, err) => result.replaceChildren(h("p", { class: "error", role: "alert" }, what + " was refused: " + err.message));

  /** The range as the API takes it, or a refusal said here. */
  const range = () => {
    const fromMs = fromInput(from.value, pageZone), toMs = fromInput(to.value, pageZone);
    if (!fromMs || !toMs) {
      result.replaceChildren(h("p", { class: "error", role: "alert" }, "Give both ends of the range, a date and a time each."));
      return null;
    }
    return { fromMs: String(fromMs), toMs: String(toMs) };
  };

  const create = async (asked, fresh) => {
    const question = "Create " + count(fresh, "run", "runs") + " of " + name + ", one per slot from " +
      fmtTime(asked.fromMs, pageZone) + " to " + fmtTime(asked.toMs, pageZone) + "? Slots that have a run keep it.";
    const verb = "Create " + count(fresh, "run", "runs");
    if (!(await confirmAction(verb, question, verb))) return;
    try {
      const answer = await post("/api/v1/workflows/" + enc(name) + "/backfill", asked);
      if (view.left) return;
      announce(count(answer.created, "run", "runs") + " created.");
      result.replaceChildren(
        h("p", { role: "status", class: "done" }, count(answer.created, "run", "runs") + " created; " + count(answer.existing, "slot", "slots") + " had a run already."),
        slotsTable("The backfill's slots and their runs", answer.slots || [], ownZone, pageZone));
    } catch (err) {
      refused("The backfill", err);
    }
  };

  const form = h("form", { class: "backfill", onsubmit: async e => {
    e.preventDefault();
    const asked = range();
    if (!asked) return;
    preview.disabled = true;
    try {
      const answer = await post("/api/v1/workflows/" + enc(name) + "/backfill", Object.assign({ dryRun: true }, asked));
      if (view.left) return;
      const slots = answer.slots || [];
      const fresh = slots.filter(s => !s.run).length;
      const summary = slots.length
        ? count(slots.length, "slot", "slots") + ": " + num(fresh) + " would get a new run, " + num(slots.length - fresh) + (slots.length - fresh === 1 ? " has" : " have") + " one already."
        : "No slot of the schedule falls in this range.";
      const go = fresh
        ? h("button", { type: "button", class: "primary", onclick: () => create(asked, fresh) }, "Create " + fresh + " run" + (fresh === 1 ? "" : "s"))
        : null;
      result.replaceChildren(h("p", { role: "status" }, summary),
        slots.length ? slotsTable("Preview: the slots from " + fmtTime(asked.fromMs, pageZone) + " to " + fmtTime(asked.toMs, pageZone), slots, ownZone, pageZone) : null,
        go);
    } catch (err) {
      refused("The preview", err);
    } finally {
      preview.disabled = false;
    }
  } },
    h("div", { class: "field" }, h("label", { for: "bf-from" }, "From"), " ", from),
    h("div", { class: "field" }, h("label", { for: "bf-to" }, "To"), " ", to),
    h("p", { id: "bf-zone", class: "muted" }, "Both ends are included and read in ", h("strong", { class: "zone-name" }, pageZone),
      pageZone === "UTC" ? "" : " (this browser's zone)", "; the header's zone button switches zones. The slots are the schedule's, in ", ownZone, "."),
    preview);

  show("Backfill · " + name, h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(name), name), " / backfill"),
    h("h1", {}, "Backfill ", name),
    h("p", {}, cron ? ["One run per slot of ", h("code", {}, schedule.cron), " (", ownZone, ") in a range; a slot that already has a run keeps it."]
      : h("span", { class: "warn" }, name + " has no cron schedule: a backfill needs one to know its slots.")),
    form, result);
}
