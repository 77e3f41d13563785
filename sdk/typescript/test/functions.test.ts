/**
 * How a task function is called and how it ends, in the child runner (`node fnrun.js`) as the
 * worker starts it: typed inputs, async functions, return values as outputs, exit codes, thrown
 * errors, and a cancel aborting `ctx.signal` once before the process ends by SIGTERM.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { pathToFileURL } from "node:url";
import { test } from "node:test";

import { parseOutputs } from "../src/index.js";
import { GUARD_MS, SDK } from "./helpers.js";

const MODULE = pathToFileURL(join(SDK, "dist/test/fixtures/child_tasks.js")).href;
const FNRUN = join(SDK, "dist/src/fnrun.js");

interface Done {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  outputs: Record<string, string>;
}

/** Runs function `name` as the worker does; with `cancelOnReady`, SIGTERMs its group twice once it prints "ready". */
async function run(name: string, env: Record<string, string> = {}, options: { cancelOnReady?: boolean; killOnReadyAfterMs?: number; module?: string } = {}): Promise<Done> {
  const dir = mkdtempSync(join(tmpdir(), "ax-ts-fn-"));
  const output = join(dir, "output");
  writeFileSync(output, "");
  const child = spawn(process.execPath, [FNRUN], {
    env: {
      ...process.env,
      AX_SDK_FUNCTION: JSON.stringify({ name, module: options.module ?? MODULE, args: ["x"] }),
      AX_OUTPUT: output,
      ...env,
    },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (chunk: Buffer) => {
    stdout += chunk.toString();
    if (options.killOnReadyAfterMs !== undefined && stdout.startsWith("ready\n") && !signalled) {
      signalled = true;
      void sleep(options.killOnReadyAfterMs).then(() => process.kill(-child.pid!, "SIGKILL"));
    }
    if (options.cancelOnReady && stdout.startsWith("ready\n") && !signalled) {
      signalled = true;
      // The worker signals the group, twice when two nodes cancel: one abort.
      process.kill(-child.pid!, "SIGTERM");
      void sleep(200).then(() => {
        try {
          process.kill(-child.pid!, "SIGTERM");
        } catch {
          // Ended before the second.
        }
      });
    }
  });
  let signalled = false;
  child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
  const guard = setTimeout(() => child.kill("SIGKILL"), GUARD_MS);
  const [code, signal] = await new Promise<[number | null, NodeJS.Signals | null]>((resolve) =>
    child.on("close", (c, s) => resolve([c, s])),
  );
  clearTimeout(guard);
  return { code, signal, stdout, stderr, outputs: parseOutputs(readFileSync(output)) };
}

test("an async function runs with typed inputs, and its return value is its outputs", async () => {
  const done = await run("fetch", { AX_PARAM_n: "21" });
  assert.equal(done.code, 0, done.stderr);
  assert.equal(done.stdout, "fetched 21\n");
  assert.deepEqual(done.outputs, { return: '{"rows":42,"source":"api"}', rows: "42", source: "api" });
});

test("a number returned is an output, not an exit code; undefined passes nothing on", async () => {
  const count = await run("count");
  assert.equal(count.code, 0, count.stderr);
  assert.deepEqual(count.outputs, { return: "256" });
  const nothing = await run("nothing");
  assert.deepEqual([nothing.code, nothing.outputs], [0, {}]);
});

test("exit codes come from process.exit and from thrown errors, whose stack goes to stderr", async () => {
  assert.equal((await run("exits")).code, 3);
  const thrown = await run("throws");
  assert.equal(thrown.code, 1);
  const lines = thrown.stderr.split("\n");
  assert.equal(lines[0], "TypeError: no rows");
  assert.match(lines[1]!, /^ {4}at .*child_tasks\.js:\d+:\d+/);
  const rejected = await run("rejects_string");
  assert.equal(rejected.code, 1);
  assert.equal(rejected.stderr, "thrown: just a string\n");
  const unwritable = await run("bigint");
  assert.equal(unwritable.code, 1);
  assert.equal(unwritable.stderr, "ax-node: the function's return value cannot become outputs: the value.big: a value of type bigint cannot be written as JSON\n");
  assert.deepEqual(unwritable.outputs, {});
});

test("inputs that cannot be read fail the attempt before the function runs, naming the input", async () => {
  const missing = await run("fetch");
  assert.equal(missing.code, 1);
  assert.equal(missing.stdout, "");
  assert.match(missing.stderr, /^ax-node: fetch: input n: no direct upstream task n passed on a value and the run has no param n/);
  const unknown = await run("no_such_function");
  assert.equal(unknown.code, 1);
  assert.equal(unknown.stderr, `ax-node: ${MODULE} registers no task function "no_such_function"\n`);
  const unloadable = await run("fetch", {}, { module: pathToFileURL(join(SDK, "dist/test/fixtures/missing.js")).href });
  assert.equal(unloadable.code, 1);
  assert.match(unloadable.stderr, /ax-node: cannot load the module of task function "fetch"/);
});

test("a cancel aborts ctx.signal once, the clean-up runs, and the process ends by SIGTERM", async () => {
  const done = await run("long", {}, { cancelOnReady: true });
  assert.equal(done.signal, "SIGTERM", done.stderr);
  assert.equal(done.stdout, "ready\ncancelled: Cancelled\ncleaned up after 1 abort\n");
  assert.equal(done.stderr, "ax-node: stopped by SIGTERM (a cancel or a timeout)\n");
});

test("a function that swallows the abort still ends cancelled, passing nothing on", async () => {
  const done = await run("stubborn", {}, { cancelOnReady: true });
  assert.equal(done.signal, "SIGTERM", done.stderr);
  assert.deepEqual(done.outputs, {});
});

test("a function waiting on a promise nothing settles keeps its process, until the worker's SIGKILL", async () => {
  // Without the runner's hold on the event loop, node would exit at once, as if it had succeeded.
  const done = await run("forever", {}, { killOnReadyAfterMs: 500 });
  assert.equal(done.signal, "SIGKILL", done.stderr);
  assert.equal(done.stdout, "ready\n");
});

test("a module that starts a worker does not start one in a function's child", async () => {
  const done = await run("count", { AX_TEST_CHILD_STARTS_WORKER: "1" });
  assert.equal(done.code, 0, done.stderr);
  assert.equal(done.stderr, "start() returned without serving\n");
  assert.deepEqual(done.outputs, { return: "256" });
});
