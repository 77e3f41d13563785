/**
 * A task's outputs: what it writes to the file named by $AX_OUTPUT, read as the Rust worker reads
 * it (`ax_core::outputs`).
 *
 * `KEY=VALUE` lines and `KEY<<DELIMITER` ... `DELIMITER` blocks (GitHub Actions' $GITHUB_OUTPUT
 * format); a key is `[A-Za-z_][A-Za-z0-9_]*`, a key written twice keeps its last value, blank
 * lines are ignored. A file larger than MAX_ATTEMPT_BYTES or not in that form is refused whole,
 * naming the line, with the Rust worker's words: a truncated value is a wrong one.
 */

import { randomBytes } from "node:crypto";

/** The most bytes of $AX_OUTPUT one attempt may pass on. */
export const MAX_ATTEMPT_BYTES = 64 * 1024;

const KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** $AX_OUTPUT cannot be read as outputs, or a value cannot be written as one. */
export class OutputsError extends Error {
  override name = "OutputsError";
}

/** Whether `key` may name an output (and so an environment variable). */
export function isOutputName(key: string): boolean {
  return KEY.test(key);
}

/** Rust's `{:?}` of a string, for the same error text. */
function quoted(text: string): string {
  return JSON.stringify(text);
}

/** Rust's `str::lines`: split at '\n', one '\r' before it dropped, no empty last line. */
function lines(text: string): string[] {
  const parts = text.split("\n");
  if (parts.length > 0 && parts[parts.length - 1] === "") parts.pop();
  return parts.map((line) => (line.endsWith("\r") ? line.slice(0, -1) : line));
}

/** The outputs in the bytes of $AX_OUTPUT. */
export function parseOutputs(data: Uint8Array): Record<string, string> {
  if (data.length > MAX_ATTEMPT_BYTES) {
    throw new OutputsError(
      `$AX_OUTPUT holds ${data.length} bytes, more than the ${MAX_ATTEMPT_BYTES} an attempt may pass on`,
    );
  }
  let text: string;
  try {
    text = new TextDecoder("utf-8", { fatal: true }).decode(data);
  } catch {
    throw new OutputsError("$AX_OUTPUT is not UTF-8 text");
  }
  const outputs: Record<string, string> = {};
  const all = lines(text);
  let i = 0;
  while (i < all.length) {
    const line = all[i]!;
    const at = i + 1;
    i += 1;
    if (!line.trim()) continue;
    const refuse = (problem: string) => new OutputsError(`$AX_OUTPUT line ${at}: ${problem}`);
    const eq = line.indexOf("=");
    const heredoc = line.indexOf("<<");
    let key: string;
    let value: string;
    if (eq >= 0 && (heredoc < 0 || eq < heredoc)) {
      key = line.slice(0, eq);
      value = line.slice(eq + 1);
    } else if (heredoc >= 0) {
      const delimiter = line.slice(heredoc + 2);
      if (!delimiter.trim()) throw refuse("a block needs a delimiter after <<");
      const block: string[] = [];
      let closed = false;
      while (i < all.length) {
        const next = all[i]!;
        i += 1;
        if (next === delimiter) {
          closed = true;
          break;
        }
        block.push(next);
      }
      if (!closed) throw refuse(`the block is not closed by a line ${quoted(delimiter)}`);
      key = line.slice(0, heredoc);
      value = block.join("\n");
    } else {
      throw refuse("expected KEY=VALUE or KEY<<DELIMITER");
    }
    if (!isOutputName(key)) throw refuse(`${quoted(key)} is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)`);
    outputs[key] = value;
  }
  return outputs;
}

/** The text of $AX_OUTPUT for `outputs`: a line per value, a block for a value of several lines. */
export function renderOutputs(outputs: Readonly<Record<string, string>>): string {
  let text = "";
  for (const [key, value] of Object.entries(outputs)) {
    if (!isOutputName(key)) throw new OutputsError(`${quoted(key)} is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)`);
    if (value.includes("\n") || value.includes("\r")) {
      const delimiter = `AX_EOF_${randomBytes(16).toString("hex")}`;
      text += `${key}<<${delimiter}\n${value}\n${delimiter}\n`;
    } else {
      text += `${key}=${value}\n`;
    }
  }
  return text;
}

/**
 * A value as JSON text, as task functions pass values on: Dates as ISO 8601 text (their
 * toJSON), Sets as arrays, Maps with string keys as objects. A value JSON cannot hold (a bigint,
 * a function, a symbol, undefined at the top) is refused with a TypeError naming its type.
 */
export function toJson(value: unknown): string {
  const seen = new Set<unknown>();
  const plain = (v: unknown, where: string): unknown => {
    if (v === null || typeof v === "string" || typeof v === "boolean") return v;
    if (typeof v === "number") {
      if (!Number.isFinite(v)) throw new TypeError(`${where}: ${v} cannot be written as JSON`);
      return v;
    }
    if (typeof v === "bigint" || typeof v === "function" || typeof v === "symbol" || v === undefined) {
      throw new TypeError(`${where}: a value of type ${typeof v} cannot be written as JSON`);
    }
    const object = v as { toJSON?: () => unknown };
    if (typeof object.toJSON === "function") return plain(object.toJSON(), where);
    if (seen.has(v)) throw new TypeError(`${where}: a value that contains itself cannot be written as JSON`);
    seen.add(v);
    try {
      if (Array.isArray(v) || v instanceof Set) {
        return [...(v as Iterable<unknown>)].map((item, i) => plain(item === undefined ? null : item, `${where}[${i}]`));
      }
      const out: Record<string, unknown> = {};
      const entries = v instanceof Map ? [...v.entries()] : Object.entries(v as object);
      for (const [key, item] of entries) {
        if (typeof key !== "string") throw new TypeError(`${where}: a Map key of type ${typeof key} cannot be written as JSON`);
        // As JSON.stringify does: a property holding undefined (or a function) is left out.
        if (item === undefined || typeof item === "function") continue;
        out[key] = plain(item, `${where}.${key}`);
      }
      return out;
    } finally {
      seen.delete(v);
    }
  };
  return JSON.stringify(plain(value, "the value"));
}

/**
 * A function's return value as outputs: the output `return` holds it as JSON, so a function
 * below takes it whole as an input. A plain object also gives one output per key that is a valid
 * output name (a string as it is, anything else as JSON), for shell tasks below to read as
 * `${tasks.T.outputs.KEY}`; a key named `return` is the object's own.
 */
export function outputsFromReturn(value: unknown): Record<string, string> {
  const outputs: Record<string, string> = { return: toJson(value) };
  if (isPlainObject(value)) {
    for (const [key, item] of Object.entries(value)) {
      if (!isOutputName(key) || item === undefined || typeof item === "function") continue;
      outputs[key] = typeof item === "string" ? item : toJson(item);
    }
  }
  return outputs;
}

export function isPlainObject(value: unknown): value is Record<string, unknown> {
  if (value === null || typeof value !== "object") return false;
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

/** `AX_UPSTREAM_<TASK>_<KEY>`, as the scheduler names an upstream's output. */
export function upstreamEnvName(task: string, key: string): string {
  const mangled = [...task].map((c) => (/^[A-Za-z0-9]$/.test(c) ? c.toUpperCase() : "_")).join("");
  return `AX_UPSTREAM_${mangled}_${key}`;
}

/** `AX_PARAM_<name>`, the param's name as the trigger gave it. */
export function paramEnvName(name: string): string {
  return `AX_PARAM_${name}`;
}
