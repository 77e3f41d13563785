/**
 * The client against a fake scheduler: the bearer token on every call, TLS with a CA file, the
 * retries of a trigger refused for load, `wait` following WatchRun across an unavailable node,
 * and what mark, rerun and a workflow's declared params send and read.
 */

import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, test } from "node:test";

import * as grpc from "@grpc/grpc-js";
import { create, toBinary } from "@bufbuild/protobuf";

import { AxError, Client, retryDelayMs, WaitTimeout, Worker, workflowParams } from "../src/index.js";
import {
  AttemptSchema,
  InstanceCountsSchema,
  InstanceSchema,
  OverloadedSchema,
  RunSchema,
  TriggerWorkflowResponseSchema,
  WorkflowParamSchema,
  WorkflowSchema,
  type GetRunRequest,
  type GetWorkflowRequest,
  type Instance as PbInstance,
  type MarkInstanceRequest,
  type RerunRunRequest,
  type Run as PbRun,
  type TriggerWorkflowRequest,
  type WatchRunRequest,
  type Workflow as PbWorkflow,
} from "../src/gen/ax/v1/control_pb.js";
import { InstanceState, RunState } from "../src/gen/ax/v1/types_pb.js";
import { FakeScheduler, recordingLogger } from "./fake.js";

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

async function fake(options: Parameters<typeof FakeScheduler.start>[0] = {}): Promise<FakeScheduler> {
  const scheduler = await FakeScheduler.start(options);
  cleanups.push(() => scheduler.stop());
  return scheduler;
}

function client(address: string | string[], options: ConstructorParameters<typeof Client>[1] = {}): Client {
  const made = new Client(address, { logger: recordingLogger().logger, ...options });
  cleanups.push(() => made.close());
  return made;
}

/** GetRun answers with the authorization metadata it received, as the run's triggered_by. */
const echo = {
  getRun: (call: grpc.ServerUnaryCall<GetRunRequest, PbRun>, callback: grpc.sendUnaryData<PbRun>) =>
    callback(null, create(RunSchema, { id: call.request.id, triggeredBy: String(call.metadata.get("authorization")[0] ?? "") })),
};

test("the token goes with every call as a bearer, and with none without it", async () => {
  const scheduler = await fake({ control: echo });
  assert.equal((await client(scheduler.address, { token: "s3cret" }).getRun(42)).triggeredBy, "Bearer s3cret");
  const plain = await client(`127.0.0.1:${scheduler.port}`).getRun(42);
  assert.equal(plain.id, 42);
  assert.equal(plain.triggeredBy, "");
});

test("the retry delay is the scheduler's policy (ax_core::admission)", () => {
  // The same table as ax_core::admission's test of client_retry_delay_ms.
  assert.equal(retryDelayMs(1, 0, 0), 250);
  assert.equal(retryDelayMs(1, 0, 1), 500);
  assert.equal(retryDelayMs(4, 0, 1), 4000);
  assert.equal(retryDelayMs(40, 0, 1), 30_000);
  assert.equal(retryDelayMs(1, 1000, 0), 1000);
  assert.equal(retryDelayMs(1, 1000, 1), 1250);
  assert.equal(retryDelayMs(6, 1000, 0), 8000);
});

/** Refuses the first `refuse` triggers for load as the scheduler does, then creates run 7. */
function overloaded(refuse: number, code = grpc.status.RESOURCE_EXHAUSTED, hinted = true) {
  const calls: number[] = [];
  const params: Array<Record<string, string>> = [];
  return {
    calls,
    params,
    control: {
      triggerWorkflow: (
        call: grpc.ServerUnaryCall<TriggerWorkflowRequest, unknown>,
        callback: grpc.sendUnaryData<unknown>,
      ) => {
        calls.push(Date.now());
        params.push({ ...call.request.params, __key: call.request.idempotencyKey });
        if (calls.length <= refuse) {
          const metadata = new grpc.Metadata();
          if (hinted) {
            metadata.set("retry-after", "1");
            metadata.set(
              "ax-overloaded-bin",
              Buffer.from(
                toBinary(OverloadedSchema, create(OverloadedSchema, { bound: "app", app: "etl", waiting: 5n, limit: 5n, retryAfterMs: 300n })),
              ),
            );
          }
          callback({ code, details: `workflow "${call.request.name}" not triggered: the bound is met`, metadata });
          return;
        }
        callback(
          null,
          create(TriggerWorkflowResponseSchema, {
            run: create(RunSchema, { id: 7n, workflow: call.request.name, params: call.request.params }),
            created: true,
          }),
        );
      },
    },
  };
}

test("a trigger refused for load waits past the hint, says so, and tries again", async () => {
  const service = overloaded(2);
  const scheduler = await fake({ control: service.control });
  const { messages, logger } = recordingLogger();
  const triggered = await new Client(scheduler.address, { logger }).trigger(
    "etl",
    { day: "2026-01-31", n: 3, flags: { a: true } },
    { idempotencyKey: "k-1" },
  );
  assert.equal(triggered.run.id, 7);
  assert.equal(triggered.created, true);
  assert.equal(service.calls.length, 3);
  for (let i = 1; i < service.calls.length; i++) assert.ok(service.calls[i]! - service.calls[i - 1]! >= 300);
  // Strings as they are, anything else as JSON; the same key on every try.
  assert.deepEqual(service.params.at(-1), { day: "2026-01-31", n: "3", flags: '{"a":true}', __key: "k-1" });
  const waits = messages.filter((m) => m.includes("refused for load"));
  assert.equal(waits.length, 2, messages.join("\n"));
  assert.ok(waits[0]!.includes("the bound is met"));
  assert.ok(waits[1]!.endsWith("(refusal 2, giving up after 60s)"), waits[1]);
});

test("a trigger still refused after retryForMs throws with the bound; other refusals are not tried again", async () => {
  const service = overloaded(1000);
  const scheduler = await fake({ control: service.control });
  const patient = client(scheduler.address, { retryForMs: 1000 });
  const error = await patient.trigger("etl").catch((e: unknown) => e);
  assert.ok(error instanceof AxError);
  assert.equal(error.codeName, "RESOURCE_EXHAUSTED");
  assert.deepEqual([error.overloaded?.bound, error.overloaded?.app, error.overloaded?.limit], ["app", "etl", 5n]);
  assert.ok(error.refusals >= 2 && error.refusals === service.calls.length, `${error.refusals} ${service.calls.length}`);
  const calls = service.calls.length;
  await assert.rejects(patient.trigger("etl", {}, { retryForMs: 0 }), AxError);
  assert.equal(service.calls.length, calls + 1);

  for (const other of [overloaded(5, grpc.status.NOT_FOUND), overloaded(5, grpc.status.RESOURCE_EXHAUSTED, false)]) {
    const refusing = await fake({ control: other.control });
    const refused = await client(refusing.address).trigger("etl").catch((e: unknown) => e);
    assert.ok(refused instanceof AxError);
    assert.equal(refused.overloaded, undefined);
    assert.equal(other.calls.length, 1);
  }
});

test("wait follows WatchRun, and tries the next address while a node is unavailable", async () => {
  const down = await fake({
    control: {
      watchRun: (call: grpc.ServerWritableStream<WatchRunRequest, PbRun>) =>
        call.emit("error", { code: grpc.status.UNAVAILABLE, details: "restarting" }),
    },
  });
  const settles: number[] = [];
  const up = await fake({
    control: {
      watchRun: (call: grpc.ServerWritableStream<WatchRunRequest, PbRun>) => {
        settles.push(call.request.settleMs);
        const counts = create(InstanceCountsSchema, { running: 1 });
        call.write(create(RunSchema, { id: call.request.id, state: RunState.RUNNING, counts }));
        call.write(
          create(RunSchema, {
            id: call.request.id,
            state: RunState.SUCCESS,
            counts: create(InstanceCountsSchema, { success: 1 }),
            finishedAtMs: 1_770_000_000_000n,
          }),
        );
        call.end();
      },
    },
  });
  const both = client([down.address, up.address]);
  const run = await both.wait(12, { timeoutMs: 30_000, settleMs: 5000 });
  assert.equal(run.id, 12);
  assert.equal(run.state, "SUCCESS");
  assert.equal(run.counts.success, 1);
  assert.deepEqual(run.finishedAt, new Date(1_770_000_000_000));
  assert.deepEqual(settles, [5000]);
  const seen = [];
  for await (const change of both.watch(12)) seen.push(change.state);
  assert.deepEqual(seen, ["RUNNING", "SUCCESS"]);
  // Alone, the unavailable node is waited on until the timeout, which names what was seen.
  const error = await client(down.address).wait(12, { timeoutMs: 1000 }).catch((e: unknown) => e);
  assert.ok(error instanceof WaitTimeout, String(error));
  assert.match(error.message, /^run 12 did not end within 1000 ms \(last seen: scheduler unavailable \(restarting\)\)$/);
});

test("https addresses verify the scheduler against the CA file, for the client and the worker", async () => {
  const dir = mkdtempSync(join(tmpdir(), "ax-ts-tls-"));
  const cert = join(dir, "cert.pem");
  const key = join(dir, "key.pem");
  try {
    execFileSync(
      "openssl",
      [
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", key, "-out", cert,
        "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
      ],
      { stdio: "ignore" },
    );
  } catch (error) {
    if (process.env.CI === "true") throw new Error(`CI=true but openssl cannot make a certificate: ${error}`);
    return;
  }
  const scheduler = await fake({
    control: echo,
    credentials: grpc.ServerCredentials.createSsl(null, [{ private_key: readFileSync(key), cert_chain: readFileSync(cert) }]),
  });
  const address = `https://127.0.0.1:${scheduler.port}`;
  assert.equal((await client(address, { token: "over-tls", tlsCa: cert }).getRun(7)).triggeredBy, "Bearer over-tls");
  // Without the CA the scheduler's certificate is not trusted; plaintext to a TLS port fails too.
  const untrusted = await client(address, { timeoutMs: 5000 }).getRun(7).catch((e: unknown) => e);
  assert.ok(untrusted instanceof AxError);
  assert.equal(untrusted.codeName, "UNAVAILABLE");
  await assert.rejects(client(`http://127.0.0.1:${scheduler.port}`, { timeoutMs: 5000 }).getRun(7), AxError);
  const worker = new Worker({ scheduler: address, id: "unit-tls", tlsCa: cert, logger: recordingLogger().logger });
  worker.start();
  cleanups.push(() => worker.stop({ drain: false, timeoutMs: 5000 }));
  const stream = await scheduler.stream(0);
  await stream.until((s) => s.frames.length > 0, "the Register over TLS");
  assert.equal(stream.of("register")[0]!.workerId, "unit-tls");
});

/** Answers MarkInstance, RerunRun and GetWorkflow as the scheduler words them, recording each request. */
function controls() {
  const marks: MarkInstanceRequest[] = [];
  const reruns: RerunRunRequest[] = [];
  return {
    marks,
    reruns,
    control: {
      markInstance: (call: grpc.ServerUnaryCall<MarkInstanceRequest, PbInstance>, callback: grpc.sendUnaryData<PbInstance>) => {
        marks.push(call.request);
        if (call.request.reason.trim() === "") {
          callback({ code: grpc.status.INVALID_ARGUMENT, details: "a mark needs a reason (say why the task's outcome is overridden)" });
          return;
        }
        const note = `marked ${InstanceState[call.request.state]} by ${call.request.actor}: ${call.request.reason}`;
        callback(
          null,
          create(InstanceSchema, {
            id: call.request.id,
            task: "extract",
            state: call.request.state,
            attempt: 1,
            attempts: [create(AttemptSchema, { attempt: 1, state: call.request.state, message: note })],
          }),
        );
      },
      rerunRun: (call: grpc.ServerUnaryCall<RerunRunRequest, PbRun>, callback: grpc.sendUnaryData<PbRun>) => {
        reruns.push(call.request);
        if (call.request.tasks.includes("nope")) {
          callback({ code: grpc.status.NOT_FOUND, details: `run ${call.request.id} has no task "nope"; its tasks are: a, b` });
          return;
        }
        callback(null, create(RunSchema, { id: call.request.id, state: RunState.RUNNING }));
      },
      getWorkflow: (call: grpc.ServerUnaryCall<GetWorkflowRequest, PbWorkflow>, callback: grpc.sendUnaryData<PbWorkflow>) =>
        callback(
          null,
          create(WorkflowSchema, {
            name: call.request.name,
            params: [
              create(WorkflowParamSchema, { name: "region", description: "Where", defaultValue: "eu", hasDefault: true }),
              create(WorkflowParamSchema, { name: "env", required: true, choices: ["staging", "prod"] }),
              create(WorkflowParamSchema, { name: "blank", defaultValue: "", hasDefault: true }),
            ],
          }),
        ),
    },
  };
}

test("mark sends the state, the reason and the actor, and a refusal names what was wrong", async () => {
  const service = controls();
  const scheduler = await fake({ control: service.control });
  const marking = client(scheduler.address, { actor: "ts-tests" });
  const marked = await marking.mark(12, "SUCCESS", { reason: "loaded by hand" });
  assert.deepEqual([marked.id, marked.state, marked.attempt], [12, "SUCCESS", 1]);
  assert.equal(marked.attempts[0]!.message, "marked SUCCESS by ts-tests: loaded by hand");
  assert.equal((await marking.mark(13, "FAILED", { reason: "stuck" })).state, "FAILED");
  assert.deepEqual(
    service.marks.map((m) => [m.id, m.state, m.reason, m.actor]),
    [
      [12n, InstanceState.SUCCESS, "loaded by hand", "ts-tests"],
      [13n, InstanceState.FAILED, "stuck", "ts-tests"],
    ],
  );
  // The scheduler's refusal, as it words it.
  const refused = await marking.mark(12, "SUCCESS", { reason: " " }).catch((e: unknown) => e);
  assert.ok(refused instanceof AxError);
  assert.equal(refused.codeName, "INVALID_ARGUMENT");
  assert.equal(refused.message, "MarkInstance: INVALID_ARGUMENT: a mark needs a reason (say why the task's outcome is overridden)");
  // A state that is no outcome is refused before any call (for callers the types do not hold).
  const calls = service.marks.length;
  for (const bad of ["RUNNING", "skipped", undefined]) {
    await assert.rejects(
      marking.mark(12, bad as unknown as "SUCCESS", { reason: "x" }),
      (e: unknown) => e instanceof RangeError && e.message === `an instance can be marked SUCCESS or FAILED only, not ${JSON.stringify(bad)}`,
    );
  }
  assert.equal(service.marks.length, calls);
});

test("rerun sends the chosen tasks, one name or several", async () => {
  const service = controls();
  const scheduler = await fake({ control: service.control });
  const rerunning = client(scheduler.address, { actor: "ts-tests" });
  const run = await rerunning.rerun(40, { tasks: ["b", "c"] });
  assert.deepEqual([run.id, run.state], [40, "RUNNING"]);
  await rerunning.rerun(40, { tasks: "b" });
  await rerunning.rerun(40, { fromTask: "a" });
  await rerunning.rerun(40, { failed: true });
  assert.deepEqual(
    service.reruns.map((r) => [r.id, r.failed, r.fromTask, r.tasks, r.actor]),
    [
      [40n, false, "", ["b", "c"], "ts-tests"],
      [40n, false, "", ["b"], "ts-tests"],
      [40n, false, "a", [], "ts-tests"],
      [40n, true, "", [], "ts-tests"],
    ],
  );
  const refused = await rerunning.rerun(40, { tasks: ["nope"] }).catch((e: unknown) => e);
  assert.ok(refused instanceof AxError);
  assert.equal(refused.codeName, "NOT_FOUND");
  assert.equal(refused.details, 'run 40 has no task "nope"; its tasks are: a, b');
});

test("a workflow's declared params come back typed, an empty default a default", async () => {
  const scheduler = await fake({ control: controls().control });
  const reading = client(scheduler.address);
  const workflow = await reading.getWorkflow("etl");
  assert.deepEqual(
    workflow.params.map((p) => p.name),
    ["region", "env", "blank"],
  );
  const params = await reading.workflowParams("etl");
  assert.deepEqual(
    params.map(({ pb: _pb, ...view }) => view),
    [
      { name: "region", description: "Where", default: "eu", required: false, choices: [] },
      { name: "env", description: "", default: undefined, required: true, choices: ["staging", "prod"] },
      { name: "blank", description: "", default: "", required: false, choices: [] },
    ],
  );
  assert.deepEqual(workflowParams(workflow), params);
});
