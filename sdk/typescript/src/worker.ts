/**
 * An ax worker in TypeScript: the contract of `proto/ax/v1/worker.proto`, as `ax-worker` and the
 * Python SDK keep it.
 *
 * It holds one stream to one scheduler node at a time and
 *
 * - registers first, with its id, labels, capacity and version, listing the attempts it still
 *   runs (`running`) and the ends not yet acknowledged (`finished`), so a reconnect re-attaches
 *   them; then resends, per attempt and in order, AttemptStarted, every LogBatch not covered by a
 *   LogAck and the AttemptFinished not yet acknowledged;
 * - sends WorkerHeartbeat and a TaskHeartbeat per running attempt at the intervals the scheduler
 *   asks in Registered, and takes a stream whose frames (HeartbeatAcks) stop for 4 heartbeat
 *   intervals as broken;
 * - answers Dispatch with DispatchAccepted and starts the task, or DispatchRejected (`duplicate`
 *   for an attempt it runs or ran; otherwise only when it did not and will not start it);
 * - runs each attempt as a child process leading a process group of its own, with the Dispatch's
 *   env added to the worker's (less the worker's AX_TOKEN and AX_TOKEN_FILE); a guardian process
 *   kills the groups if the worker dies, even of SIGKILL;
 * - numbers the output lines from 1, sends them in packed LogBatches, and keeps each batch until
 *   a LogAck covers it, resending it exactly as first cut (the scheduler knows a batch by its
 *   first_seq);
 * - enforces Dispatch.timeout_ms itself from the process's start (SIGTERM to the group once,
 *   SIGKILL after the kill grace, outcome TIMEOUT), and CancelAttempt the same way (CANCELLED);
 * - resends AttemptFinished on every new stream until FinishedAck or ReportRefused;
 * - kills what ReportRefused(kill) and Registered.stale name, and forgets it;
 * - sends the same random incarnation on every Register of the process;
 * - reconnects with exponential backoff and full jitter, going round its list of addresses,
 *   follows MoveElsewhere, and fences itself (kills its attempts, reported FAILED) when cut off
 *   from every live node for 3/4 of the scheduler's dead-worker threshold, an endpoint that
 *   actively refuses connections counting as a node that is down rather than one judging it;
 * - stops with a `WorkerRefused` error when a scheduler refuses its credentials at registration
 *   (UNAUTHENTICATED or PERMISSION_DENIED): trying again cannot help.
 *
 * Tasks are shell commands (`/bin/sh -c`, or the Dispatch's argv) and the functions of the task
 * registries it serves (`ax-node NAME [ARG...]`, see `functions.ts`).
 */

import { spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { lookup } from "node:dns/promises";
import { EventEmitter } from "node:events";
import { mkdirSync, openSync, closeSync, readFileSync, statSync, unlinkSync } from "node:fs";
import { connect as tcpConnect } from "node:net";
import { hostname as osHostname, tmpdir, constants as osConstants } from "node:os";
import { join } from "node:path";
import { performance } from "node:perf_hooks";
import { fileURLToPath } from "node:url";

import * as grpc from "@grpc/grpc-js";
import { create } from "@bufbuild/protobuf";

import { ConfigError, Credentials, parseEndpoint, parseEndpoints, type CredentialOptions, type Endpoint } from "./connection.js";
import { functionCall, inFunctionChild, SPEC_ENV, type ChildSpec, type Tasks } from "./functions.js";
import { stderrLogger, type Logger } from "./log.js";
import { MAX_ATTEMPT_BYTES, OutputsError, parseOutputs } from "./outputs.js";
import { Channel, statusName } from "./rpc.js";
import { VERSION } from "./version.js";
import { AttemptOutcome } from "./gen/ax/v1/types_pb.js";
import {
  AttemptFinishedSchema,
  AttemptRefSchema,
  AttemptStartedSchema,
  DispatchAcceptedSchema,
  DispatchRejectedSchema,
  LogBatchSchema,
  LogStream,
  ProtocolVersion,
  RegisterSchema,
  TaskHeartbeatSchema,
  WorkerHeartbeatSchema,
  WorkerMessageSchema,
  WorkerService,
  type AttemptFinished,
  type AttemptRef,
  type Dispatch,
  type LogBatch,
  type Register,
  type Registered,
  type SchedulerMessage,
  type WorkerMessage,
} from "./gen/ax/v1/worker_pb.js";

/** What this worker sends as Register.version. */
export const WORKER_VERSION = `ax-sdk-typescript/${VERSION}`;

/** LogBatch limits: lines and body bytes per batch, and how long a line may wait for company. */
export const BATCH_MAX_LINES = 4096;
export const BATCH_MAX_BYTES = 1 << 20;
export const BATCH_DELAY_MS = 50;

/** The fraction of the scheduler's dead-worker threshold after which a cut-off worker fences. */
export const FENCE_FRACTION = 0.75;

/** How often an endpoint that cannot be reached is warned about while it stays so. */
const UNREACHABLE_WARNING_EVERY_MS = 30_000;

/** How long an exited attempt's pipes may stay open (held by an escaped grandchild) before the worker stops reading them. */
const PIPE_DRAIN_MS = 10_000;

const FNRUN = fileURLToPath(new URL("./fnrun.js", import.meta.url));
const GUARDIAN = fileURLToPath(new URL("./guardian.js", import.meta.url));

type Key = string;
type Body = WorkerMessage["body"];

function keyOf(instanceId: bigint, attempt: number): Key {
  return `${instanceId}/${attempt}`;
}

function now(): number {
  return performance.now();
}

function nowMs(): bigint {
  return BigInt(Date.now());
}

/** A scheduler refused the worker's credentials (UNAUTHENTICATED or PERMISSION_DENIED). */
export class WorkerRefused extends Error {
  override name = "WorkerRefused";
  readonly code: number;
  constructor(message: string, code: number) {
    super(message);
    this.code = code;
  }
}

/** Signals a process group; false when it no longer exists. */
function killGroup(group: number, signal: NodeJS.Signals): boolean {
  if (group <= 1) return false;
  try {
    process.kill(-group, signal);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM";
  }
}

/** Where to cut `data` at most `limit` bytes in, not inside a UTF-8 character. */
export function cutAt(data: Uint8Array, limit: number): number {
  let cut = Math.min(limit, data.length);
  while (cut > 0 && cut > limit - 4 && cut < data.length && (data[cut]! & 0xc0) === 0x80) cut -= 1;
  return cut > 0 ? cut : Math.min(limit, data.length);
}

function crc32(text: string): number {
  let crc = 0xffffffff;
  for (const byte of Buffer.from(text, "utf8")) {
    crc ^= byte;
    for (let k = 0; k < 8; k++) crc = crc & 1 ? (crc >>> 1) ^ 0xedb88320 : crc >>> 1;
  }
  return (crc ^ 0xffffffff) >>> 0;
}

/** Makes an attempt's empty $AX_OUTPUT file, readable by this worker's account only. */
function outputFile(key: Key): string {
  const directory = join(tmpdir(), `ax-sdk-outputs-${process.getuid?.() ?? "user"}`);
  mkdirSync(directory, { recursive: true, mode: 0o700 });
  const path = join(directory, `output-${key.replace("/", "-")}-${process.pid}`);
  closeSync(openSync(path, "w", 0o600));
  return path;
}

/** The outputs an attempt wrote, its file removed; OutputsError when it cannot be read. */
function readOutputs(path: string | undefined): Record<string, string> {
  if (!path) return {};
  try {
    const size = statSync(path).size;
    if (size > MAX_ATTEMPT_BYTES) {
      throw new OutputsError(`$AX_OUTPUT holds ${size} bytes, more than the ${MAX_ATTEMPT_BYTES} an attempt may pass on`);
    }
    return parseOutputs(readFileSync(path));
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return {};
    throw error;
  } finally {
    try {
      unlinkSync(path);
    } catch {
      // Gone already.
    }
  }
}

type KillReason = "timeout" | "cancel" | "fence" | "stop";

/** One accepted attempt: its process, its unacknowledged lines and its end. */
class Attempt {
  readonly dispatch: Dispatch;
  readonly key: Key;
  child: ChildProcess | undefined;
  pid = 0;
  startedAtMs = 0n;
  /** Lines not yet cut into a batch: [stream, text], numbered from nextSeq - pending.length. */
  pending: Array<[number, string]> = [];
  nextSeq = 1;
  /** Batches cut and not yet acknowledged, as first sent: [last seq, frame]. */
  batches: Array<[number, LogBatch]> = [];
  /** How many of `batches` went out on the current stream. */
  sentBatches = 0;
  finished: AttemptFinished | undefined;
  finishedAt = 0;
  killReason: KillReason | undefined;
  killMessage = "";
  /** Refused by the scheduler or named stale: nothing more is sent about it. */
  forgotten = false;
  exited = false;
  outputPath: string | undefined;
  timers: NodeJS.Timeout[] = [];
  /** Stops reading the attempt's pipes (when something outside its group holds them open). */
  closePipes: Array<() => void> = [];

  constructor(dispatch: Dispatch) {
    this.dispatch = dispatch;
    this.key = keyOf(dispatch.instanceId, dispatch.attempt);
  }

  get running(): boolean {
    return this.finished === undefined;
  }

  clearTimers(): void {
    for (const timer of this.timers) clearTimeout(timer);
    this.timers = [];
  }
}

/** One stream: whether it is registered, and what it last heard. */
class Session {
  readonly endpoint: Endpoint;
  call: grpc.ClientDuplexStream<WorkerMessage, SchedulerMessage> | undefined;
  registered = false;
  closed = false;
  lastFrame = now();
  acksSeen = false;
  moveTo: string | undefined;
  timer: NodeJS.Timeout | undefined;

  constructor(endpoint: Endpoint) {
    this.endpoint = endpoint;
  }

  write(message: WorkerMessage): void {
    if (this.closed || !this.call) return;
    this.call.write(message);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    if (this.timer) clearTimeout(this.timer);
    try {
      this.call?.end();
    } catch {
      // Already ended.
    }
  }
}

/** The guardian process (see guardian.ts). */
class Guardian {
  private child: ChildProcess | undefined;
  private readonly log: Logger;

  constructor(log: Logger) {
    this.log = log;
    try {
      const child = spawn(process.execPath, [GUARDIAN], { stdio: ["pipe", "ignore", "inherit"], detached: true });
      child.on("error", (error) => {
        this.log.warn(`cannot start the guardian process (${error.message}): tasks will outlive a crashed worker`);
        this.child = undefined;
      });
      child.stdin?.on("error", () => {
        if (this.child) this.log.warn("the guardian process is gone: tasks will outlive a crashed worker");
        this.child = undefined;
      });
      child.unref();
      this.child = child;
    } catch (error) {
      this.log.warn(`cannot start the guardian process (${(error as Error).message}): tasks will outlive a crashed worker`);
    }
  }

  private write(line: string): void {
    this.child?.stdin?.write(line);
  }

  add(group: number): void {
    this.write(`+${group}\n`);
  }

  remove(group: number): void {
    this.write(`-${group}\n`);
  }

  /** Ends the guardian; with `killLeft` it first kills the groups still listed. */
  async close(killLeft: boolean): Promise<void> {
    const child = this.child;
    this.child = undefined;
    if (!child || !child.stdin) return;
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
    if (!killLeft) child.stdin.write("exit\n");
    child.stdin.end();
    const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
    await exited;
    clearTimeout(timer);
  }
}

/** A worker's settings. Durations are in milliseconds. */
export interface WorkerOptions extends CredentialOptions {
  /** One scheduler address or several (a list, or comma-separated); every node should be listed. Default http://127.0.0.1:7070. */
  scheduler?: string | readonly string[];
  /** Stable across restarts, unique among live workers; default `<host name>-<pid>`. */
  id?: string;
  labels?: Readonly<Record<string, string>>;
  /** Attempts run at once (default 20). */
  capacity?: number;
  /** The task function registries this worker serves. */
  tasks?: Tasks | readonly Tasks[];
  /** Used until a scheduler sends its own in Registered (default 5 s and 30 s). */
  heartbeatIntervalMs?: number;
  taskHeartbeatIntervalMs?: number;
  /** SIGTERM to SIGKILL (default 5 s). */
  killGraceMs?: number;
  /** The fence delay before a scheduler tells its threshold; null disables self-fencing (default 10 s). */
  selfFenceAfterMs?: number | null;
  reconnectInitialMs?: number;
  reconnectMaxMs?: number;
  registerTimeoutMs?: number;
  /** How long an unacknowledged end is kept (default an hour). */
  finishedRetentionMs?: number;
  /** How long `stop` waits for the scheduler to acknowledge the ends (default 5 s). */
  flushTimeoutMs?: number;
  /** Longer output lines are cut into several (default 64 KiB). */
  maxLineBytes?: number;
  hostname?: string;
  /** Arguments for node when it runs a task function (e.g. ["--import", "tsx"]). */
  nodeArgs?: readonly string[];
  logger?: Logger;
}

function positive(name: string, value: number): number {
  if (!(value > 0) || !Number.isFinite(value)) throw new ConfigError(`${name} must be more than 0 ms, not ${value}`);
  return value;
}

/** A worker: `await new Worker({ scheduler, id, tasks }).run()`. */
export class Worker {
  readonly endpoints: readonly Endpoint[];
  readonly id: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly capacity: number;
  /** Sent on every Register (see IDENTITY in worker.proto). */
  readonly incarnation: string;
  readonly startedAtMs: bigint;
  /** Why the worker stopped by itself (its credentials refused); `run()` throws it. */
  error: WorkerRefused | undefined;

  private readonly credentials: Credentials;
  private readonly functions = new Map<string, { module: string }>();
  private heartbeatIntervalMs: number;
  private taskHeartbeatIntervalMs: number;
  private readonly killGraceMs: number;
  private readonly selfFenceAfterMs: number | null;
  private readonly reconnectInitialMs: number;
  private readonly reconnectMaxMs: number;
  private readonly registerTimeoutMs: number;
  private readonly finishedRetentionMs: number;
  private readonly flushTimeoutMs: number;
  private readonly maxLineBytes: number;
  private readonly hostname: string;
  private readonly nodeArgs: readonly string[];
  private readonly log: Logger;

  private readonly attempts = new Map<Key, Attempt>();
  /** Attempts that ended and were acknowledged or refused, for duplicate detection. */
  private readonly remembered = new Map<Key, number>();
  /** The registered stream, which frames go onto. */
  private session: Session | undefined;
  /** The stream being served, registered or not yet. */
  private streaming: Session | undefined;
  private draining = false;
  private started = false;
  private stopped = false;
  private stopping: Promise<void> | undefined;
  private readonly changes = new EventEmitter();
  private readonly timers: NodeJS.Timeout[] = [];
  private loop: Promise<void> | undefined;
  private guardian: Guardian | undefined;
  private wakeLoop: (() => void) | undefined;
  private resolveStopped!: () => void;
  private readonly stoppedPromise = new Promise<void>((resolve) => (this.resolveStopped = resolve));
  // Self-fencing: the last contact, each endpoint's resolved addresses of the latest pass
  // (null: it did not resolve), and each address's last active refusal.
  private deadAfterMs = 0;
  private lastContact = now();
  private readonly resolved = new Map<string, string[] | null>();
  private readonly refused = new Map<string, number>();
  private registrationCount = 0;
  private readonly warnedUnreachable = new Map<string, number>();

  constructor(options: WorkerOptions = {}) {
    this.endpoints = parseEndpoints(options.scheduler ?? "http://127.0.0.1:7070");
    this.id = (options.id ?? `${osHostname()}-${process.pid}`).trim();
    if (this.id.length < 1 || this.id.length > 128) {
      throw new ConfigError(`worker id ${JSON.stringify(this.id)} must be 1 to 128 characters`);
    }
    const capacity = options.capacity ?? 20;
    if (!Number.isInteger(capacity) || capacity < 1) throw new ConfigError(`capacity ${capacity} must be at least 1`);
    this.capacity = capacity;
    this.labels = Object.freeze({ ...(options.labels ?? {}) });
    this.credentials = Credentials.load(options);
    this.heartbeatIntervalMs = positive("heartbeatIntervalMs", options.heartbeatIntervalMs ?? 5000);
    this.taskHeartbeatIntervalMs = positive("taskHeartbeatIntervalMs", options.taskHeartbeatIntervalMs ?? 30_000);
    this.reconnectInitialMs = positive("reconnectInitialMs", options.reconnectInitialMs ?? 100);
    this.reconnectMaxMs = positive("reconnectMaxMs", options.reconnectMaxMs ?? 10_000);
    this.registerTimeoutMs = positive("registerTimeoutMs", options.registerTimeoutMs ?? 10_000);
    this.killGraceMs = options.killGraceMs ?? 5000;
    if (!(this.killGraceMs >= 0)) throw new ConfigError(`killGraceMs must not be negative, not ${this.killGraceMs}`);
    const fence = options.selfFenceAfterMs === undefined ? 10_000 : options.selfFenceAfterMs;
    if (fence !== null && !(fence > 0)) {
      throw new ConfigError(`selfFenceAfterMs must be more than 0 ms (or null), not ${fence}`);
    }
    this.selfFenceAfterMs = fence;
    this.finishedRetentionMs = options.finishedRetentionMs ?? 3_600_000;
    this.flushTimeoutMs = options.flushTimeoutMs ?? 5000;
    this.maxLineBytes = options.maxLineBytes ?? 64 * 1024;
    if (!(this.maxLineBytes >= 4)) throw new ConfigError(`maxLineBytes must be at least 4, not ${this.maxLineBytes}`);
    this.hostname = options.hostname ?? osHostname();
    this.nodeArgs = [...(options.nodeArgs ?? [])];
    this.log = options.logger ?? stderrLogger("ax-sdk.worker");
    this.startedAtMs = nowMs();
    this.incarnation = randomBytes(16).toString("hex");
    const registries = options.tasks === undefined ? [] : Array.isArray(options.tasks) ? options.tasks : [options.tasks];
    for (const registry of registries as Tasks[]) this.serve(registry);
  }

  // ---------------------------------------------------------------------------------------------
  // Public surface.

  /** Serves the functions of `registry` too (before `start`). */
  serve(registry: Tasks): this {
    if (!registry.module) {
      throw new ConfigError(
        `a task registry (${registry.names().join(", ") || "empty"}) does not know its module: create it as new Tasks(import.meta.url)`,
      );
    }
    for (const name of registry.names()) {
      const existing = this.functions.get(name);
      if (existing && existing.module !== registry.module) {
        throw new ConfigError(`task function name ${JSON.stringify(name)} is registered twice (${existing.module}, ${registry.module})`);
      }
      this.functions.set(name, { module: registry.module });
    }
    return this;
  }

  /** The names of the functions served. */
  functionNames(): string[] {
    return [...this.functions.keys()].sort();
  }

  /**
   * Serves until stopped; rejects with `WorkerRefused` when a scheduler refuses the worker's
   * credentials (nothing changes by trying again). With `handleSignals` (the default), SIGTERM
   * and SIGINT drain the worker (no new attempts; the running ones finish and their ends are
   * acknowledged); a second one stops it at once, killing what still runs.
   */
  async run(options: { handleSignals?: boolean } = {}): Promise<void> {
    if (inFunctionChild()) return;
    let count = 0;
    const onSignal = (signal: NodeJS.Signals) => {
      count += 1;
      if (count === 1) {
        this.log.info(`signal ${signal}: draining (send another to stop at once)`);
        void this.stop({ drain: true });
      } else {
        this.log.info(`signal ${signal}: stopping now`);
        void this.stop({ drain: false });
      }
    };
    const handle = options.handleSignals ?? true;
    if (handle) {
      process.on("SIGTERM", onSignal);
      process.on("SIGINT", onSignal);
    }
    try {
      this.start();
      await this.stoppedPromise;
      await this.stopping;
    } finally {
      if (handle) {
        process.off("SIGTERM", onSignal);
        process.off("SIGINT", onSignal);
      }
    }
    if (this.error) throw this.error;
  }

  /** Starts serving and returns at once (in a task function's child process: does nothing). */
  start(): this {
    if (inFunctionChild()) return this;
    if (this.started) throw new Error("the worker was already started");
    this.started = true;
    this.guardian = new Guardian(this.log);
    this.timers.push(setInterval(() => this.flushAll(), BATCH_DELAY_MS));
    this.scheduleFenceWatch();
    this.loop = this.connectionLoop().catch((error) => {
      this.log.error(`the connection loop failed: ${(error as Error).stack ?? error}`);
    });
    return this;
  }

  /**
   * Stops the worker. With `drain` (the default) it takes no new attempts and waits for the
   * running ones to end (at most `timeoutMs`; no limit by default); without, it kills them
   * first (reported FAILED). Either way it then waits up to `flushTimeoutMs` for the scheduler
   * to acknowledge the attempts' ends, and kills what still runs.
   */
  stop(options: { drain?: boolean; timeoutMs?: number } = {}): Promise<void> {
    const drain = options.drain ?? true;
    if (this.stopping) {
      // Stopping already (draining): without drain, what still runs is killed now.
      if (!drain) this.killRunning();
      return this.stopping;
    }
    this.stopping = this.doStop(drain, options.timeoutMs);
    return this.stopping;
  }

  private killRunning(): void {
    for (const attempt of this.attempts.values()) {
      if (attempt.running && attempt.pid) this.kill(attempt, "stop", "the worker is stopping");
    }
  }

  /** Whether a stream is registered now. */
  get connected(): boolean {
    return this.session !== undefined && this.session.registered;
  }

  /** How many times the worker registered (1 + its reconnects). */
  get registrations(): number {
    return this.registrationCount;
  }

  /** The attempts running now, as [instance id, attempt]. */
  runningAttempts(): Array<[number, number]> {
    return [...this.attempts.values()]
      .filter((a) => a.running)
      .map((a) => [Number(a.dispatch.instanceId), a.dispatch.attempt]);
  }

  private async doStop(drain: boolean, timeoutMs: number | undefined): Promise<void> {
    this.draining = true;
    if (!drain) this.killRunning();
    const deadline = timeoutMs === undefined ? Infinity : now() + timeoutMs;
    while ([...this.attempts.values()].some((a) => a.running) && now() < deadline) await this.changed(200);
    const flushed = now() + this.flushTimeoutMs;
    while (this.attempts.size > 0 && now() < flushed) await this.changed(200);
    const left = [...this.attempts.keys()];
    this.killRunning();
    if (left.length > 0) {
      this.log.warn(`stopping with attempts whose end the scheduler has not acknowledged: ${left.join(", ")}`);
    }
    this.stopped = true;
    for (const timer of this.timers) clearTimeout(timer);
    this.wakeLoop?.();
    // The stream in use, registered or still registering.
    const session = this.streaming;
    if (session) {
      session.close();
      session.call?.cancel();
    }
    await this.loop;
    const running = [...this.attempts.values()].some((a) => a.running && a.pid);
    await this.guardian?.close(running);
    for (const attempt of this.attempts.values()) attempt.clearTimers();
    this.resolveStopped();
  }

  private changed(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(timer);
        this.changes.off("change", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.changes.on("change", done);
    });
  }

  private notify(): void {
    this.changes.emit("change");
  }

  private sleep(ms: number): Promise<void> {
    if (this.stopped) return Promise.resolve();
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        this.wakeLoop = undefined;
        resolve();
      }, ms);
      this.wakeLoop = () => {
        clearTimeout(timer);
        this.wakeLoop = undefined;
        resolve();
      };
    });
  }

  // ---------------------------------------------------------------------------------------------
  // Sending. Every send goes onto the registered stream only; what is not sent stays in the
  // attempts' state and goes out on the next stream.

  private send(body: Body): boolean {
    const session = this.session;
    if (!session || !session.registered || session.closed) return false;
    session.write(create(WorkerMessageSchema, { body }));
    return true;
  }

  private sendStarted(attempt: Attempt): void {
    this.send({
      case: "started",
      value: create(AttemptStartedSchema, {
        instanceId: attempt.dispatch.instanceId,
        attempt: attempt.dispatch.attempt,
        pid: attempt.pid,
        startedAtMs: attempt.startedAtMs,
      }),
    });
  }

  /** Sends the attempt's batches not yet sent on this stream (as they were cut), then cuts its pending lines into new batches and sends those. */
  private flush(attempt: Attempt): void {
    if (attempt.forgotten || !this.session || !this.session.registered) return;
    while (attempt.sentBatches < attempt.batches.length) {
      if (!this.send({ case: "logs", value: attempt.batches[attempt.sentBatches]![1] })) return;
      attempt.sentBatches += 1;
    }
    while (attempt.pending.length > 0) {
      const firstSeq = attempt.nextSeq - attempt.pending.length;
      const streams: number[] = [];
      const texts: string[] = [];
      let size = 0;
      for (const [stream, text] of attempt.pending.slice(0, BATCH_MAX_LINES)) {
        const bytes = Buffer.byteLength(text);
        if (texts.length > 0 && size + bytes > BATCH_MAX_BYTES) break;
        streams.push(stream);
        texts.push(text);
        size += bytes + 1;
      }
      const batch = create(LogBatchSchema, {
        instanceId: attempt.dispatch.instanceId,
        attempt: attempt.dispatch.attempt,
        firstSeq: BigInt(firstSeq),
        sentAtMs: nowMs(),
        streams: Uint8Array.from(streams),
        body: texts.join("\n"),
      });
      attempt.pending.splice(0, texts.length);
      attempt.batches.push([firstSeq + texts.length - 1, batch]);
      if (!this.send({ case: "logs", value: batch })) return;
      attempt.sentBatches += 1;
    }
  }

  private flushAll(): void {
    for (const attempt of this.attempts.values()) {
      if (attempt.pending.length > 0 || attempt.sentBatches < attempt.batches.length) this.flush(attempt);
    }
  }

  // ---------------------------------------------------------------------------------------------
  // The connection loop.

  private async connectionLoop(): Promise<void> {
    const count = this.endpoints.length;
    let index = crc32(this.id) % count;
    let backoff = this.reconnectInitialMs;
    let failures = 0;
    while (!this.stopped) {
      const endpoint = this.endpoints[index]!;
      let outcome: "failed" | "registered" | "moved" | "refused";
      let moveTo: string | undefined;
      try {
        [outcome, moveTo] = await this.serveStream(endpoint);
      } catch (error) {
        // A bug here must not end the worker's only connection loop.
        this.log.error(`the stream to ${endpoint.address} failed: ${(error as Error).stack ?? error}`);
        outcome = "failed";
      }
      if (this.stopped || outcome === "refused") return;
      if (outcome === "moved") {
        index = await this.moveTarget(index, moveTo);
        failures = 0;
        continue;
      }
      index = (index + 1) % count;
      if (outcome === "registered") {
        failures = 0;
        backoff = this.reconnectInitialMs;
        await this.sleep(Math.random() * this.reconnectInitialMs);
        continue;
      }
      failures += 1;
      if (failures % count === 0) {
        let ceiling = this.reconnectMaxMs;
        const fence = this.fenceDelay();
        if (this.attempts.size > 0 && fence !== null) {
          // Every endpoint is tried at least every quarter of the fence delay, so a refusal is
          // never stale and a node that comes back hears from us in time.
          ceiling = Math.min(ceiling, fence / 4);
        }
        backoff = Math.min(backoff * 2, ceiling);
        await this.sleep(Math.random() * backoff);
      }
    }
  }

  /** The endpoint to go to after MoveElsewhere: `to` when it is one of ours (compared after resolution), else the next one. */
  private async moveTarget(index: number, to: string | undefined): Promise<number> {
    if (to) {
      let wanted = new Set<string>();
      try {
        wanted = new Set((await this.addresses(parseEndpoint(to))) ?? []);
      } catch {
        // Not an address we could use.
      }
      for (let i = 0; i < this.endpoints.length; i++) {
        const endpoint = this.endpoints[i]!;
        const ours = (await this.addresses(endpoint)) ?? [];
        if (endpoint.address === to || ours.some((a) => wanted.has(a))) {
          if (i !== index) return i;
        }
      }
    }
    return (index + 1) % this.endpoints.length;
  }

  /** An endpoint's addresses as `family/address/port`, or null when its host does not resolve. */
  private async addresses(endpoint: Endpoint): Promise<string[] | null> {
    try {
      const found = await lookup(endpoint.host, { all: true });
      return [...new Set(found.map((a) => `${a.family}/${a.address}/${endpoint.port}`))].sort();
    } catch {
      return null;
    }
  }

  /**
   * Resolves the endpoint and tries a TCP connection to each of its addresses, noting each
   * active refusal for self-fencing; undefined when one accepted, else why none did.
   */
  private async probe(endpoint: Endpoint): Promise<string | undefined> {
    const addresses = await this.addresses(endpoint);
    this.resolved.set(endpoint.address, addresses);
    if (!addresses || addresses.length === 0) return `${endpoint.host} does not resolve`;
    let problem = "no address answered";
    let accepted = false;
    const timeout = Math.min(2000, this.registerTimeoutMs);
    for (const entry of addresses) {
      const [, host, port] = entry.split("/") as [string, string, string];
      const result = await new Promise<string | undefined>((resolve) => {
        const socket = tcpConnect({ host, port: Number(port) });
        const timer = setTimeout(() => {
          socket.destroy();
          resolve("the connection timed out");
        }, timeout);
        socket.once("connect", () => {
          clearTimeout(timer);
          socket.destroy();
          resolve(undefined);
        });
        socket.once("error", (error: NodeJS.ErrnoException) => {
          clearTimeout(timer);
          socket.destroy();
          if (error.code === "ECONNREFUSED") {
            this.refused.set(entry, now());
            resolve("connection refused: is a scheduler running there?");
          } else {
            resolve(error.message || error.code || "the connection failed");
          }
        });
      });
      if (result === undefined) accepted = true;
      else problem = result;
    }
    return accepted ? undefined : problem;
  }

  /** Warns that an endpoint cannot be reached: at once, then every 30 s while it stays so. */
  private unreachable(endpoint: Endpoint, problem: string): void {
    const t = now();
    const last = this.warnedUnreachable.get(endpoint.address);
    if (last === undefined || t - last >= UNREACHABLE_WARNING_EVERY_MS) {
      this.warnedUnreachable.set(endpoint.address, t);
      this.log.warn(`cannot connect to ${endpoint.address} (${problem}); trying again`);
    } else {
      this.log.debug(`${endpoint.address} does not accept connections: ${problem}`);
    }
  }

  /** A scheduler refused this worker's credentials: trying again cannot help, so the worker stops, and `run()` throws the refusal. */
  private refuse(endpoint: Endpoint, error: grpc.ServiceError): void {
    const unauthenticated = error.code === grpc.status.UNAUTHENTICATED;
    this.error = new WorkerRefused(
      `the scheduler at ${endpoint.address} refused worker ${JSON.stringify(this.id)} ` +
        `(${statusName(error.code)}: ${error.details}). ` +
        (unauthenticated
          ? "Give the worker a valid token: new Worker({ token }) or new Worker({ tokenFile }), " +
            "--token/--token-file, or AX_TOKEN/AX_TOKEN_FILE"
          : `Give it a worker token whose worker ids include ${JSON.stringify(this.id)} (and the apps and labels it serves)`),
      error.code,
    );
    this.log.error(this.error.message);
    void this.stop({ drain: false });
  }

  /** One stream: "failed", "registered" once a registered stream ended, "moved" (with where to), or "refused". */
  private async serveStream(
    endpoint: Endpoint,
  ): Promise<["failed" | "registered" | "moved" | "refused", string | undefined]> {
    const problem = await this.probe(endpoint);
    if (problem !== undefined) {
      this.unreachable(endpoint, problem);
      return ["failed", undefined];
    }
    this.warnedUnreachable.delete(endpoint.address);
    if (this.stopped) return ["failed", undefined];
    const channel = new Channel(endpoint, this.credentials);
    const session = new Session(endpoint);
    this.streaming = session;
    try {
      const call = channel.bidiStream(WorkerService.method.connect);
      session.call = call;
      return await new Promise((resolve) => {
        let registered = false;
        let settled = false;
        const finish = (result: ["failed" | "registered" | "moved" | "refused", string | undefined]) => {
          if (settled) return;
          settled = true;
          clearTimeout(timer);
          resolve(result);
        };
        const timer = setTimeout(() => {
          if (!registered) call.cancel();
        }, this.registerTimeoutMs);
        call.on("data", (message: SchedulerMessage) => {
          if (settled) return;
          if (this.stopped) {
            call.cancel();
            return;
          }
          if (!registered) {
            clearTimeout(timer);
            if (message.body.case !== "registered") {
              this.log.warn(`${endpoint.address} answered Register with ${message.body.case ?? "nothing"}, not Registered`);
              finish(["failed", undefined]);
              return;
            }
            registered = true;
            this.attach(session, message.body.value);
            this.log.info(
              `registered with ${endpoint.address} (node ${message.body.value.schedulerNode}) as ${this.id}`,
            );
            this.startHeartbeats(session);
            return;
          }
          this.contact(session);
          if (this.handle(session, message)) finish(["moved", session.moveTo]);
        });
        call.on("error", () => {
          // The status event says what happened.
        });
        call.on("status", (status: grpc.StatusObject) => {
          session.closed = true;
          if (!registered) {
            if (status.code === grpc.status.UNAUTHENTICATED || status.code === grpc.status.PERMISSION_DENIED) {
              const error = Object.assign(new Error(status.details), status) as grpc.ServiceError;
              this.refuse(endpoint, error);
              finish(["refused", undefined]);
              return;
            }
            if (this.stopped) {
              // The worker stops: nothing to say about a registration it cancelled.
            } else if (status.code === grpc.status.OK) {
              this.log.warn(`${endpoint.address} ended the stream before Registered`);
            } else {
              this.log.warn(`registering with ${endpoint.address} failed: ${statusName(status.code)}: ${status.details}`);
            }
            finish(["failed", undefined]);
            return;
          }
          if (!this.stopped && session.moveTo === undefined) {
            this.log.warn(`stream to ${endpoint.address} broke: ${statusName(status.code)}: ${status.details}`);
          }
          finish(session.moveTo !== undefined ? ["moved", session.moveTo] : ["registered", undefined]);
        });
        call.write(create(WorkerMessageSchema, { body: { case: "register", value: this.registerFrame() } }));
      });
    } finally {
      if (this.streaming === session) this.streaming = undefined;
      this.detach(session);
      session.close();
      session.call?.cancel();
      channel.close();
    }
  }

  /** The stream is over: nothing more goes onto it, and what it carried without an acknowledgement goes out again on the next one. */
  private detach(session: Session): void {
    if (this.session === session) {
      this.session = undefined;
      for (const attempt of this.attempts.values()) attempt.sentBatches = 0;
    }
  }

  private registerFrame(): Register {
    const running: AttemptRef[] = [];
    const finished: AttemptRef[] = [];
    for (const attempt of this.attempts.values()) {
      if (attempt.forgotten) continue;
      const ref = create(AttemptRefSchema, { instanceId: attempt.dispatch.instanceId, attempt: attempt.dispatch.attempt });
      (attempt.running ? running : finished).push(ref);
    }
    return create(RegisterSchema, {
      protocol: ProtocolVersion.PROTOCOL_VERSION_1,
      workerId: this.id,
      version: WORKER_VERSION,
      labels: { ...this.labels },
      capacity: this.capacity,
      startedAtMs: this.startedAtMs,
      hostname: this.hostname,
      running,
      finished,
      incarnation: this.incarnation,
    });
  }

  /** Makes the stream current and resends, per attempt and in order, what the old stream may have lost. */
  private attach(session: Session, registered: Registered): void {
    if (registered.heartbeatIntervalMs) this.heartbeatIntervalMs = registered.heartbeatIntervalMs;
    if (registered.taskHeartbeatIntervalMs) this.taskHeartbeatIntervalMs = registered.taskHeartbeatIntervalMs;
    if (registered.workerDeadAfterMs) {
      const before = this.deadAfterMs;
      this.deadAfterMs = registered.workerDeadAfterMs;
      if (before !== this.deadAfterMs) this.scheduleFenceWatch();
    }
    for (const ref of registered.stale) {
      const attempt = this.attempts.get(keyOf(ref.instanceId, ref.attempt));
      if (attempt && attempt.running) {
        this.log.warn(`attempt ${attempt.key} is stale on the scheduler: killing it`);
        this.forget(attempt, true);
      }
    }
    session.registered = true;
    session.lastFrame = now();
    this.session = session;
    this.lastContact = now();
    this.registrationCount += 1;
    for (const attempt of [...this.attempts.values()]) {
      if (attempt.forgotten) continue;
      if (attempt.pid) this.sendStarted(attempt);
      attempt.sentBatches = 0;
      this.flush(attempt);
      if (attempt.finished) this.send({ case: "finished", value: attempt.finished });
    }
    this.notify();
  }

  private contact(session: Session): void {
    const t = now();
    session.lastFrame = t;
    this.lastContact = t;
  }

  private startHeartbeats(session: Session): void {
    let nextWorker = now();
    let nextTask = now() + this.taskHeartbeatIntervalMs;
    const tick = () => {
      if (session.closed) return;
      const t = now();
      if (t - session.lastFrame > Math.max(4 * this.heartbeatIntervalMs, 2000)) {
        // The scheduler acknowledges every heartbeat: a silent stream is a broken one, even
        // while the transport still looks up (a blackholed connection does for minutes).
        this.log.warn(
          `no frame from ${session.endpoint.address} for ${((t - session.lastFrame) / 1000).toFixed(1)} s: reconnecting`,
        );
        session.call?.cancel();
        return;
      }
      if (this.session !== session) return;
      if (t >= nextWorker) {
        const running = [...this.attempts.values()].filter((a) => a.running).length;
        const sent = this.send({
          case: "heartbeat",
          value: create(WorkerHeartbeatSchema, {
            sentAtMs: nowMs(),
            running,
            capacity: this.capacity,
            draining: this.draining,
          }),
        });
        if (sent && !session.acksSeen) {
          // A scheduler that does not acknowledge heartbeats: frames sent on a stream that is up
          // are the only contact there is (SELF-FENCING).
          this.lastContact = t;
        }
        nextWorker = t + this.heartbeatIntervalMs;
      }
      if (t >= nextTask) {
        for (const attempt of this.attempts.values()) {
          if (attempt.running && attempt.pid && !attempt.forgotten) {
            this.send({
              case: "taskHeartbeat",
              value: create(TaskHeartbeatSchema, {
                instanceId: attempt.dispatch.instanceId,
                attempt: attempt.dispatch.attempt,
                sentAtMs: nowMs(),
              }),
            });
          }
        }
        nextTask = t + this.taskHeartbeatIntervalMs;
      }
      session.timer = setTimeout(tick, Math.max(10, Math.min(nextWorker, nextTask) - now()));
    };
    tick();
  }

  // ---------------------------------------------------------------------------------------------
  // Frames from the scheduler.

  /** Handles one frame; true when the stream must end (MoveElsewhere). */
  private handle(session: Session, message: SchedulerMessage): boolean {
    const body = message.body;
    switch (body.case) {
      case "dispatch":
        this.onDispatch(body.value);
        break;
      case "heartbeatAck":
        session.acksSeen = true;
        break;
      case "logAck": {
        const attempt = this.attempts.get(keyOf(body.value.instanceId, body.value.attempt));
        if (attempt) {
          const seq = Number(body.value.seq);
          let acked = 0;
          while (acked < attempt.batches.length && attempt.batches[acked]![0] <= seq) acked += 1;
          attempt.batches.splice(0, acked);
          attempt.sentBatches = Math.max(0, attempt.sentBatches - acked);
        }
        break;
      }
      case "finishedAck": {
        const attempt = this.attempts.get(keyOf(body.value.instanceId, body.value.attempt));
        if (attempt && attempt.finished) this.drop(attempt);
        break;
      }
      case "cancel": {
        const attempt = this.attempts.get(keyOf(body.value.instanceId, body.value.attempt));
        if (attempt && attempt.running && attempt.pid && !attempt.forgotten) {
          this.log.info(`cancelling attempt ${attempt.key}: ${body.value.reason}`);
          this.kill(attempt, "cancel", body.value.reason || "cancelled");
        }
        break;
      }
      case "refused": {
        const attempt = this.attempts.get(keyOf(body.value.instanceId, body.value.attempt));
        if (attempt) {
          this.log.warn(`scheduler refused the report of ${attempt.key}: ${body.value.reason}`);
          this.forget(attempt, body.value.kill);
        }
        break;
      }
      case "moveElsewhere": {
        this.log.info(`asked to move to another node (${body.value.toAddress || "any"}): ${body.value.reason}`);
        session.moveTo = body.value.toAddress;
        this.detach(session);
        session.close();
        session.call?.cancel();
        return true;
      }
      default:
        break;
    }
    return false;
  }

  /** Sends nothing more about the attempt; kills its group first when asked. */
  private forget(attempt: Attempt, kill: boolean): void {
    attempt.forgotten = true;
    attempt.pending = [];
    attempt.batches = [];
    if (kill && attempt.running && attempt.pid) killGroup(attempt.pid, "SIGKILL");
    if (!attempt.running) this.drop(attempt);
  }

  private drop(attempt: Attempt): void {
    attempt.clearTimers();
    this.attempts.delete(attempt.key);
    this.remembered.set(attempt.key, now());
    this.notify();
  }

  private reject(dispatch: Dispatch, reason: string, duplicate: boolean): void {
    this.send({
      case: "rejected",
      value: create(DispatchRejectedSchema, {
        instanceId: dispatch.instanceId,
        attempt: dispatch.attempt,
        reason,
        duplicate,
      }),
    });
  }

  private onDispatch(dispatch: Dispatch): void {
    const key = keyOf(dispatch.instanceId, dispatch.attempt);
    if (this.attempts.has(key) || this.remembered.has(key)) {
      this.reject(dispatch, "this worker already runs or ran this attempt", true);
      return;
    }
    if (this.draining) {
      this.reject(dispatch, "the worker is draining", false);
      return;
    }
    if ([...this.attempts.values()].filter((a) => a.running).length >= this.capacity) {
      this.reject(dispatch, `the worker is full (${this.capacity} attempts)`, false);
      return;
    }
    const attempt = new Attempt(dispatch);
    this.attempts.set(key, attempt);
    this.send({
      case: "accepted",
      value: create(DispatchAcceptedSchema, { instanceId: dispatch.instanceId, attempt: dispatch.attempt }),
    });
    let child: ChildProcess;
    try {
      const [argv, env] = this.command(dispatch);
      attempt.outputPath = outputFile(key);
      env.AX_OUTPUT = attempt.outputPath;
      child = spawn(argv[0]!, argv.slice(1), {
        env,
        cwd: dispatch.workingDir || undefined,
        stdio: ["ignore", "pipe", "pipe"],
        detached: true,
      });
    } catch (error) {
      this.spawnFailed(attempt, error as Error);
      return;
    }
    child.on("error", (error) => {
      if (attempt.pid === 0) this.spawnFailed(attempt, error);
      else this.log.warn(`attempt ${attempt.key}: ${error.message}`);
    });
    child.once("spawn", () => this.onSpawn(attempt, child));
  }

  private spawnFailed(attempt: Attempt, error: Error): void {
    if (attempt.finished) return;
    const message = `spawn failed: ${error.message}`;
    this.log.warn(`attempt ${attempt.key}: ${message}`);
    try {
      readOutputs(attempt.outputPath);
    } catch {
      // Nothing ran to write it.
    }
    this.end(attempt, AttemptOutcome.SPAWN_FAILED, undefined, undefined, message);
  }

  private onSpawn(attempt: Attempt, child: ChildProcess): void {
    attempt.child = child;
    attempt.pid = child.pid ?? 0;
    attempt.startedAtMs = nowMs();
    this.guardian?.add(attempt.pid);
    this.sendStarted(attempt);
    const readers = [
      this.read(attempt, child.stdout!, LogStream.STDOUT),
      this.read(attempt, child.stderr!, LogStream.STDERR),
    ];
    const timeoutMs = Number(attempt.dispatch.timeoutMs);
    if (timeoutMs > 0) this.armTimeout(attempt, timeoutMs);
    child.once("exit", (code, signal) => {
      attempt.exited = true;
      void this.supervise(attempt, code, signal, readers);
    });
  }

  private armTimeout(attempt: Attempt, remainingMs: number): void {
    // setTimeout holds at most 2^31-1 ms; a longer timeout is waited in steps.
    const step = Math.min(remainingMs, 2 ** 31 - 1);
    attempt.timers.push(
      setTimeout(() => {
        if (remainingMs > step) {
          this.armTimeout(attempt, remainingMs - step);
          return;
        }
        if (attempt.killReason === undefined && !attempt.forgotten && !attempt.exited) {
          this.log.info(`attempt ${attempt.key} ran past its timeout of ${attempt.dispatch.timeoutMs} ms: killing it`);
          this.kill(attempt, "timeout", `killed after the timeout of ${attempt.dispatch.timeoutMs} ms`);
        }
      }, step),
    );
  }

  private command(dispatch: Dispatch): [string[], Record<string, string>] {
    const env: Record<string, string> = {};
    for (const [key, value] of Object.entries(process.env)) if (value !== undefined) env[key] = value;
    // The worker's own credential is not the task's to use.
    delete env.AX_TOKEN;
    delete env.AX_TOKEN_FILE;
    delete env[SPEC_ENV];
    Object.assign(env, dispatch.env);
    const call = functionCall(dispatch.command, dispatch.argv);
    if (call) {
      const [name, args] = call;
      const served = this.functions.get(name);
      if (!served) {
        const known = this.functionNames().join(", ") || "none";
        throw new Error(`no task function ${JSON.stringify(name)} is registered on this worker (registered: ${known})`);
      }
      const spec: ChildSpec = { name, module: served.module, args };
      env[SPEC_ENV] = JSON.stringify(spec);
      return [[process.execPath, ...this.nodeArgs, FNRUN], env];
    }
    if (dispatch.argv.length > 0) return [[...dispatch.argv], env];
    return [["/bin/sh", "-c", dispatch.command], env];
  }

  // ---------------------------------------------------------------------------------------------
  // Attempts.

  /** Reads one pipe into numbered lines; a line longer than maxLineBytes is cut into several at a UTF-8 character boundary. Resolves once the pipe closed. */
  private read(attempt: Attempt, pipe: NodeJS.ReadableStream & { destroy(): void }, stream: number): Promise<void> {
    const limit = this.maxLineBytes;
    let carry: Buffer = Buffer.alloc(0);
    return new Promise((resolve) => {
      let done = false;
      const end = () => {
        if (done) return;
        done = true;
        if (carry.length > 0) this.addPieces(attempt, stream, carry);
        carry = Buffer.alloc(0);
        resolve();
      };
      pipe.on("data", (chunk: Buffer) => {
        let data = carry.length > 0 ? Buffer.concat([carry, chunk]) : chunk;
        let start = 0;
        for (let newline = data.indexOf(10, start); newline >= 0; newline = data.indexOf(10, start)) {
          // Only the newline goes, a '\r' before it stays, as ax-worker does.
          this.addPieces(attempt, stream, data.subarray(start, newline));
          start = newline + 1;
        }
        data = data.subarray(start);
        while (data.length > limit) {
          const cut = cutAt(data, limit);
          this.addLine(attempt, stream, data.subarray(0, cut));
          data = data.subarray(cut);
        }
        carry = Buffer.from(data);
      });
      pipe.on("end", end);
      pipe.on("close", end);
      pipe.on("error", end);
      attempt.closePipes.push(() => {
        pipe.destroy();
        end();
      });
    });
  }

  private addPieces(attempt: Attempt, stream: number, data: Buffer): void {
    const limit = this.maxLineBytes;
    while (data.length > limit) {
      const cut = cutAt(data, limit);
      this.addLine(attempt, stream, data.subarray(0, cut));
      data = data.subarray(cut);
    }
    this.addLine(attempt, stream, data);
  }

  private addLine(attempt: Attempt, stream: number, data: Buffer): void {
    if (attempt.forgotten) return;
    attempt.pending.push([stream, data.toString("utf8")]);
    attempt.nextSeq += 1;
    if (attempt.pending.length >= BATCH_MAX_LINES) this.flush(attempt);
  }

  /** SIGTERM to the attempt's group, SIGKILL after the kill grace, once: the first reason sticks, and a second cancel or a timeout after a cancel sends nothing more (a task's handler runs once). */
  private kill(attempt: Attempt, reason: KillReason, message: string): void {
    if (attempt.killReason !== undefined) {
      this.log.info(`attempt ${attempt.key} is already being stopped (${message}); not signalled again`);
      return;
    }
    attempt.killReason = reason;
    attempt.killMessage = message;
    const group = attempt.pid;
    killGroup(group, "SIGTERM");
    attempt.timers.push(
      setTimeout(() => {
        if (!attempt.exited) killGroup(group, "SIGKILL");
      }, this.killGraceMs),
    );
  }

  private async supervise(
    attempt: Attempt,
    code: number | null,
    signal: NodeJS.Signals | null,
    readers: Promise<void>[],
  ): Promise<void> {
    // The group is the attempt: what the task left running in it goes with it, and its pipes close.
    killGroup(attempt.pid, "SIGKILL");
    let drained = false;
    const guard = setTimeout(() => {
      if (drained) return;
      this.log.warn(`attempt ${attempt.key}: its pipes stay open after its process exited (a process outside its group holds them); reading stops`);
      for (const close of attempt.closePipes) close();
    }, PIPE_DRAIN_MS);
    await Promise.all(readers);
    drained = true;
    clearTimeout(guard);
    this.guardian?.remove(attempt.pid);
    attempt.clearTimers();
    const sig = signal ? (osConstants.signals[signal] ?? 0) : undefined;
    const exitCode = code ?? undefined;
    const reason = attempt.killReason;
    let outcome: AttemptOutcome;
    if (reason === "timeout") outcome = AttemptOutcome.TIMEOUT;
    else if (reason === "cancel") outcome = AttemptOutcome.CANCELLED;
    else if (reason === "fence" || reason === "stop") outcome = AttemptOutcome.FAILED;
    else if (exitCode === 0) outcome = AttemptOutcome.SUCCESS;
    else outcome = AttemptOutcome.FAILED;
    let message = attempt.killMessage;
    if (!message && outcome === AttemptOutcome.FAILED) {
      message = sig === undefined ? `exited with code ${exitCode}` : `killed by signal ${sig}`;
    }
    let passed: Record<string, string> = {};
    try {
      const read = readOutputs(attempt.outputPath);
      if (outcome === AttemptOutcome.SUCCESS) passed = read;
    } catch (error) {
      if (outcome === AttemptOutcome.SUCCESS) {
        outcome = AttemptOutcome.FAILED;
        message = `outputs refused: ${(error as Error).message}`;
      }
    }
    this.end(attempt, outcome, exitCode, sig, message, passed);
  }

  /** Records the attempt's end and sends it after its last lines. */
  private end(
    attempt: Attempt,
    outcome: AttemptOutcome,
    exitCode: number | undefined,
    sig: number | undefined,
    message: string,
    outputs: Record<string, string> = {},
  ): void {
    attempt.finished = create(AttemptFinishedSchema, {
      instanceId: attempt.dispatch.instanceId,
      attempt: attempt.dispatch.attempt,
      outcome,
      exitCode,
      signal: sig,
      finishedAtMs: nowMs(),
      logLines: BigInt(attempt.nextSeq - 1),
      message,
      outputs,
    });
    attempt.finishedAt = now();
    if (attempt.forgotten) {
      this.drop(attempt);
      return;
    }
    this.log.info(`attempt ${attempt.key} ended: ${AttemptOutcome[outcome]} ${message}`.trimEnd());
    this.flush(attempt);
    this.send({ case: "finished", value: attempt.finished });
    this.notify();
  }

  // ---------------------------------------------------------------------------------------------
  // Self-fencing and retention.

  private fenceDelay(): number | null {
    if (this.selfFenceAfterMs === null) return null;
    let delay = this.selfFenceAfterMs;
    if (this.deadAfterMs) delay = Math.min(delay, this.deadAfterMs * FENCE_FRACTION);
    return delay;
  }

  /**
   * The moment no node could have heard from us since: the last contact, or later when every
   * address of every endpoint has actively refused a connection since (those nodes are down,
   * and a node that starts later judges nobody dead before the threshold).
   */
  private fenceBase(): number {
    let base = this.lastContact;
    const resolved = this.endpoints.map((e) => this.resolved.get(e.address));
    if (resolved.length > 0 && resolved.every((r) => r && r.length > 0)) {
      const oldest = Math.min(...resolved.flatMap((r) => r!.map((address) => this.refused.get(address) ?? 0)));
      base = Math.max(base, oldest);
    }
    return base;
  }

  private fenceTimer: NodeJS.Timeout | undefined;

  private scheduleFenceWatch(): void {
    if (!this.started) return;
    if (this.fenceTimer) clearInterval(this.fenceTimer);
    const delay = this.fenceDelay();
    const tick = delay === null ? 500 : Math.max(10, Math.min(500, delay / 10));
    this.fenceTimer = setInterval(() => this.fenceWatch(), tick);
    this.timers.push(this.fenceTimer);
  }

  private fenceWatch(): void {
    if (this.stopped) return;
    const t = now();
    for (const [key, at] of this.remembered) {
      if (t - at > this.finishedRetentionMs) this.remembered.delete(key);
    }
    for (const attempt of [...this.attempts.values()]) {
      if (attempt.finished && t - attempt.finishedAt > this.finishedRetentionMs) {
        this.log.warn(`giving up on the unacknowledged end of ${attempt.key}`);
        this.drop(attempt);
      }
    }
    const delay = this.fenceDelay();
    if (delay === null) return;
    const silent = t - this.fenceBase();
    if (silent <= delay) return;
    for (const attempt of this.attempts.values()) {
      if (
        attempt.running &&
        attempt.pid &&
        !attempt.forgotten &&
        attempt.killReason === undefined &&
        !attempt.dispatch.keepWhenCutOff
      ) {
        const seconds = (silent / 1000).toFixed(1);
        this.log.warn(`no contact with a scheduler for ${seconds} s: fencing attempt ${attempt.key}`);
        this.kill(attempt, "fence", `fenced: no contact with a scheduler for ${seconds} s`);
      }
    }
  }

}
