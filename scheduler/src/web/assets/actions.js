// Actions that change something ask first, then post and report.

import { alertBox, announce, h } from "./dom.js";
import { post } from "./api.js";

/** Asks before an action; resolves true when confirmed. */
export function confirmAction(title, text, verb) {
  return new Promise(resolve => {
    const dialog = h("dialog", { class: "confirm", "aria-labelledby": "confirm-title" },
      h("h2", { id: "confirm-title" }, title), h("p", {}, text),
      h("div", { class: "buttons" },
        h("button", { type: "button", class: "danger", onclick: () => { dialog.close("yes"); } }, verb),
        h("button", { type: "button", onclick: () => { dialog.close("no"); }, autofocus: true }, "Keep it")));
    dialog.addEventListener("close", () => { dialog.remove(); resolve(dialog.returnValue === "yes"); });
    document.body.append(dialog);
    dialog.showModal();
  });
}

/** A button that confirms, posts and reports. `after` gets the answer. */
export function actionButton(label, question, verb, path, body, after, attrs = {}) {
  const button = h("button", Object.assign({ type: "button" }, attrs), label);
  button.addEventListener("click", async () => {
    if (!(await confirmAction(label, question, verb))) return;
    button.disabled = true;
    try {
      const answer = await post(path, body);
      announce(label + ": done.");
      if (after) await after(answer);
    } catch (err) {
      alertBox(button.parentElement, label + " failed: " + err.message);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}
