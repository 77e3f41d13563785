// Signing in with a token, and who the node sees.

import { h, show } from "./dom.js";
import { api, post } from "./api.js";
import { route } from "./router.js";

/** Shows who the node sees (the token's name and role) and the sign-out button, when the
 *  node asks for tokens. */
export async function showIdentity() {
  const who = document.getElementById("who");
  const out = document.getElementById("sign-out");
  let identity = {};
  try { identity = await api("/api/v1/whoami"); } catch (_) { /* signed out: the page asks */ }
  const signedIn = Boolean(identity.authentication && identity.token);
  who.textContent = signedIn ? identity.token + " (" + identity.role + (identity.app ? ", app " + identity.app : "") + ")" : "";
  who.hidden = !signedIn;
  out.hidden = !signedIn;
}

/** The node asks for a token: a form that posts it; the node keeps it in a session cookie, so
 *  the browser forgets it when its session ends. */
export function signIn(message) {
  const input = h("input", { id: "token", type: "password", autocomplete: "off", required: true, size: 50 });
  const error = h("p", { class: "error", role: "alert", hidden: true });
  const form = h("form", { class: "sign-in" },
    h("p", {}, h("label", { for: "token" }, "Token "), input, " ", h("button", { type: "submit", class: "primary" }, "Sign in")),
    error);
  form.addEventListener("submit", async event => {
    event.preventDefault();
    try {
      await post("/api/v1/session", { token: input.value.trim() });
      input.value = "";
      await showIdentity();
      await route();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
      input.focus();
    }
  });
  show("Sign in", h("h1", {}, "Sign in"), h("p", {}, message),
    h("p", { class: "muted" }, "Paste a token made with axctl token create. It is kept for this browser session only."), form);
  input.focus();
}

document.getElementById("sign-out").addEventListener("click", async () => {
  await api("/api/v1/session", { method: "DELETE" });
  await showIdentity();
  signIn("Signed out.");
});
