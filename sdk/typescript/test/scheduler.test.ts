/** The client and the worker against a real scheduler on a fresh store (see helpers.ts). */

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { createWriteStream, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { AxError, Client, Worker, type Instance, type LogLine } from "../src/index.js";
import * as fnTasks from "./fn_tasks.js";
import { clientToken, GUARD_MS, outDir, pidAlive, readPid, REPO, schedulerAddress, SDK, waitFor, workerToken } from "./helpers.js";

const WORKER_ID = "ts-sdk-worker";

/** The suite worker's log, in AX_TEST_OUT for the Rust test to show when something fails. */
function fileLogger(path: string) {
  const file = createWriteStream(path, { flags: "a" });
  const line = (level: string) => (message: string) => void file.write(`${new Date().toISOString()} ${level} ${message}\n`);
  return { debug: () => {}, info: line("INFO"), warn: line("WARN"), error: line("ERROR") };
}

/** Runs `node ARGS` in the SDK's directory; its exit code and output. */
function node(args: string[], env: NodeJS.ProcessEnv): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve) => {
    execFile(process.execPath, args, { cwd: SDK, env, timeout: GUARD_MS }, (error, stdout, stderr) =>
      resolve({ code: error ? (typeof error.code === "number" ? error.code : 1) : 0, stdout, stderr }),
    );
  });
}
const scheduler = schedulerAddress();

async function byTask(client: Client, runId: number): Promise<Record<string, Instance>> {
  const out: Record<string, Instance> = {};
  for (const instance of await client.instances(runId)) out[instance.task] = instance;
  return out;
}

async function lines(client: Client, instanceId: number, follow = false): Promise<Array<[string, string]>> {
  const out: Array<[string, string]> = [];
  for await (const line of client.logs(instanceId, { follow })) out.push([line.stream, line.text]);
  return out;
}

describe("against a scheduler", { skip: scheduler.skip }, () => {
  const address = scheduler.address!;
  const out = scheduler.skip ? "" : outDir();
  const facts: Record<string, unknown> = { worker_id: WORKER_ID };
  let client: Client;
  let worker: Worker;

  before(async () => {
    client = new Client(address, { token: clientToken(), actor: "typescript-sdk-tests" });
    worker = new Worker({
      scheduler: address,
      id: WORKER_ID,
      labels: { sdk: "node" },
      capacity: 8,
      tasks: fnTasks.tasks,
      killGraceMs: 1000,
      token: workerToken(),
      logger: fileLogger(join(out, "worker.log")),
    });
    worker.start();
    await waitFor(
      async () => (await client.listWorkers()).some((w) => w.id === WORKER_ID && w.state === 1),
      "the worker LIVE",
    );
  });

  after(async () => {
    await worker?.stop({ drain: true, timeoutMs: GUARD_MS });
    client?.close();
    writeFileSync(join(out, "facts.json"), JSON.stringify(facts, null, 2));
  });

  test("the ETL example runs on the TypeScript worker", async () => {
    const data = join(out, "etl-data");
    const source = readFileSync(join(REPO, "examples/etl.yaml"), "utf8").replace("AX_DATA: /tmp/ax-etl", `AX_DATA: ${data}`);
    const applied = await client.apply({ source, sourceName: "examples/etl.yaml" });
    assert.equal(applied.workflow?.name, "daily-sales-etl");
    const { run } = await client.trigger("daily-sales-etl");
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    assert.equal(ended.state, "SUCCESS");
    const instances = await byTask(client, run.id);
    assert.deepEqual(Object.keys(instances).sort(), ["aggregate", "clean", "extract_orders", "extract_refunds", "report"]);
    for (const instance of Object.values(instances)) {
      assert.equal(instance.state, "SUCCESS", instance.task);
      assert.equal(instance.workerId, WORKER_ID);
    }
    assert.deepEqual(await client.logText(instances.report!.id), [`daily revenue report for run ${run.id}: 1560`]);
    // One line on each stream: their relative order is the pipes', not the worker's.
    assert.deepEqual((await lines(client, instances.extract_refunds!.id)).sort(), [
      ["stderr", "1 refund is older than 30 days and was skipped"],
      ["stdout", "extracting refunds"],
    ]);
    facts.etl = { run_id: run.id, report_instance: instances.report!.id };
  });

  const PARAMS_WORKFLOW = `
name: ts-params
tasks:
  - name: show
    command: |
      echo "region=$AX_PARAM_region"
      echo "run=$AX_RUN_ID"
      printf 'tab\\there\\n'
      echo "unicode: 数据 ✓"
      echo "to stderr" >&2
      echo "last line"
`;

  test("apply, trigger with params and an idempotency key, wait, logs", async () => {
    const first = await client.apply({ source: PARAMS_WORKFLOW });
    assert.equal(first.outcome, 1, "CREATED");
    assert.equal((await client.apply({ source: PARAMS_WORKFLOW })).outcome, 3, "UNCHANGED");
    const created = await client.trigger("ts-params", { region: "cn" }, { idempotencyKey: "ts-sdk-key-1" });
    const again = await client.trigger("ts-params", { region: "cn" }, { idempotencyKey: "ts-sdk-key-1" });
    assert.equal(created.created, true);
    assert.equal(again.created, false);
    assert.equal(again.run.id, created.run.id);
    assert.deepEqual(created.run.params, { region: "cn" });
    const run = await client.wait(created.run.id, { timeoutMs: GUARD_MS });
    assert.equal(run.state, "SUCCESS");
    const [instance] = await client.instances(run.id);
    assert.equal(instance!.workerId, WORKER_ID);
    const stored = await lines(client, instance!.id);
    const expected = ["region=cn", `run=${run.id}`, "tab\there", "unicode: 数据 ✓", "last line"];
    assert.deepEqual(stored.filter(([s]) => s === "stdout").map(([, t]) => t), expected);
    assert.deepEqual(stored.filter(([s]) => s === "stderr").map(([, t]) => t), ["to stderr"]);
    assert.deepEqual(await lines(client, instance!.id, true), stored);
    const seqs: number[] = [];
    for await (const line of client.logs(instance!.id)) seqs.push((line as LogLine).seq);
    assert.deepEqual(seqs, stored.map((_, i) => i + 1));
    assert.equal(instance!.attempts.at(-1)!.logLines, stored.length);
    facts.params = { run_id: run.id, instance_id: instance!.id, stdout: expected, stderr: ["to stderr"] };
  });

  test("an unknown workflow is refused with its name", async () => {
    await assert.rejects(client.trigger("no-such-workflow"), (error: unknown) => {
      assert.ok(error instanceof AxError);
      assert.equal(error.codeName, "NOT_FOUND");
      assert.match(error.message, /no-such-workflow/);
      return true;
    });
  });

  test("a failing task reports its exit code", async () => {
    await client.apply({ source: 'name: ts-failing\ntasks:\n  - name: fails\n    command: echo "about to fail"; exit 3\n' });
    const { run } = await client.trigger("ts-failing");
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    assert.equal(ended.state, "FAILED");
    const [instance] = await client.instances(run.id);
    assert.equal(instance!.state, "FAILED");
    assert.equal(instance!.exitCode, 3);
    assert.equal(instance!.workerId, WORKER_ID);
    assert.deepEqual(await client.logText(instance!.id), ["about to fail"]);
    facts.failing = { run_id: run.id, instance_id: instance!.id, exit_code: 3 };
  });

  test("a cancel kills the process group", async () => {
    const pids = join(out, "cancel");
    mkdirSync(pids, { recursive: true });
    await client.apply({
      source: `
name: ts-cancel
tasks:
  - name: sleeps
    env: {PIDS: "${pids}"}
    command: |
      sleep 300 &
      echo $! > "$PIDS/child"
      echo $$ > "$PIDS/leader"
      echo started
      wait
`,
    });
    const { run } = await client.trigger("ts-cancel");
    const leader = await readPid(join(pids, "leader"));
    const child = await readPid(join(pids, "child"));
    assert.ok(pidAlive(leader) && pidAlive(child));
    const [instance] = await client.instances(run.id);
    await waitFor(async () => (await client.getInstance(instance!.id)).state === "RUNNING", "the task RUNNING");
    await client.cancelInstance(instance!.id, "typescript sdk test");
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    assert.equal(ended.state, "CANCELLED");
    await waitFor(() => !pidAlive(leader) && !pidAlive(child), "the task's processes to be gone");
    assert.equal((await client.getInstance(instance!.id)).state, "CANCELLED");
    facts.cancel = { run_id: run.id, instance_id: instance!.id, pids: [leader, child] };
  });

  test("the worker enforces the timeout: SIGTERM, then SIGKILL after its kill grace", async () => {
    const pids = join(out, "timeout");
    mkdirSync(pids, { recursive: true });
    // The task and its child ignore SIGTERM: only the SIGKILL after the kill grace ends them.
    await client.apply({
      source: `
name: ts-timeout
tasks:
  - name: overruns
    timeout: 2s
    env: {PIDS: "${pids}"}
    command: |
      trap '' TERM
      sleep 300 &
      echo $! > "$PIDS/child"
      echo $$ > "$PIDS/leader"
      echo waiting
      wait
`,
    });
    const { run } = await client.trigger("ts-timeout");
    const leader = await readPid(join(pids, "leader"));
    const child = await readPid(join(pids, "child"));
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    assert.equal(ended.state, "FAILED");
    const [instance] = await client.instances(run.id);
    assert.equal(instance!.state, "TIMEOUT");
    const attempt = instance!.attempts.at(-1)!;
    assert.equal(attempt.workerId, WORKER_ID);
    assert.equal(attempt.signal, 9, "ended by SIGKILL");
    await waitFor(() => !pidAlive(leader) && !pidAlive(child), "the timed-out processes to be gone");
    facts.timeout = { run_id: run.id, instance_id: instance!.id, pids: [leader, child] };
  });

  test("task functions run as tasks: context, exit codes, thrown errors, an unknown name", async () => {
    await client.apply({
      source: `
name: ts-functions
defaults:
  labels: {sdk: node}
tasks:
  - name: greet
    argv: [ax-node, greet, world]
    env: {GREETING_ENV: "from-the-task-env"}
  - name: returns_code
    command: ax-node exit_with 4
  - name: throws
    command: ax-node boom
  - name: unknown
    command: ax-node not_registered
`,
    });
    const { run } = await client.trigger("ts-functions", { who: "tester" });
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    assert.equal(ended.state, "FAILED");
    const instances = await byTask(client, run.id);
    for (const instance of Object.values(instances)) assert.equal(instance.workerId, WORKER_ID);

    const greet = instances.greet!;
    assert.equal(greet.state, "SUCCESS");
    const greetLines = [
      "hello world from tester",
      `run ${run.id} task greet attempt 1 of ts-functions`,
      `instance ${greet.id} env from-the-task-env`,
    ];
    assert.deepEqual(await client.logText(greet.id), greetLines);

    const code = instances.returns_code!;
    assert.equal(code.state, "FAILED");
    assert.equal(code.exitCode, 4);
    assert.deepEqual(await client.logText(code.id), ["exiting with 4"]);

    const throws = instances.throws!;
    assert.equal(throws.state, "FAILED");
    assert.equal(throws.exitCode, 1);
    const thrown = await lines(client, throws.id);
    assert.deepEqual(thrown.filter(([s]) => s === "stdout").map(([, t]) => t), ["about to throw"]);
    const stderr = thrown.filter(([s]) => s === "stderr").map(([, t]) => t);
    assert.equal(stderr[0], "RangeError: boom: tester is not welcome");
    assert.match(stderr[1] ?? "", /^ {4}at .*fn_tasks\.js/);

    const unknown = instances.unknown!;
    assert.equal(unknown.state, "FAILED");
    assert.match(unknown.attempts.at(-1)!.message, /not_registered/);
    facts.functions = { run_id: run.id, greet_instance: greet.id, greet_lines: greetLines, exit_code_instance: code.id };
  });

  test("a cancel kills a task function's process", async () => {
    const pidFile = join(out, "function.pid");
    await client.apply({
      source: `name: ts-function-cancel\ntasks:\n  - name: sleeps\n    argv: [ax-node, sleeper, "${pidFile}"]\n    labels: {sdk: node}\n`,
    });
    const { run } = await client.trigger("ts-function-cancel");
    const pid = await readPid(pidFile);
    const [instance] = await client.instances(run.id);
    await waitFor(async () => (await client.getInstance(instance!.id)).state === "RUNNING", "the function RUNNING");
    await waitFor(async () => (await client.logText(instance!.id)).join() === "sleeping", "the function's line");
    await client.cancelRun(run.id, "typescript sdk test");
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    assert.equal(ended.state, "CANCELLED");
    await waitFor(() => !pidAlive(pid), "the function's process to be gone");
    assert.equal((await client.getInstance(instance!.id)).state, "CANCELLED");
    facts.function_cancel = { instance_id: instance!.id, pids: [pid] };
  });

  test("a return value becomes outputs that the next function reads", async () => {
    await client.apply({
      source: `
name: ts-outputs
defaults:
  labels: {sdk: node}
tasks:
  - name: count
    command: ax-node count_rows
  - name: use
    upstream: count
    command: ax-node use_rows
  - name: typed
    upstream: count
    command: ax-node use_typed
  - name: last
    upstream: typed
    command: ax-node by_name
`,
    });
    const { run } = await client.trigger("ts-outputs");
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    const instances = await byTask(client, run.id);
    assert.equal(ended.state, "SUCCESS", JSON.stringify(Object.values(instances).map((i) => [i.task, i.attempts.at(-1)?.message])));
    assert.deepEqual(instances.count!.outputs, {
      return: '{"rows":3,"names":["a","b"],"note":"two\\nlines"}',
      rows: "3",
      names: '["a","b"]',
      note: "two\nlines",
    });
    assert.deepEqual(await client.logText(instances.use!.id), ['rows=3 names=["a","b"]', "two", "lines"]);
    assert.deepEqual(instances.use!.outputs, { return: '{"doubled":6}', doubled: "6" });
    assert.deepEqual(await client.logText(instances.typed!.id), ["typed rows+1=4 names=a,b"]);
    assert.deepEqual(instances.typed!.outputs, { return: '[3,"a","b"]' });
    assert.deepEqual(await client.logText(instances.last!.id), ['from typed: [3,"a","b"] (array), missing=default, task last']);
  });

  test("wait returns once a cancelled function has cleaned up", async () => {
    const marker = join(out, "cleaned-up");
    await client.apply({
      source: `name: ts-slow-stop\ntasks:\n  - name: slow\n    argv: [ax-node, slow_to_stop, "${marker}"]\n    labels: {sdk: node}\n`,
    });
    const { run } = await client.trigger("ts-slow-stop");
    const [instance] = await client.instances(run.id);
    await waitFor(async () => (await client.logText(instance!.id)).join() === "working", "the function's line");
    await client.cancelRun(run.id, "wait test");
    const ended = await client.wait(run.id, { timeoutMs: GUARD_MS });
    // The run was CANCELLED at once; wait returned only once the process had ended, after its
    // clean-up (one abort, 300 ms of work), with the signal stored.
    assert.equal(ended.state, "CANCELLED");
    assert.equal(readFileSync(marker, "utf8"), "cleaned up");
    const attempts = (await client.getInstance(instance!.id)).attempts;
    assert.equal(attempts.length, 1);
    assert.equal(attempts[0]!.state, "CANCELLED");
    assert.equal(attempts[0]!.signal, 15, "ended by SIGTERM");
    assert.equal(attempts[0]!.processMayRun, false);
    assert.deepEqual(await client.logText(instance!.id), [
      "working",
      "cancelled: cleaning up",
      "ax-node: stopped by SIGTERM (a cancel or a timeout)",
    ]);
  });

  test("params reach functions typed, and returns are outputs", async () => {
    await client.apply({
      source: `
name: ts-typed
defaults:
  labels: {sdk: node}
tasks:
  - name: params
    command: ax-node typed_params
  - name: fetch
    command: ax-node async_fetch
`,
    });
    const params = { n: 3, flag: true, window: { days: 7 }, names: ["a", "b"], note: "plain text" };
    const triggered = await client.trigger("ts-typed", params);
    // Strings go as they are, anything else as JSON.
    assert.deepEqual(triggered.run.params, {
      n: "3",
      flag: "true",
      window: '{"days":7}',
      names: '["a","b"]',
      note: "plain text",
    });
    const run = await client.wait(triggered.run.id, { timeoutMs: GUARD_MS });
    const instances = await byTask(client, run.id);
    assert.equal(run.state, "SUCCESS");
    assert.deepEqual(await client.logText(instances.params!.id), [
      'n+1=4 flag=true window={"days":7} names=a|b note=plain text',
    ]);
    assert.deepEqual(instances.params!.outputs, { return: '{"n_squared":9,"flag":false}', n_squared: "9", flag: "false" });
    assert.deepEqual(await client.logText(instances.fetch!.id), ["fetched 3"]);
    assert.deepEqual(instances.fetch!.outputs, { return: "[0,1,2]" });
  });

  test("a param that does not convert fails the attempt, naming it", async () => {
    await client.apply({
      source: "name: ts-typed-bad\ntasks:\n  - name: f\n    command: ax-node async_fetch\n    labels: {sdk: node}\n",
    });
    const run = await client.wait((await client.trigger("ts-typed-bad", { n: "three" })).run.id, { timeoutMs: GUARD_MS });
    assert.equal(run.state, "FAILED");
    const [instance] = await client.instances(run.id);
    assert.deepEqual(await client.logText(instance!.id), [
      'ax-node: async_fetch: input n: param n is "three", not an integer: expected an integer, got "three"',
    ]);
  });

  test("watch streams a run's changes until it ended", async () => {
    await client.apply({ source: "name: ts-watch\ntasks:\n  - name: t\n    command: echo one; echo two\n" });
    const { run } = await client.trigger("ts-watch");
    const states: string[] = [];
    for await (const change of client.watch(run.id)) states.push(change.state);
    assert.equal(states.at(-1), "SUCCESS", states.join());
    const [instance] = await client.instances(run.id);
    assert.deepEqual(await client.logText(instance!.id), ["one", "two"]);
  });

  test("the orders example runs as its README says", async () => {
    const env: NodeJS.ProcessEnv = { ...process.env, AX_SERVER: address, AX_SCHEDULER: address };
    delete env.AX_TOKEN;
    if (clientToken()) env.AX_TOKEN = clientToken();
    const workerEnv: NodeJS.ProcessEnv = { ...env };
    if (workerToken()) workerEnv.AX_TOKEN = workerToken();
    const log = join(out, "orders-worker.log");
    const logFile = createWriteStream(log);
    await new Promise((resolve) => logFile.once("open", resolve));
    const exampleWorker = spawn(
      process.execPath,
      ["dist/src/cli.js", "--module", "dist/examples/orders/tasks.js", "--label", "worker=orders", "--id", "ts-orders"],
      { cwd: SDK, env: workerEnv, stdio: ["ignore", logFile, logFile] },
    );
    try {
      await waitFor(
        async () => (await client.listWorkers()).some((w) => w.id === "ts-orders" && w.state === 1),
        "the example's worker",
      );
      const printed = await node(["dist/examples/orders/workflow.js"], env);
      assert.equal(printed.code, 0, printed.stderr);
      assert.ok(
        printed.stdout.includes('argv:\n      - "ax-node"\n      - "total"\n    upstream:\n      - "extract"\n      - "enrich"'),
        printed.stdout,
      );
      const outputs: string[] = [];
      for (const currency of ["USD", "CNY"]) {
        const done = await node(["dist/examples/orders/client.js", "2026-01-31", currency], env);
        assert.equal(done.code, 0, `${done.stdout}${done.stderr}${readFileSync(log, "utf8")}`);
        outputs.push(done.stdout);
      }
      // 4 orders: 100 EUR, 110 USD, 120 CNY, 130 EUR = 346.8 EUR; in USD and in CNY.
      assert.match(outputs[0]!, /^run \d+ SUCCESS: \{"day":"2026-01-31","orders":4,"total":376\.96,"currency":"USD"\}\n$/);
      assert.match(outputs[1]!, /^run \d+ SUCCESS: \{"day":"2026-01-31","orders":4,"total":2667\.69,"currency":"CNY"\}\n$/);
      facts.example = { usd: outputs[0]!.trim(), cny: outputs[1]!.trim() };
    } finally {
      // SIGTERM drains the worker; it exits 0 once nothing runs.
      const exited = new Promise<number | null>((resolve) => exampleWorker.once("exit", (code) => resolve(code)));
      exampleWorker.kill("SIGTERM");
      assert.equal(await exited, 0, readFileSync(log, "utf8"));
    }
  });
});
