/**
 * The worker's side of worker.proto against a fake scheduler (a real gRPC server on loopback
 * whose answers each test scripts), with real task processes: registration, duplicates, batches
 * resent exactly as cut, cancel and timeout, stale and refused attempts, heartbeats, moves,
 * self-fencing, refused credentials, the guardian.
 */

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, test } from "node:test";

import * as grpc from "@grpc/grpc-js";
import { create, toBinary, type MessageInitShape } from "@bufbuild/protobuf";

import { Worker, WorkerRefused, WORKER_VERSION, type WorkerOptions } from "../src/index.js";
import { AttemptOutcome } from "../src/gen/ax/v1/types_pb.js";
import {
  AttemptRefSchema,
  CancelAttemptSchema,
  DispatchSchema,
  FinishedAckSchema,
  HeartbeatAckSchema,
  LogAckSchema,
  LogBatchSchema,
  MoveElsewhereSchema,
  ReportRefusedSchema,
} from "../src/gen/ax/v1/worker_pb.js";
import { FakeScheduler, recordingLogger, type FakeStream } from "./fake.js";
import { GUARD_MS, pidAlive, readPid, SDK, waitFor } from "./helpers.js";

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()!();
});

function scratch(): string {
  return mkdtempSync(join(tmpdir(), "ax-ts-worker-"));
}

async function started(options: WorkerOptions): Promise<Worker> {
  const worker = new Worker({ logger: recordingLogger().logger, flushTimeoutMs: 200, ...options });
  worker.start();
  cleanups.push(() => worker.stop({ drain: false, timeoutMs: 5000 }));
  return worker;
}

async function fake(options: Parameters<typeof FakeScheduler.start>[0] = {}): Promise<FakeScheduler> {
  const scheduler = await FakeScheduler.start(options);
  cleanups.push(() => scheduler.stop());
  return scheduler;
}

function dispatch(stream: FakeStream, fields: MessageInitShape<typeof DispatchSchema>): void {
  stream.send({ case: "dispatch", value: create(DispatchSchema, fields) });
}

const registered = (s: FakeStream) => s.frames.length > 0;

test("the Register names the worker, its labels, capacity, version, token and one incarnation", async () => {
  const scheduler = await fake();
  const worker = await started({
    scheduler: scheduler.address,
    id: "unit-register",
    labels: { sdk: "node", zone: "a" },
    capacity: 3,
    token: "w0rker",
  });
  const first = await scheduler.stream(0);
  await first.until(registered, "the Register");
  const [register] = first.of("register");
  assert.equal(first.authorization, "Bearer w0rker");
  assert.equal(register!.workerId, "unit-register");
  assert.deepEqual(register!.labels, { sdk: "node", zone: "a" });
  assert.equal(register!.capacity, 3);
  assert.equal(register!.version, WORKER_VERSION);
  assert.equal(register!.protocol, 1);
  assert.match(register!.incarnation, /^[0-9a-f]{32}$/);
  assert.equal(register!.incarnation, worker.incarnation);
  // A broken stream: the worker registers again, the same process with the same incarnation.
  await waitFor(() => worker.connected, "the worker connected");
  first.fail();
  const second = await scheduler.stream(1);
  await second.until(registered, "the second Register");
  assert.equal(second.of("register")[0]!.incarnation, worker.incarnation);
  await waitFor(() => worker.registrations === 2, "two registrations");
});

test("a repeated dispatch is rejected as a duplicate, one past capacity as full", async () => {
  const dir = scratch();
  const go = join(dir, "go");
  const scheduler = await fake();
  await started({ scheduler: scheduler.address, id: "unit-dup", capacity: 1, killGraceMs: 100 });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  const gated = { instanceId: 5n, attempt: 1, command: `echo hi; while [ ! -e '${go}' ]; do sleep 0.01; done` };
  dispatch(stream, gated);
  dispatch(stream, gated);
  dispatch(stream, { instanceId: 6n, attempt: 1, command: "true" });
  await stream.until((s) => s.of("rejected").length === 2, "two rejections");
  writeFileSync(go, "");
  await stream.until((s) => s.of("finished").length === 1, "the end");
  const kinds = stream.frames.map((f) => f.body.case).filter((k) => k !== "heartbeat");
  assert.deepEqual(kinds.slice(1, 3), ["accepted", "started"]);
  const rejected = stream.of("rejected");
  assert.deepEqual(rejected.map((r) => [r.instanceId, r.duplicate]), [[5n, true], [6n, false]]);
  assert.match(rejected[1]!.reason, /full/);
  const logs = stream.of("logs");
  assert.deepEqual(logs.map((b) => [b.firstSeq, b.body, [...b.streams]]), [[1n, "hi", [1]]]);
  const [finished] = stream.of("finished");
  assert.equal(finished!.outcome, AttemptOutcome.SUCCESS);
  assert.equal(finished!.exitCode, 0);
  assert.equal(finished!.logLines, 1n);
  // The lines come before the end.
  assert.ok(stream.frames.findIndex((f) => f.body.case === "logs") < stream.frames.findIndex((f) => f.body.case === "finished"));
  // Acknowledged, the attempt is forgotten but still known as a duplicate.
  stream.send({ case: "logAck", value: create(LogAckSchema, { instanceId: 5n, attempt: 1, seq: 1n }) });
  stream.send({ case: "finishedAck", value: create(FinishedAckSchema, { instanceId: 5n, attempt: 1 }) });
  dispatch(stream, gated);
  await stream.until((s) => s.of("rejected").length === 3, "the third rejection");
  assert.equal(stream.of("rejected")[2]!.duplicate, true);
  assert.equal(stream.of("accepted").length, 1);
});

test("a reconnect resends the unacknowledged batches exactly as they were cut, and the end", async () => {
  const dir = scratch();
  const one = join(dir, "one");
  const two = join(dir, "two");
  const scheduler = await fake();
  const worker = await started({ scheduler: scheduler.address, id: "unit-resend" });
  const first = await scheduler.stream(0);
  await first.until(registered, "the Register");
  await waitFor(() => worker.connected, "the worker connected");
  dispatch(first, {
    instanceId: 7n,
    attempt: 2,
    command:
      `echo a; echo b; echo c; while [ ! -e '${one}' ]; do sleep 0.01; done; echo d; echo e; ` +
      `while [ ! -e '${two}' ]; do sleep 0.01; done; echo f; echo g`,
  });
  await first.until((s) => s.of("logs").length === 1, "the first batch");
  writeFileSync(one, "");
  await first.until((s) => s.of("logs").length === 2, "the second batch");
  const sent = first.of("logs");
  assert.deepEqual(sent.map((b) => [b.firstSeq, b.body]), [[1n, "a\nb\nc"], [4n, "d\ne"]]);
  // Lines 1-3 are stored; the stream breaks before the ack of 4-5.
  first.send({ case: "logAck", value: create(LogAckSchema, { instanceId: 7n, attempt: 2, seq: 3n }) });
  await sleep(100);
  first.fail();
  const second = await scheduler.stream(1);
  await second.until(registered, "the second Register");
  const [register] = second.of("register");
  assert.deepEqual(register!.running.map((r) => [r.instanceId, r.attempt]), [[7n, 2]]);
  assert.deepEqual(register!.finished, []);
  await second.until((s) => s.of("logs").length === 1, "the resent batch");
  writeFileSync(two, "");
  await second.until((s) => s.of("finished").length === 1, "the end");
  const resent = second.frames.map((f) => f.body.case).filter((k) => k !== "heartbeat" && k !== "register");
  assert.deepEqual(resent, ["started", "logs", "logs", "finished"]);
  const again = second.of("logs");
  // The same bytes, sent_at_ms included: the batch as first cut.
  assert.deepEqual(toBinary(LogBatchSchema, again[0]!), toBinary(LogBatchSchema, sent[1]!));
  assert.deepEqual([again[1]!.firstSeq, again[1]!.body], [6n, "f\ng"]);
  assert.equal(second.of("finished")[0]!.logLines, 7n);
  // Unacknowledged, the end is listed as finished on the next stream and sent again there.
  second.fail();
  const third = await scheduler.stream(2);
  await third.until((s) => s.of("finished").length === 1, "the end resent");
  assert.deepEqual(third.of("register")[0]!.finished.map((r) => [r.instanceId, r.attempt]), [[7n, 2]]);
  assert.deepEqual(third.of("logs").map((b) => b.firstSeq), [4n, 6n]);
});

test("a cancel sends SIGTERM to the group once, SIGKILL after the kill grace, and ends CANCELLED", async () => {
  const dir = scratch();
  const scheduler = await fake();
  await started({ scheduler: scheduler.address, id: "unit-cancel", killGraceMs: 500 });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  const pidFile = join(dir, "child");
  dispatch(stream, {
    instanceId: 9n,
    attempt: 1,
    // The shell counts the SIGTERMs it gets and does not stop for them; its child too.
    command: `trap 'echo term' TERM; sh -c 'trap "" TERM; sleep 300' & echo $! > '${pidFile}'; echo ready; while :; do sleep 0.05; done`,
  });
  await stream.until((s) => s.of("logs").some((b) => b.body.includes("ready")), "the task ready");
  const child = await readPid(pidFile);
  // Two nodes cancel: one signal.
  const cancel = create(CancelAttemptSchema, { instanceId: 9n, attempt: 1, reason: "unit test" });
  stream.send({ case: "cancel", value: cancel });
  stream.send({ case: "cancel", value: cancel });
  await stream.until((s) => s.of("finished").length === 1, "the end");
  const [finished] = stream.of("finished");
  assert.equal(finished!.outcome, AttemptOutcome.CANCELLED);
  assert.equal(finished!.signal, 9);
  assert.equal(finished!.message, "unit test");
  const text = stream.of("logs").map((b) => b.body).join("\n").split("\n");
  assert.deepEqual(text.filter((l) => l === "term"), ["term"]);
  await waitFor(() => !pidAlive(child), "the group's other process gone");
});

test("Dispatch.timeout_ms is kept from the process's start: TIMEOUT, the group killed", async () => {
  const scheduler = await fake();
  await started({ scheduler: scheduler.address, id: "unit-timeout", killGraceMs: 200 });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  dispatch(stream, { instanceId: 10n, attempt: 3, timeoutMs: 300n, command: "trap '' TERM; echo waiting; sleep 60" });
  await stream.until((s) => s.of("finished").length === 1, "the end");
  const [finished] = stream.of("finished");
  assert.equal(finished!.outcome, AttemptOutcome.TIMEOUT);
  assert.equal(finished!.message, "killed after the timeout of 300 ms");
  assert.equal(finished!.signal, 9);
  assert.equal(finished!.logLines, 1n);
});

test("a task gets the dispatch env but not the worker's token", async () => {
  const saved = { AX_TOKEN: process.env.AX_TOKEN, WORKER_SETTING: process.env.WORKER_SETTING };
  process.env.AX_TOKEN = "worker-secret";
  process.env.WORKER_SETTING = "inherited";
  cleanups.push(() => {
    for (const [key, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[key];
      else process.env[key] = value;
    }
  });
  const scheduler = await fake();
  await started({ scheduler: scheduler.address, id: "unit-env" });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  dispatch(stream, {
    instanceId: 11n,
    attempt: 1,
    command: 'echo "${AX_TOKEN-unset} ${AX_TOKEN_FILE-unset} $WORKER_SETTING $FROM_DISPATCH"',
    env: { FROM_DISPATCH: "given" },
  });
  await stream.until((s) => s.of("finished").length === 1, "the end");
  assert.deepEqual(stream.of("logs").map((b) => b.body), ["unset unset inherited given"]);
});

test("argv runs without a shell; a process that cannot start is SPAWN_FAILED", async () => {
  const dir = scratch();
  const scheduler = await fake();
  await started({ scheduler: scheduler.address, id: "unit-argv" });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  dispatch(stream, { instanceId: 12n, attempt: 1, argv: ["printf", "%s|", "$HOME", "two words"] });
  dispatch(stream, { instanceId: 13n, attempt: 1, argv: [join(dir, "no-such-program")] });
  dispatch(stream, { instanceId: 14n, attempt: 1, command: "true", workingDir: join(dir, "no-such-dir") });
  await stream.until((s) => s.of("finished").length === 3, "three ends");
  const ends = new Map(stream.of("finished").map((f) => [f.instanceId, f]));
  assert.equal(ends.get(12n)!.outcome, AttemptOutcome.SUCCESS);
  assert.deepEqual(stream.of("logs").map((b) => b.body), ["$HOME|two words|"]);
  for (const id of [13n, 14n]) {
    assert.equal(ends.get(id)!.outcome, AttemptOutcome.SPAWN_FAILED);
    assert.match(ends.get(id)!.message, /^spawn failed: /);
  }
  // A process that never started has no AttemptStarted.
  assert.deepEqual(stream.of("started").map((s) => s.instanceId), [12n]);
});

test("output lines: numbered, split at newlines only, long ones cut between characters, bad UTF-8 replaced", async () => {
  const scheduler = await fake();
  await started({ scheduler: scheduler.address, id: "unit-lines", maxLineBytes: 8 });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  // "ééééé" is 10 bytes: cut after 4 characters (8 bytes). A '\r' before the newline stays.
  dispatch(stream, {
    instanceId: 15n,
    attempt: 1,
    command: "printf 'ééééé\\nabc\\r\\n\\n\\377x\\nend'",
  });
  await stream.until((s) => s.of("finished").length === 1, "the end");
  const body = stream.of("logs").map((b) => b.body).join("\n");
  assert.deepEqual(body.split("\n"), ["éééé", "é", "abc\r", "", "\ufffdx", "end"]);
  assert.equal(stream.of("finished")[0]!.logLines, 6n);
});

test("a process's outputs are read from $AX_OUTPUT, and a file that is not outputs fails the attempt", async () => {
  const scheduler = await fake();
  await started({ scheduler: scheduler.address, id: "unit-outputs" });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  dispatch(stream, { instanceId: 16n, attempt: 1, command: 'printf "rows=3\\nnote<<EOF\\na\\nb\\nEOF\\n" >> "$AX_OUTPUT"' });
  dispatch(stream, { instanceId: 17n, attempt: 1, command: 'echo "not outputs" >> "$AX_OUTPUT"' });
  await stream.until((s) => s.of("finished").length === 2, "two ends");
  const ends = new Map(stream.of("finished").map((f) => [f.instanceId, f]));
  assert.equal(ends.get(16n)!.outcome, AttemptOutcome.SUCCESS);
  assert.deepEqual(ends.get(16n)!.outputs, { rows: "3", note: "a\nb" });
  assert.equal(ends.get(17n)!.outcome, AttemptOutcome.FAILED);
  assert.equal(ends.get(17n)!.message, "outputs refused: $AX_OUTPUT line 1: expected KEY=VALUE or KEY<<DELIMITER");
});

test("stale and refused attempts are killed and forgotten, and stay known as duplicates", async () => {
  const dir = scratch();
  // The first stream is answered at once; the test answers the second itself.
  const scheduler = await fake({
    onConnect: (stream) => {
      if (scheduler.streams.length === 1) void stream.until(registered, "the Register").then(() => stream.registered(), () => {});
    },
  });
  const worker = await started({ scheduler: scheduler.address, id: "unit-stale", killGraceMs: 100 });
  const first = await scheduler.stream(0);
  await first.until(registered, "the Register");
  await waitFor(() => worker.connected, "the worker connected");
  const pids: Record<string, number> = {};
  for (const id of [21n, 22n, 23n]) {
    const file = join(dir, `pid-${id}`);
    dispatch(first, { instanceId: id, attempt: 1, command: `echo $$ > '${file}'; exec sleep 300` });
    pids[String(id)] = await readPid(file);
  }
  cleanups.push(() => {
    for (const pid of Object.values(pids)) if (pidAlive(pid)) process.kill(pid, "SIGKILL");
  });
  // ReportRefused with kill: the process group dies, nothing more is said about it.
  first.send({
    case: "refused",
    value: create(ReportRefusedSchema, { instanceId: 22n, attempt: 1, reason: "not current", kill: true, code: 9 }),
  });
  await waitFor(() => !pidAlive(pids["22"]!), "the refused attempt killed");
  await waitFor(() => worker.runningAttempts().length === 2, "the refused attempt forgotten");
  // A new stream on which the scheduler calls attempt 21 stale.
  first.fail();
  const second = await scheduler.stream(1);
  await second.until(registered, "the second Register");
  assert.deepEqual(second.of("register")[0]!.running.map((r) => r.instanceId).sort(), [21n, 23n]);
  second.registered({ stale: [create(AttemptRefSchema, { instanceId: 21n, attempt: 1 })] });
  await waitFor(() => !pidAlive(pids["21"]!), "the stale attempt killed");
  await waitFor(() => worker.runningAttempts().length === 1, "the stale attempt forgotten");
  assert.ok(pidAlive(pids["23"]!));
  await second.until((s) => s.of("started").length >= 1, "the kept attempt's Started");
  assert.deepEqual([...new Set(second.of("started").map((s) => s.instanceId))], [23n]);
  // Both stay known: a repeated dispatch of either is a duplicate.
  dispatch(second, { instanceId: 21n, attempt: 1, command: "true" });
  dispatch(second, { instanceId: 22n, attempt: 1, command: "true" });
  await second.until((s) => s.of("rejected").length === 2, "two rejections");
  assert.deepEqual(second.of("rejected").map((r) => r.duplicate), [true, true]);
  assert.equal(second.of("finished").length, 0, "nothing is reported about a forgotten attempt");
});

test("heartbeats at the intervals Registered gives; a stream silent for 4 of them is broken", async () => {
  const scheduler = await fake({
    onConnect: (stream) =>
      void stream.until(registered, "the Register").then(
        () => stream.registered({ heartbeatIntervalMs: 100, taskHeartbeatIntervalMs: 150, workerDeadAfterMs: 60_000 }),
        () => {},
      ),
  });
  const { messages, logger } = recordingLogger();
  await started({ scheduler: scheduler.address, id: "unit-beats", logger });
  const first = await scheduler.stream(0);
  await first.until(registered, "the Register");
  dispatch(first, { instanceId: 30n, attempt: 1, command: "exec sleep 300" });
  await first.until(
    (s) => s.of("heartbeat").length >= 3 && s.of("taskHeartbeat").length >= 2,
    "worker and task heartbeats",
  );
  assert.ok(first.of("taskHeartbeat").every((h) => h.instanceId === 30n && h.attempt === 1));
  assert.equal(first.of("heartbeat").at(-1)!.running, 1);
  // The fake never acknowledges: the worker takes the silent stream as broken and registers again.
  const second = await scheduler.stream(1);
  await second.until(registered, "the second Register");
  assert.deepEqual(second.of("register")[0]!.running.map((r) => r.instanceId), [30n]);
  assert.ok(messages.some((m) => /^no frame from http:\/\/127\.0\.0\.1:\d+ for \d+\.\d s: reconnecting$/.test(m)), messages.join("\n"));
});

test("MoveElsewhere ends the stream and the worker registers at the named endpoint", async () => {
  const a = await fake();
  const b = await fake();
  const { messages, logger } = recordingLogger();
  await started({ scheduler: [a.address, b.address], id: "unit-move", logger });
  // Wherever it went first, it is asked to move to the other.
  const [here, there] = await Promise.race([
    a.stream(0).then(() => [a, b] as const),
    b.stream(0).then(() => [b, a] as const),
  ]);
  const stream = here.streams[0]!;
  await stream.until(registered, "the Register");
  await waitFor(() => messages.some((m) => m.startsWith("registered with")), "registered");
  stream.send({
    case: "moveElsewhere",
    value: create(MoveElsewhereSchema, { reason: "spread", toAddress: there.address }),
  });
  const moved = await there.stream(0);
  await moved.until(registered, "the Register at the other node");
  assert.equal(here.streams.length, 1, "it did not register at the first node again");
  assert.ok(messages.includes(`asked to move to another node (${there.address}): spread`), messages.join("\n"));
});

test("cut off from a live scheduler, the worker fences its attempts at 3/4 of the dead-worker threshold", async () => {
  let acking = true;
  let connects = 0;
  const scheduler = await fake({
    onConnect: (stream) => {
      connects += 1;
      if (connects > 1) return; // later streams hang without an answer, as behind a partition
      void stream.until(registered, "the Register").then(() => {
        stream.registered({ heartbeatIntervalMs: 100, workerDeadAfterMs: 1600 });
        const ack = setInterval(() => {
          if (!acking || stream.ended) return clearInterval(ack);
          stream.send({ case: "heartbeatAck", value: create(HeartbeatAckSchema, {}) });
        }, 100);
      }, () => {});
    },
  });
  const { messages, logger } = recordingLogger();
  await started({ scheduler: scheduler.address, id: "unit-fence", logger, killGraceMs: 200 });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  dispatch(stream, { instanceId: 40n, attempt: 1, command: "echo $$; exec sleep 300" });
  dispatch(stream, { instanceId: 41n, attempt: 1, keepWhenCutOff: true, command: "echo kept; exec sleep 300" });
  await stream.until((s) => s.of("logs").length >= 2, "both tasks' lines");
  const pid = Number(stream.of("logs").find((b) => b.instanceId === 40n)!.body);
  await stream.until((s) => s.of("heartbeat").length >= 3, "heartbeats acknowledged");
  // The scheduler goes silent; the connection stays up, nothing refuses: only the fence helps.
  acking = false;
  await waitFor(() => !pidAlive(pid), "the fenced attempt's process gone");
  assert.ok(messages.some((m) => /^no contact with a scheduler for \d+\.\d s: fencing attempt 40\/1$/.test(m)), messages.join("\n"));
  assert.ok(!messages.some((m) => m.includes("fencing attempt 41/1")), "keep_when_cut_off is kept");
  const finished = await waitFor(() => stream.of("finished")[0] ?? scheduler.streams.flatMap((s) => s.of("finished"))[0], "the fenced end");
  assert.equal(finished.outcome, AttemptOutcome.FAILED);
  assert.match(finished.message, /^fenced: no contact with a scheduler for \d+\.\d s$/);
});

for (const [code, advice] of [
  [grpc.status.UNAUTHENTICATED, "Give the worker a valid token: new Worker({ token })"],
  [grpc.status.PERMISSION_DENIED, 'Give it a worker token whose worker ids include "unit-refused"'],
] as const) {
  test(`a ${grpc.status[code]} registration stops the worker with an SDK-worded error, asked once`, async () => {
    const scheduler = await fake({
      onConnect: (stream) => stream.fail(code, "token not accepted (create one with axctl token create --role worker)"),
    });
    const worker = new Worker({
      scheduler: scheduler.address,
      id: "unit-refused",
      token: "wrong",
      logger: recordingLogger().logger,
    });
    const error = await worker.run({ handleSignals: false }).then(
      () => undefined,
      (e: unknown) => e,
    );
    assert.ok(error instanceof WorkerRefused, String(error));
    assert.ok(
      error.message.startsWith(
        `the scheduler at ${scheduler.address} refused worker "unit-refused" (${grpc.status[code]}: token not accepted`,
      ),
      error.message,
    );
    assert.ok(error.message.includes(advice), error.message);
    assert.equal(scheduler.streams.length, 1, "asked once: trying again cannot help");
  });
}

test("an address refusing connections is warned about at once, and not on every try", async () => {
  const port = await new Promise<number>((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
  const { messages, logger } = recordingLogger();
  await started({ scheduler: `http://127.0.0.1:${port}`, id: "unit-unreachable", logger, reconnectMaxMs: 200 });
  const wanted = `cannot connect to http://127.0.0.1:${port} (connection refused: is a scheduler running there?); trying again`;
  await waitFor(() => messages.includes(wanted), "the warning", 10_000);
  await sleep(1000);
  assert.equal(messages.filter((m) => m === wanted).length, 1, messages.join("\n"));
});

test("the guardian kills the tasks of a worker killed with SIGKILL", async () => {
  const dir = scratch();
  const scheduler = await fake();
  const worker = spawn(
    process.execPath,
    [join(SDK, "dist/src/cli.js"), "--scheduler", scheduler.address, "--id", "unit-guardian"],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let log = "";
  worker.stderr.on("data", (chunk: Buffer) => (log += chunk.toString()));
  cleanups.push(() => {
    if (worker.exitCode === null && worker.signalCode === null) worker.kill("SIGKILL");
  });
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  const leader = join(dir, "leader");
  const child = join(dir, "child");
  dispatch(stream, {
    instanceId: 50n,
    attempt: 1,
    command: `sleep 300 & echo $! > '${child}'; echo $$ > '${leader}'; wait`,
  });
  const pids = [await readPid(leader), await readPid(child)];
  assert.ok(pids.every(pidAlive));
  worker.kill("SIGKILL");
  await waitFor(() => pids.every((p) => !pidAlive(p)), `the task's processes gone (worker log:\n${log})`);
  assert.ok(!existsSync(join(dir, "never")));
});

test("a worker stopped with drain finishes what runs and has its ends acknowledged", async () => {
  const scheduler = await fake({
    onConnect: (stream) =>
      void stream.until(registered, "the Register").then(() => {
        stream.registered();
        // Acknowledge every end, as a scheduler does once it stored it.
        const acks = setInterval(() => {
          if (stream.ended) return clearInterval(acks);
          for (const end of stream.of("finished")) {
            stream.send({ case: "finishedAck", value: create(FinishedAckSchema, { instanceId: end.instanceId, attempt: end.attempt }) });
          }
        }, 20);
      }, () => {}),
  });
  const worker = new Worker({ scheduler: scheduler.address, id: "unit-drain", logger: recordingLogger().logger });
  worker.start();
  const stream = await scheduler.stream(0);
  await stream.until(registered, "the Register");
  await waitFor(() => worker.connected, "connected");
  dispatch(stream, { instanceId: 60n, attempt: 1, command: "sleep 0.3; echo done" });
  await stream.until((s) => s.of("started").length === 1, "started");
  const stopping = worker.stop({ drain: true, timeoutMs: GUARD_MS });
  // Draining: a new dispatch is refused, not started.
  dispatch(stream, { instanceId: 61n, attempt: 1, command: "true" });
  await stopping;
  const [end] = stream.of("finished");
  assert.equal(end!.outcome, AttemptOutcome.SUCCESS);
  assert.deepEqual(stream.of("rejected").map((r) => [r.instanceId, r.duplicate, r.reason]), [[61n, false, "the worker is draining"]]);
  assert.equal(worker.runningAttempts().length, 0);
});
