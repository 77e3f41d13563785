// Triggering a run by hand: a field per declared param (its default filled in), free params
// beside them, an idempotency key and a logical time read in the page's zone.

import { announce, h, link, show } from "./dom.js";
import { api, enc, post } from "./api.js";
import { go } from "./router.js";
import { fromInput, shownZone } from "./format.js";

/** The field of one declared param: a select when it has choices, else a text input. Its
 *  value is what the run gets, so the default is filled in; "required" is said in the label
 *  and marked for assistive technology, and left to the API to enforce (its refusal names
 *  the param, and is shown as it says it). */
function declaredField(param, i) {
  const id = "param-" + i;
  const helpId = id + "-help";
  const help = [param.description, param.hasDefault ? "Default: " + (param.defaultValue === "" ? "(empty)" : param.defaultValue) : null]
    .filter(Boolean).join(" · ");
  const attrs = { id, class: "declared", "data-name": param.name, "aria-required": param.required ? "true" : null, "aria-describedby": help ? helpId : null };
  let input;
  if ((param.choices || []).length) {
    const options = param.choices.map(choice => h("option", { value: choice, selected: param.hasDefault && choice === param.defaultValue }, choice));
    // Without a default, nothing is chosen until the user chooses.
    if (!param.hasDefault) options.unshift(h("option", { value: "", selected: true }, param.required ? "choose one" : "(none)"));
    input = h("select", attrs, options);
  } else {
    input = h("input", Object.assign({ type: "text", value: param.hasDefault ? param.defaultValue : "", autocomplete: "off" }, attrs));
  }
  return h("div", { class: "field" },
    h("label", { for: id }, h("code", {}, param.name), param.required ? h("span", { class: "req" }, " (required)") : null),
    " ", input,
    help ? h("span", { id: helpId, class: "muted help" }, " ", help) : null);
}

/** What the declared fields send: each field's value as it stands, an emptied default
 *  included (an empty value is a value); a field left empty that has no default and is not
 *  required sends nothing, as if the param were not declared. */
function declaredValues(fields, declared) {
  const params = {};
  for (const field of fields) {
    const param = declared.find(p => p.name === field.dataset.name);
    const value = field.value;
    if (value === "" && param && !param.required && !param.hasDefault) continue;
    params[field.dataset.name] = value;
  }
  return params;
}

export async function viewTrigger(view, name) {
  const workflow = await api("/api/v1/workflows/" + enc(name));
  if (view.left) return;
  const declared = workflow.params || [];
  const declaredFields = declared.map(declaredField);
  const rowsEl = h("div", { class: "params" });
  const addRow = (k = "", v = "") => {
    const n = rowsEl.childNodes.length + 1;
    const row = h("div", { class: "param" },
      h("input", { type: "text", class: "pk", value: k, "aria-label": "Param " + n + " name", placeholder: "name" }), " = ",
      h("input", { type: "text", class: "pv", value: v, "aria-label": "Param " + n + " value", placeholder: "value" }),
      h("button", { type: "button", onclick: () => row.remove(), "aria-label": "Remove param " + n }, "Remove"));
    rowsEl.append(row);
  };
  if (!declared.length) addRow();
  const key = h("input", { type: "text", id: "idem", placeholder: "optional", autocomplete: "off" });
  const zone = shownZone();
  const logical = h("input", { type: "datetime-local", id: "logical", step: "1", "aria-describedby": "logical-help" });
  const errors = h("div", { id: "trigger-errors" });
  const refuse = (message, field) => {
    errors.replaceChildren(h("p", { class: "error", role: "alert" }, message));
    for (const el of document.querySelectorAll("[aria-invalid]")) el.removeAttribute("aria-invalid");
    if (field) { field.setAttribute("aria-invalid", "true"); field.focus(); }
  };
  const submit = h("button", { type: "submit", class: "primary" }, "Trigger " + workflow.name);
  const form = h("form", { onsubmit: async e => {
    e.preventDefault();
    const params = {};
    for (const row of rowsEl.querySelectorAll(".param")) {
      const k = row.querySelector(".pk").value.trim(), v = row.querySelector(".pv").value;
      if (!k) continue;
      if (declared.some(p => p.name === k)) {
        refuse("Param " + k + " is declared above: set it in its own field.", row.querySelector(".pk"));
        return;
      }
      params[k] = v;
    }
    Object.assign(params, declaredValues(declaredFields.map(f => f.querySelector(".declared")), declared));
    const body = { params, idempotencyKey: key.value.trim() };
    if (logical.value) {
      const ms = fromInput(logical.value, zone);
      if (!ms) { refuse("The logical time " + JSON.stringify(logical.value) + " is not a date and time.", logical); return; }
      body.logicalTimeMs = String(ms);
    }
    submit.disabled = true;
    try {
      const answer = await post("/api/v1/workflows/" + enc(name) + "/trigger", body);
      announce(answer.created ? "Run " + answer.run.id + " created." : "Run " + answer.run.id + " already existed for that key.");
      go("/runs/" + answer.run.id);
    } catch (err) {
      // The API's refusal names the param at fault (`param "env"`): that field is marked.
      const named = /param "([^"]+)"/.exec(err.message || "");
      const field = named && declaredFields.map(f => f.querySelector(".declared")).find(f => f.dataset.name === named[1]);
      refuse("The trigger was refused: " + err.message, field);
    } finally {
      submit.disabled = false;
    }
  } },
    declared.length
      ? h("fieldset", { class: "declared-params" }, h("legend", {}, "Params this workflow declares"), declaredFields)
      : null,
    h("fieldset", {}, h("legend", {}, declared.length ? "Other params" : "Params", " (the tasks see them as AX_PARAM_<NAME>)"), rowsEl,
      h("button", { type: "button", onclick: () => addRow() }, "Add a param")),
    h("div", { class: "field" }, h("label", { for: "idem" }, "Idempotency key"), " ", key,
      h("span", { class: "muted" }, " A repeated key returns the run the first trigger made.")),
    h("div", { class: "field" }, h("label", { for: "logical" }, "Logical time"), " ", logical,
      h("span", { id: "logical-help", class: "muted" }, " in ", h("strong", { class: "zone-name" }, zone),
        zone === "UTC" ? "" : " (this browser's zone)", "; empty: now. The header's zone button switches zones.")),
    errors, submit);
  show("Trigger · " + name, h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(name), name), " / trigger"),
    h("h1", {}, "Trigger ", name), form);
}
