// A task instance's page, its attempts and its log.

import { fill, h, kv, link, num, show, table } from "./dom.js";
import { TERMINAL_INSTANCE, chip, stateName, time } from "./format.js";
import { api, enc } from "./api.js";
import { itemsSection } from "./run.js";
import { logViewer } from "./logs.js";
import { markButton, markable } from "./marks.js";

export async function viewInstance(view, id) {
  let instance = await api("/api/v1/instances/" + id);
  if (view.left) return;
  const header = h("div"), attemptsEl = h("div"), logEl = h("div");
  let attempt = Number(new URLSearchParams(location.search).get("attempt")) || instance.attempt;
  const isItem = instance.item !== undefined && instance.item !== null;
  // A mapped task's own instance runs nowhere: its items are what ran. Any task's own
  // instance may be one; the section shows once a first page of items is found.
  const items = !isItem && !Number(instance.shardParentId) ? itemsSection(view, instance) : null;
  const renderHeader = () => {
    const s = stateName(instance.state);
    const current = (instance.attempts || []).find(a => a.attempt === instance.attempt) || {};
    const exit = TERMINAL_INSTANCE.has(s) && current.exitCode !== undefined && current.exitCode !== null ? "exit code " + current.exitCode : null;
    fill(header, 
      h("p", { class: "crumbs" }, link("/", "Workflows"), " / ", link("/workflows/" + enc(instance.workflow), instance.workflow), " / ", link("/runs/" + instance.runId, "run " + instance.runId), " / ",
        isItem ? [link("/instances/" + instance.shardParentId + "#items", instance.task), " / item " + (instance.shardIndex || 0)] : instance.task),
      h("h1", {}, "Task ", h("span", { class: "task-name" }, instance.task), " ", chip(s), exit ? h("span", { class: "exit" }, " " + exit) : null,
        current.signal ? h("span", { class: "exit" }, " signal " + current.signal) : null),
      isItem ? kv([["Item", h("code", {}, instance.item)], ["Index", (instance.shardIndex || 0) + " of " + num(instance.shardTotal)]]) : null,
      current.message ? h("p", { class: "message" }, current.message) : null,
      // A person's verdict here too: an item of a mapped task is marked on its own page.
      h("p", { class: "actions" }, ["SUCCESS", "FAILED"].filter(to => markable(s, to))
        .map(to => [markButton(to, isItem ? instance.task + " item " + (instance.shardIndex || 0) : instance.task, instance.id, () => reload()), " "])));
    fill(attemptsEl, h("h2", {}, "Attempts"), table(null, ["Attempt", "State", "Worker", "Node", "Dispatched", "Started", "Finished", "Exit code", "Signal", "Lines", "Message"],
      (instance.attempts || []).map(a => [
        a.attempt === attempt ? h("strong", {}, "attempt " + a.attempt + " (shown)") : link("/instances/" + instance.id + "?attempt=" + a.attempt, "attempt " + a.attempt),
        chip(a.state), a.workerId || (Number(a.childRunId) ? link("/runs/" + a.childRunId, "child run " + a.childRunId) : "–"), a.nodeId || "–", time(a.dispatchedAtMs), time(a.startedAtMs), time(a.finishedAtMs),
        a.exitCode !== undefined && a.exitCode !== null && TERMINAL_INSTANCE.has(stateName(a.state)) ? String(a.exitCode) : "–",
        a.signal ? String(a.signal) : "–", a.attempt === attempt ? linesCell(a) : num(a.logLines), a.message || "–"])));
  };
  // The shown attempt's line count follows its log's tail, so the table never says fewer lines
  // than the log shows; its state, start and end come from a light refresh when the tail sees
  // the attempt start or end.
  let tailLines = 0, refreshing = null;
  const liveLines = h("span", { class: "num" });
  const linesCell = a => { liveLines.textContent = num(Math.max(Number(a.logLines || 0), tailLines)); return liveLines; };
  const onCount = n => {
    tailLines = n;
    liveLines.textContent = num(Math.max(Number(attemptOf().logLines || 0), n));
    const s = stateName(attemptOf().state);
    if (n > 0 && s !== "RUNNING" && !TERMINAL_INSTANCE.has(s) && !refreshing) {
      refreshing = reload().catch(() => {}).finally(() => { refreshing = null; });
    }
  };
  renderHeader();
  const reload = async () => {
    instance = await api("/api/v1/instances/" + id);
    if (!view.left) { renderHeader(); viewer.setAttemptInfo(attemptOf()); }
  };
  const attemptOf = () => (instance.attempts || []).find(a => a.attempt === attempt) || { attempt, logLines: "0", state: instance.state };
  const viewer = logViewer(view, instance, attemptOf(), reload, onCount);
  logEl.append(viewer.el);
  const logTitle = h("h2", {}, "Log of attempt " + attempt);
  show(instance.task + " · run " + instance.runId, header, attemptsEl, items ? items.el : null, logTitle, logEl);
  if (items) {
    await items.load();
    // A mapped task's own instance never ran: no attempt, no log, only its items.
    if (!items.el.hidden && !(instance.attempts || []).length) [attemptsEl, logTitle, logEl].forEach(e => { e.hidden = true; });
  }
  viewer.start();
}
