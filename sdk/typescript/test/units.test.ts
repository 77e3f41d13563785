/** Parts of the SDK that need no scheduler: settings, durations, the function convention, outputs, typed inputs, the builder. */

import assert from "node:assert/strict";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import {
  bindInputs,
  ConfigError,
  Credentials,
  DurationError,
  encodeParams,
  functionCall,
  InputError,
  MAX_ATTEMPT_BYTES,
  OutputsError,
  outputsFromReturn,
  param,
  parseDurationNs,
  parseEndpoint,
  parseEndpoints,
  parseOutputs,
  renderOutputs,
  shellWords,
  t,
  TaskContext,
  Tasks,
  toJson,
  upstream,
  upstreamEnvName,
  VERSION,
  WORKER_VERSION,
  Workflow,
} from "../src/index.js";
import { cutAt } from "../src/worker.js";
import { instanceStateName, runStateName } from "../src/runs.js";
import { InstanceState, RunState, TriggerKind } from "../src/gen/ax/v1/types_pb.js";
import { REPO, SDK } from "./helpers.js";

test("addresses parse, and bad ones are named", () => {
  assert.equal(parseEndpoint("http://sched-1:7070").target, "sched-1:7070");
  const https = parseEndpoint("https://sched-1");
  assert.ok(https.tls);
  assert.equal(https.port, 7070);
  assert.equal(parseEndpoint("127.0.0.1:9000").target, "127.0.0.1:9000");
  assert.equal(parseEndpoint("http://[::1]:7071").target, "[::1]:7071");
  assert.deepEqual(parseEndpoints("a:1, b:2").map((e) => e.port), [1, 2]);
  assert.throws(() => parseEndpoint("ftp://x:1"), (e: Error) => e instanceof ConfigError && e.message.includes("ftp://"));
  assert.throws(() => parseEndpoint("http://x:99999"), /the port is not a number from 1 to 65535/);
  assert.throws(() => parseEndpoint("http://x:1/path"), /nothing after it/);
  assert.throws(() => parseEndpoints(" , "), /no scheduler address given/);
});

test("tokens are checked and sent as a bearer; TLS files are read once", () => {
  assert.equal(Credentials.load({ token: "abc" }).metadata().get("authorization")[0], "Bearer abc");
  assert.deepEqual(Credentials.load({}).metadata().get("authorization"), []);
  const dir = mkdtempSync(join(tmpdir(), "ax-ts-units-"));
  const path = join(dir, "token");
  writeFileSync(path, "from-file\n");
  assert.equal(Credentials.load({ tokenFile: path }).token, "from-file");
  assert.throws(() => Credentials.load({ token: "a b" }), /whitespace or control characters/);
  assert.throws(() => Credentials.load({ token: "a", tokenFile: path }), /not both/);
  assert.throws(() => Credentials.load({ tlsCa: join(dir, "missing.pem") }), /cannot read the TLS CA file .*missing\.pem: no such file/);
  assert.throws(() => Credentials.load({ tlsCert: path }), /both tlsCert and tlsKey/);
  assert.deepEqual(Credentials.fromEnv({ AX_TOKEN_FILE: path, AX_TLS_CA: "ca.pem" }), {
    token: undefined,
    tokenFile: path,
    tlsCa: "ca.pem",
    tlsCert: undefined,
    tlsKey: undefined,
  });
});

test("durations read as the Rust parser reads them (scheduler/core/tests/durations.json)", () => {
  const rows = JSON.parse(readFileSync(join(REPO, "scheduler/core/tests/durations.json"), "utf8")) as unknown[][];
  let checked = 0;
  for (const row of rows) {
    const [text, expected] = row as [string, number | "invalid" | "too large"];
    if (typeof expected === "number") {
      assert.equal(parseDurationNs(text), BigInt(expected), text);
    } else {
      const words = expected === "invalid" ? `invalid duration ${JSON.stringify(text)}` : `duration ${JSON.stringify(text)} is too large`;
      assert.throws(() => parseDurationNs(text), (e: Error) => e instanceof DurationError && e.message.startsWith(words), text);
    }
    checked += 1;
  }
  assert.ok(checked > 40, `${checked} rows`);
  assert.throws(() => parseDurationNs("5x"), /^DurationError: invalid duration "5x": expected a form like 500ms/);
});

test("the function convention: ax-node NAME [ARG...], in a command or argv", () => {
  assert.deepEqual(functionCall("ax-node greet world 'two words'", []), ["greet", ["world", "two words"]]);
  assert.deepEqual(functionCall("  ax-node\tload  ", []), ["load", []]);
  assert.deepEqual(functionCall("", ["ax-node", "load", "a b"]), ["load", ["a b"]]);
  assert.equal(functionCall("ax-nodes x", []), undefined);
  assert.equal(functionCall("echo ax-node", []), undefined);
  assert.equal(functionCall("ax-node x", ["python", "x"]), undefined);
  assert.throws(() => functionCall("ax-node", []), /ax-node needs a function name: ax-node NAME \[ARG \.\.\.\]/);
  assert.throws(() => functionCall("ax-node f 'open", []), /cannot split the command .*: No closing quotation/);
  assert.deepEqual(shellWords(`a "b \\"c\\" $d" 'e\\f' g\\ h`), ["a", 'b "c" $d', "e\\f", "g h"]);
});

test("task registries refuse bad names and doubles, and know their module", () => {
  const tasks = new Tasks(import.meta.url);
  tasks.task("one", () => 1);
  assert.throws(() => tasks.task("one", () => 2), /already registered/);
  assert.throws(() => tasks.task("two words", () => 2), /without whitespace/);
  assert.throws(() => new Tasks("relative/tasks.js"), /file: URL or an absolute path/);
  assert.equal(new Tasks("/abs/tasks.js").module, "file:///abs/tasks.js");
  assert.deepEqual(tasks.names(), ["one"]);
});

test("long lines are cut between characters", () => {
  const data = Buffer.from("aé€😀", "utf8"); // 1 + 2 + 3 + 4 bytes
  assert.equal(cutAt(data, 2), 1);
  assert.equal(cutAt(data, 3), 3);
  assert.equal(cutAt(data, 5), 3);
  assert.equal(cutAt(data, 6), 6);
  assert.equal(cutAt(data, 9), 6);
  assert.equal(cutAt(Buffer.from([0x80, 0x80, 0x80, 0x80, 0x80]), 2), 2, "not UTF-8: at the limit");
});

test("outputs read as the Rust worker reads them", () => {
  const text = "rows=1250\n\nreport<<EOF\nfirst\nsecond = 2\nEOF\nempty=\nrows=1251\nurl=a=b\r\n";
  assert.deepEqual(parseOutputs(Buffer.from(text)), { rows: "1251", report: "first\nsecond = 2", empty: "", url: "a=b" });
  const refusals: Array<[string, string]> = [
    ["rows 12\n", "$AX_OUTPUT line 1: expected KEY=VALUE or KEY<<DELIMITER"],
    ["ok=1\n1rows=2\n", '$AX_OUTPUT line 2: "1rows" is not a valid output name ([A-Za-z_][A-Za-z0-9_]*)'],
    ["text<<END\nline\n", '$AX_OUTPUT line 1: the block is not closed by a line "END"'],
    ["text<<\n", "$AX_OUTPUT line 1: a block needs a delimiter after <<"],
  ];
  for (const [input, message] of refusals) {
    assert.throws(() => parseOutputs(Buffer.from(input)), (e: Error) => e instanceof OutputsError && e.message === message, input);
  }
  assert.throws(() => parseOutputs(Buffer.from([0x6b, 0x3d, 0xff])), /not UTF-8 text/);
  assert.throws(() => parseOutputs(Buffer.alloc(MAX_ATTEMPT_BYTES + 1, 0x61)), /more than the 65536/);
  const rendered = renderOutputs({ a: "1", b: "x\ny" });
  assert.deepEqual(parseOutputs(Buffer.from(rendered)), { a: "1", b: "x\ny" });
  assert.equal(upstreamEnvName("load-db.v2", "rows"), "AX_UPSTREAM_LOAD_DB_V2_rows");
});

test("return values become JSON outputs, a plain object's keys each one", () => {
  assert.deepEqual(outputsFromReturn({ n: 3, s: "t", "not-a-name": 1, d: new Date("2026-01-31T00:00:00Z") }), {
    return: '{"n":3,"s":"t","not-a-name":1,"d":"2026-01-31T00:00:00.000Z"}',
    n: "3",
    s: "t",
    d: '"2026-01-31T00:00:00.000Z"',
  });
  assert.deepEqual(outputsFromReturn([1, 2]), { return: "[1,2]" });
  assert.deepEqual(outputsFromReturn(256), { return: "256" });
  assert.deepEqual(outputsFromReturn(false), { return: "false" });
  assert.equal(toJson(new Set([1, 2])), "[1,2]");
  assert.equal(toJson(new Map([["a", 1]])), '{"a":1}');
  assert.throws(() => toJson({ big: 1n }), /the value\.big: a value of type bigint cannot be written as JSON/);
  const loop: Record<string, unknown> = {};
  loop.self = loop;
  assert.throws(() => toJson(loop), /contains itself/);
});

test("typed inputs: by name from an upstream or a param, by param() and upstream(), converted and checked", () => {
  const count = new Tasks(import.meta.url).task("count", () => ({ rows: 3 }));
  const spec = {
    count: upstream(count),
    rows: upstream("count", "rows", t.integer()),
    note: upstream("count", "note", t.string()),
    day: t.date(),
    n: t.integer(),
    flag: t.boolean(),
    region: param("region", t.string(), "eu"),
    window: param("window", t.object({ days: t.integer(), label: t.optional(t.string()) })),
    mode: t.optional(t.literal("fast", "slow"), "slow"),
  };
  const env = {
    AX_UPSTREAM_COUNT_return: '{"rows":3}',
    AX_UPSTREAM_COUNT_rows: "3",
    AX_UPSTREAM_COUNT_note: "two\nlines",
    AX_PARAM_day: "2026-01-31",
    AX_PARAM_n: "7",
    AX_PARAM_flag: "true",
    AX_PARAM_window: '{"days":2}',
  };
  const inputs = bindInputs(spec, env);
  assert.deepEqual(inputs, {
    count: { rows: 3 },
    rows: 3,
    note: "two\nlines",
    day: new Date("2026-01-31"),
    n: 7,
    flag: true,
    region: "eu",
    window: { days: 2 },
    mode: "slow",
  });
  // The types follow the spec (checked by tsc): these lines would not compile otherwise.
  const typed: { rows: number; note: string; day: Date; region: string; mode: "fast" | "slow"; window: { days: number; label?: string | undefined } } = inputs;
  assert.ok(typed);
  assert.equal(bindInputs({ region: param("region") }, { AX_PARAM_region: "us" }).region, "us");
  // A string input takes a param's text as it is; a JSON string from an upstream's return is read as JSON.
  assert.deepEqual(bindInputs({ id: t.string() }, { AX_PARAM_id: "007" }), { id: "007" });
  assert.deepEqual(bindInputs({ name: t.string() }, { AX_UPSTREAM_NAME_return: '"Lyon"' }), { name: "Lyon" });
  assert.deepEqual(bindInputs({ b: t.literal("true", "false") }, { AX_PARAM_b: "true" }), { b: "true" });
  assert.deepEqual(
    encodeParams({ s: "3", n: 3, d: new Date("2026-01-31T00:00:00Z"), o: { a: [1] }, f: false }),
    { s: "3", n: "3", d: "2026-01-31T00:00:00.000Z", o: '{"a":[1]}', f: "false" },
  );

  const failures: Array<[Record<string, string>, string]> = [
    [{ ...env, AX_PARAM_n: "three" }, 'input n: param n is "three", not an integer: expected an integer, got "three"'],
    [{ ...env, AX_UPSTREAM_COUNT_rows: "many" }, 'input rows: output rows of task count is "many", not an integer: expected an integer, got "many"'],
    [{ ...env, AX_PARAM_window: '{"days":2,"size":1}' }, "input window: param window is \"{\\\"days\\\":2,\\\"size\\\":1}\", not an object: no field size is expected"],
    [{ ...env, AX_PARAM_window: '{"label":"x"}' }, 'input window: param window is "{\\"label\\":\\"x\\"}", not an object: field days is missing'],
    [{ ...env, AX_PARAM_mode: "medium" }, 'input mode: param mode is "medium", not one of "fast", "slow" (optional): expected one of "fast", "slow", got "medium"'],
  ];
  for (const [given, message] of failures) {
    assert.throws(() => bindInputs(spec, given), (e: Error) => e instanceof InputError && e.message === message, message);
  }
  const { AX_PARAM_n: _n, ...withoutN } = env;
  assert.throws(
    () => bindInputs(spec, withoutN),
    /^InputError: input n: no direct upstream task n passed on a value and the run has no param n/,
  );
  const { AX_UPSTREAM_COUNT_rows: _rows, ...withoutRows } = env;
  assert.throws(
    () => bindInputs(spec, withoutRows),
    /input rows: output rows of task count was not passed on \(is count a direct upstream, and did it write rows\?\)/,
  );
});

test("a zod-like schema is a decoder: its parse decides, its issues are the message", () => {
  const schema = {
    parse(value: unknown): { id: number } {
      if (typeof value === "object" && value !== null && typeof (value as { id?: unknown }).id === "number") return value as { id: number };
      throw Object.assign(new Error("invalid"), { issues: [{ path: ["id"], message: "Expected number" }] });
    },
  };
  const inputs = bindInputs({ order: schema }, { AX_PARAM_order: '{"id":4}' });
  const id: number = inputs.order.id;
  assert.equal(id, 4);
  assert.throws(() => bindInputs({ order: schema }, { AX_PARAM_order: '{"id":"x"}' }), /not a value its schema accepts: id: Expected number/);
});

test("the context reads params, typed, and upstream outputs", () => {
  const ctx = new TaskContext(["a"], {
    AX_PARAM_n: "5",
    AX_PARAM_day: "2026-03-08",
    AX_RUN_ID: "12",
    AX_UPSTREAM_COUNT_rows: "3",
    AX_SHARD_INDEX: "1",
    AX_SHARD_TOTAL: "4",
  });
  assert.equal(ctx.param("n"), "5");
  assert.equal(ctx.param("n", t.integer()), 5);
  assert.deepEqual(ctx.param("day", t.date()), new Date("2026-03-08"));
  assert.equal(ctx.param("missing", t.integer(), 0), 0);
  assert.throws(() => ctx.param("missing"), /the run has no param missing/);
  assert.throws(() => ctx.param("day", t.integer()), /param day is "2026-03-08", not an integer/);
  assert.equal(ctx.runId, 12);
  assert.deepEqual([ctx.shardIndex, ctx.shardTotal], [1, 4]);
  assert.equal(ctx.output("count", "rows"), "3");
  assert.equal(ctx.outputJson("count", "rows"), 3);
  assert.throws(() => ctx.outputJson("count"), /task count passed on no output return/);
  assert.deepEqual(ctx.params, { n: "5", day: "2026-03-08" });
});

test("the workflow builder writes the file, with upstreams from the functions' inputs", () => {
  const tasks = new Tasks(import.meta.url);
  const extract = tasks.task("extract", { inputs: { day: t.string() }, run: ({ day }) => [day] });
  const load = tasks.task("load", { inputs: { extract: t.array(t.string()), limit: param("limit", t.integer(), 10) }, run: ({ extract }) => extract.length });
  const report = tasks.task("report", { inputs: { rows: upstream(load) }, run: ({ rows }) => rows });
  const etl = new Workflow("etl", { app: "data", schedule: { cron: "0 2 * * *", timezone: "Europe/Paris" } });
  etl.task(extract, { labels: { sdk: "node" }, args: ["--fast"] });
  etl.task(load, { labels: { sdk: "node" }, retries: 2 });
  etl.task(report, { name: "report-task", timeout: "5m" });
  etl.shell("notify", "echo loaded ${tasks.load.outputs.return}", { upstream: "load", condition: "true" });
  etl.shell("alert", ["page", "oncall"], { handler: "on_failure" });
  assert.equal(
    etl.toYaml(),
    [
      "name: \"etl\"",
      "app: \"data\"",
      "schedule:",
      "  cron: \"0 2 * * *\"",
      "  timezone: \"Europe/Paris\"",
      "tasks:",
      "  - name: \"extract\"",
      "    argv:",
      "      - \"ax-node\"",
      "      - \"extract\"",
      "      - \"--fast\"",
      "    labels:",
      "      sdk: \"node\"",
      "  - name: \"load\"",
      "    argv:",
      "      - \"ax-node\"",
      "      - \"load\"",
      "    upstream: \"extract\"",
      "    labels:",
      "      sdk: \"node\"",
      "    retries: 2",
      "  - name: \"report-task\"",
      "    argv:",
      "      - \"ax-node\"",
      "      - \"report\"",
      "    upstream: \"load\"",
      "    timeout: \"5m\"",
      "  - name: \"notify\"",
      "    command: \"echo loaded ${tasks.load.outputs.return}\"",
      "    upstream: \"load\"",
      "    if: \"true\"",
      "on_failure:",
      "  - name: \"alert\"",
      "    argv:",
      "      - \"page\"",
      "      - \"oncall\"",
      "",
    ].join("\n"),
  );
  assert.throws(() => etl.shell("notify", "true"), /task notify is added twice/);
  assert.throws(() => etl.shell("late", "true", { upstream: "nowhere" }), /upstream nowhere is not a task added before it/);
  assert.throws(() => new Workflow("empty").toYaml(), /has no tasks/);
});

test("the SDK's state names are the protocol's", () => {
  for (const [name, value] of Object.entries(RunState)) {
    if (typeof value === "number") assert.equal(runStateName(value), name);
  }
  for (const [name, value] of Object.entries(InstanceState)) {
    if (typeof value === "number") assert.equal(instanceStateName(value), name);
  }
  assert.ok(Object.keys(TriggerKind).includes("PARENT"));
});

test("the version sent in Register is package.json's", () => {
  const pkg = JSON.parse(readFileSync(join(SDK, "package.json"), "utf8")) as { version: string };
  assert.equal(VERSION, pkg.version);
  assert.equal(WORKER_VERSION, `ax-sdk-typescript/${pkg.version}`);
});
