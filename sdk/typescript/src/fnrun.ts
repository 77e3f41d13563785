/**
 * The child process of a function task: imports the function's module, calls the function,
 * exits. The worker starts `node fnrun.js` with the function's location in AX_SDK_FUNCTION (JSON:
 * `ChildSpec`), in a process group of its own; this process's exit status is the attempt's.
 *
 * - Inputs that cannot be read fail the attempt before the function runs (exit 1, one line on
 *   stderr naming the input).
 * - A return value becomes the outputs, appended to $AX_OUTPUT; undefined passes nothing on.
 * - A thrown error prints its stack on stderr and exits 1.
 * - SIGTERM (a cancel or a timeout) aborts `ctx.signal` once; a second changes nothing (the
 *   worker's SIGKILL follows its kill grace). Once the function has settled, the process ends
 *   by SIGTERM itself, so the attempt's end says what stopped it.
 */

import { appendFileSync } from "node:fs";

import {
  Cancelled,
  registriesCreated,
  SPEC_ENV,
  TaskContext,
  isTasks,
  type ChildSpec,
  type TaskDefinition,
} from "./functions.js";
import { bindInputs, InputError } from "./inputs.js";
import { outputsFromReturn, renderOutputs } from "./outputs.js";

const PREFIX = "ax-node";

function say(line: string): void {
  process.stderr.write(`${line}\n`);
}

let signalled = false;
const controller = new AbortController();

function exitBySigterm(): never {
  say(`${PREFIX}: stopped by SIGTERM (a cancel or a timeout)`);
  process.removeAllListeners("SIGTERM");
  process.kill(process.pid, "SIGTERM");
  // The default action ends the process; should the signal be blocked, the status says it.
  process.exit(128 + 15);
}

function find(spec: ChildSpec, imported: Record<string, unknown>): TaskDefinition<any, any> | undefined {
  for (const value of Object.values(imported)) {
    if (isTasks(value)) {
      const found = value.get(spec.name);
      if (found) return found;
    }
  }
  for (const registry of registriesCreated()) {
    const found = registry.get(spec.name);
    if (found) return found;
  }
  return undefined;
}

function passOn(result: unknown): number {
  if (result === undefined) return 0;
  const path = process.env.AX_OUTPUT;
  if (!path) {
    say(`${PREFIX}: the function returned a value, but $AX_OUTPUT is not set (a worker without outputs); the value is dropped`);
    return 0;
  }
  let text: string;
  try {
    text = renderOutputs(outputsFromReturn(result));
  } catch (error) {
    say(`${PREFIX}: the function's return value cannot become outputs: ${(error as Error).message}`);
    return 1;
  }
  appendFileSync(path, text, "utf8");
  return 0;
}

function describe(error: unknown): string {
  if (error instanceof Error) return error.stack ?? `${error.name}: ${error.message}`;
  return `thrown: ${typeof error === "string" ? error : JSON.stringify(error) ?? String(error)}`;
}

async function main(): Promise<number> {
  process.on("SIGTERM", () => {
    if (signalled) return;
    signalled = true;
    controller.abort(new Cancelled("the attempt is stopped (SIGTERM: a cancel or a timeout)"));
  });
  const raw = process.env[SPEC_ENV];
  delete process.env[SPEC_ENV];
  if (raw === undefined) {
    say(`${PREFIX}: ${SPEC_ENV} is not set; the worker starts this program`);
    return 2;
  }
  const spec = JSON.parse(raw) as ChildSpec;
  (globalThis as { [key: symbol]: unknown })[Symbol.for("ax-sdk.function-child")] = true;
  let imported: Record<string, unknown>;
  try {
    imported = (await import(spec.module)) as Record<string, unknown>;
  } catch (error) {
    if (signalled) exitBySigterm();
    say(describe(error));
    say(`${PREFIX}: cannot load the module of task function ${JSON.stringify(spec.name)} (${spec.module})`);
    return 1;
  }
  const definition = find(spec, imported);
  if (!definition) {
    say(`${PREFIX}: ${spec.module} registers no task function ${JSON.stringify(spec.name)}`);
    return 1;
  }
  const ctx = new TaskContext(spec.args, process.env, controller.signal);
  let inputs: Record<string, unknown>;
  try {
    inputs = bindInputs(definition.inputs, process.env);
  } catch (error) {
    if (error instanceof InputError) {
      say(`${PREFIX}: ${spec.name}: ${error.message}`);
      return 1;
    }
    throw error;
  }
  if (signalled) exitBySigterm();
  // The function may wait on nothing the event loop holds (a promise no timer settles): this
  // keeps the process alive until it settles, or until a signal ends it.
  const keepAlive = setInterval(() => {}, 1 << 30);
  try {
    const result = await definition.run(inputs as never, ctx);
    if (signalled) exitBySigterm();
    return passOn(result);
  } catch (error) {
    if (signalled) {
      const reason = controller.signal.reason;
      const fromAbort =
        error === reason ||
        (error instanceof Error && (error.name === "AbortError" || error.cause === reason || error instanceof Cancelled));
      if (!fromAbort) say(describe(error));
      exitBySigterm();
    }
    say(describe(error));
    return 1;
  } finally {
    clearInterval(keepAlive);
  }
}

main().then(
  (code) => process.exit(code),
  (error) => {
    say(describe(error));
    process.exit(1);
  },
);
