// A person's verdict on a task: "Mark success" / "Mark failed", asked with a reason (required:
// the audit trail keeps it), and the run page's selection of tasks to clear and rerun.

import { alertBox, announce, h } from "./dom.js";
import { post } from "./api.js";

let dialogs = 0;

/** Asks for a reason before an action; resolves the trimmed reason, or null when cancelled.
 *  The verb's button stays disabled until a reason is written. */
export function askReason(title, text, verb) {
  return new Promise(resolve => {
    const n = ++dialogs;
    const field = h("textarea", { id: "reason-" + n, rows: 3, required: true, maxlength: 500, "aria-describedby": "reason-help-" + n });
    const go = h("button", { type: "submit", class: "danger", disabled: true }, verb);
    field.addEventListener("input", () => { go.disabled = !field.value.trim(); });
    const form = h("form", { method: "dialog" },
      h("p", {}, text),
      h("label", { for: "reason-" + n }, "Reason"),
      h("p", { id: "reason-help-" + n, class: "muted" }, "Required: say why the outcome is overridden. It is kept in the audit trail."),
      field,
      h("div", { class: "buttons" }, go,
        h("button", { type: "button", onclick: () => dialog.close("no") }, "Keep it")));
    form.addEventListener("submit", event => {
      event.preventDefault();
      if (field.value.trim()) dialog.close("yes");
    });
    const dialog = h("dialog", { class: "confirm reason", "aria-labelledby": "reason-title-" + n },
      h("h2", { id: "reason-title-" + n }, title), form);
    dialog.addEventListener("close", () => {
      dialog.remove();
      resolve(dialog.returnValue === "yes" ? field.value.trim() : null);
    });
    document.body.append(dialog);
    dialog.showModal();
    field.focus();
  });
}

/** "Mark success" or "Mark failed" for one task's instance: asks for the reason, posts the mark
 *  and calls `after`. Its accessible name starts with its visible text and names the task. */
export function markButton(state, task, instanceId, after) {
  const label = state === "SUCCESS" ? "Mark success" : "Mark failed";
  const button = h("button", { type: "button", "aria-label": label + ": " + task, "data-mark": state.toLowerCase() }, label);
  button.addEventListener("click", async () => {
    const reason = await askReason(label + ": " + task,
      state === "SUCCESS"
        ? "Mark task " + task + " SUCCESS without running it? A running attempt is killed; what depends on it runs."
        : "Mark task " + task + " FAILED? A running attempt is killed and is not retried; what needs it does not run.",
      label);
    if (reason === null) return;
    button.disabled = true;
    try {
      await post("/api/v1/instances/" + instanceId + "/mark", { state: "INSTANCE_STATE_" + state, reason });
      announce(label + " " + task + ": done.");
      if (after) await after();
    } catch (err) {
      alertBox(button.parentElement, label + " failed: " + err.message);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

/** Whether an instance in `state` may be marked `to` (the core's rule: not to the state it has,
 *  not while PENDING). */
export function markable(state, to) {
  return state !== to && state !== "PENDING";
}
