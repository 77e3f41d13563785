/**
 * A client of the scheduler's control API (`proto/ax/v1/control.proto`).
 *
 * Every scheduler node serves the whole API, so a client given several addresses uses the first
 * that answers and moves to the next when a call finds its node unavailable. Runs, instances and
 * attempts come back as typed views (`runs.ts`); the other calls return the generated messages.
 * A refused call throws `AxError` with the gRPC status code and the scheduler's message.
 *
 * A trigger or backfill the scheduler refuses for load (RESOURCE_EXHAUSTED with the trailers
 * `retry-after` and `ax-overloaded-bin`) is tried again after a jittered, growing wait never
 * shorter than the scheduler's hint, for at most `retryForMs`; then `AxError` is thrown with
 * `overloaded` set. The policy is the scheduler's own (`ax_core::admission::client_retry_delay_ms`).
 */

import { readFileSync } from "node:fs";
import { userInfo } from "node:os";
import { setTimeout as delay } from "node:timers/promises";

import * as grpc from "@grpc/grpc-js";
import { fromBinary, type DescMessage, type MessageInitShape, type MessageShape } from "@bufbuild/protobuf";

import { Credentials, parseEndpoints, type CredentialOptions, type Endpoint } from "./connection.js";
import { stderrLogger, type Logger } from "./log.js";
import { toJson } from "./outputs.js";
import { Channel, isServiceError, statusName, type Method } from "./rpc.js";
import {
  instanceFromPb,
  instanceStateValue,
  runEnded,
  runFromPb,
  runStateValue,
  workflowParams,
  type Instance,
  type Run,
  type RunState,
  type Triggered,
  type WorkflowParam,
} from "./runs.js";
import {
  ControlService,
  OverloadedSchema,
  type ApplyWorkflowResponse,
  type ApplyWorkflowsResponse,
  type BackfillWorkflowResponse,
  type Explanation,
  type Identity,
  type ListInstancesResponse,
  type ListNodesResponse,
  type Overloaded,
  type Workflow as PbWorkflow,
  type WorkerInfo,
} from "./gen/ax/v1/control_pb.js";
import { LogStream } from "./gen/ax/v1/worker_pb.js";

/** How long `wait` waits, after the run ended, for its cancelled or timed-out attempts' processes to be reported ended. */
export const DEFAULT_SETTLE_MS = 30_000;
/** How long trigger and backfill keep trying while refused for load, unless told otherwise. */
export const DEFAULT_RETRY_FOR_MS = 60_000;
/** The trailer of a refusal for load: an encoded `ax.v1.Overloaded`. */
export const OVERLOADED_TRAILER = "ax-overloaded-bin";

/** A call the scheduler refused or could not answer. */
export class AxError extends Error {
  override name = "AxError";
  /** The gRPC status code (grpc.status), and its name ("NOT_FOUND"). */
  readonly code: number;
  readonly codeName: string;
  readonly call: string;
  readonly details: string;
  /** The bound a refusal for load met; undefined for any other refusal. */
  readonly overloaded: Overloaded | undefined;
  /** The refusals for load before the client gave up. */
  refusals = 0;

  constructor(call: string, code: number, details: string, overloaded?: Overloaded) {
    super(`${call}: ${statusName(code)}: ${details}`);
    this.call = call;
    this.code = code;
    this.codeName = statusName(code);
    this.details = details;
    this.overloaded = overloaded;
  }
}

/** `wait` ran out of time; the message says what it saw last. */
export class WaitTimeout extends Error {
  override name = "WaitTimeout";
}

function overloadedOf(error: grpc.ServiceError): Overloaded | undefined {
  if (error.code !== grpc.status.RESOURCE_EXHAUSTED) return undefined;
  const values = error.metadata?.get(OVERLOADED_TRAILER) ?? [];
  for (const value of values) {
    if (typeof value === "string") continue;
    try {
      return fromBinary(OverloadedSchema, new Uint8Array(value));
    } catch {
      return undefined;
    }
  }
  return undefined;
}

function axError(call: string, error: unknown): AxError {
  if (error instanceof AxError) return error;
  if (isServiceError(error)) return new AxError(call, error.code, error.details ?? error.message, overloadedOf(error));
  throw error;
}

/**
 * Milliseconds to wait before the try after `refusals` refusals for load (1-based): exponential
 * from half a second to 30 s, jittered down to half, never sooner than the hint stretched by up
 * to a quarter. `ax_core::admission::client_retry_delay_ms`.
 */
export function retryDelayMs(refusals: number, hintMs: number, unitRandom: number): number {
  const r = Math.min(Math.max(unitRandom, 0), 1);
  const exponent = Math.min(Math.max(refusals - 1, 0), 16);
  const full = Math.min(500 * 2 ** exponent, 30_000);
  const backoff = Math.floor(full * (0.5 + 0.5 * r));
  const hinted = Math.floor(hintMs * (1 + 0.25 * r));
  return Math.max(backoff, hinted);
}

/**
 * A trigger's params as the protocol carries them: strings as they are, other values as JSON, a
 * value whose JSON is a string going bare (a Date gives `2026-01-31T00:00:00.000Z`).
 */
export function encodeParams(params: Readonly<Record<string, unknown>> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(params ?? {})) {
    if (typeof value === "string") {
      out[key] = value;
      continue;
    }
    const json = toJson(value);
    out[key] = json.startsWith('"') ? (JSON.parse(json) as string) : json;
  }
  return out;
}

function defaultActor(): string {
  try {
    return `${userInfo().username} (typescript-sdk)`;
  } catch {
    return "typescript-sdk";
  }
}

/** One stored log line. */
export interface LogLine {
  readonly seq: number;
  readonly stream: "stdout" | "stderr" | "unspecified";
  readonly text: string;
  readonly at: Date | null;
  readonly attempt: number;
}

/** Something `apply` takes: a workflow built in code (`workflow.ts`), by its YAML text. */
export interface WorkflowSource {
  readonly name: string;
  toYaml(): string;
}

export interface ClientOptions extends CredentialOptions {
  /** Who the audit trail records for mutating calls (default `<user> (typescript-sdk)`). */
  actor?: string;
  /** Each unary call's deadline (default 30 s). */
  timeoutMs?: number;
  /** How long trigger and backfill keep trying while refused for load (default 60 s; 0: not at all). */
  retryForMs?: number;
  logger?: Logger;
}

export interface TriggerOptions {
  /** A repeated key returns the run the first call created (`created` false). */
  idempotencyKey?: string;
  /** The run's logical time; the trigger time when unset. */
  logicalTime?: Date | number;
  retryForMs?: number;
}

/** What `rerun` runs again: exactly one of the three. */
export interface RerunOptions {
  /** Every FAILED, TIMEOUT and CANCELLED instance; their downstream follows. */
  failed?: boolean;
  /** This task and everything below it. */
  fromTask?: string;
  /**
   * Exactly these tasks (a name or several) and everything below each, like Airflow's "clear with
   * downstream": a chosen task below another chosen one waits for it.
   */
  tasks?: string | readonly string[];
}

/** The outcomes `mark` sets. */
export type MarkState = "SUCCESS" | "FAILED";

export interface MarkOptions {
  /** Why the outcome is overridden: required; the audit trail and the attempt's message keep it. */
  reason: string;
}

export interface WaitOptions {
  /** Throw WaitTimeout after this long (no limit by default). */
  timeoutMs?: number;
  /** How long after the run's end to wait for its processes to be reported ended (default 30 s, at most 600 s). */
  settleMs?: number;
}

/** A control API client: `new Client("http://127.0.0.1:7070")`. */
export class Client {
  private readonly endpoints: Endpoint[];
  private readonly credentials: Credentials;
  private readonly actor: string;
  private readonly timeoutMs: number;
  private readonly retryForMs: number;
  private readonly log: Logger;
  private current = 0;
  private channel: Channel | undefined;

  /** `addresses`: one or several (a list, or comma-separated), each http://host:port, https://host:port or host:port. */
  constructor(addresses: string | readonly string[] = "http://127.0.0.1:7070", options: ClientOptions = {}) {
    this.endpoints = parseEndpoints(addresses);
    this.credentials = Credentials.load(options);
    this.actor = options.actor ?? defaultActor();
    this.timeoutMs = options.timeoutMs ?? 30_000;
    this.retryForMs = options.retryForMs ?? DEFAULT_RETRY_FOR_MS;
    this.log = options.logger ?? stderrLogger("ax-sdk");
  }

  /** AX_SERVER (default http://127.0.0.1:7070) with AX_TOKEN/AX_TOKEN_FILE, AX_TLS_CA, AX_TLS_CERT and AX_TLS_KEY, as axctl reads them. */
  static fromEnv(options: Omit<ClientOptions, keyof CredentialOptions> = {}): Client {
    return new Client(process.env.AX_SERVER || "http://127.0.0.1:7070", { ...Credentials.fromEnv(), ...options });
  }

  close(): void {
    this.channel?.close();
    this.channel = undefined;
  }

  // ---------------------------------------------------------------------------------------------
  // Plumbing.

  private connect(): Channel {
    this.channel ??= new Channel(this.endpoints[this.current]!, this.credentials);
    return this.channel;
  }

  private nextEndpoint(): void {
    if (this.endpoints.length > 1) {
      this.close();
      this.current = (this.current + 1) % this.endpoints.length;
    }
  }

  /** Calls `method`, moving to the next address while a node is unavailable (the call did not reach a scheduler, so trying it elsewhere cannot double it). */
  private async call<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageInitShape<I>,
    timeoutMs?: number,
  ): Promise<MessageShape<O>> {
    let last: unknown;
    for (let i = 0; i < this.endpoints.length; i++) {
      try {
        return await this.connect().unary(method, request, timeoutMs ?? this.timeoutMs);
      } catch (error) {
        last = error;
        if (!isServiceError(error) || error.code !== grpc.status.UNAVAILABLE || this.endpoints.length === 1) break;
        this.nextEndpoint();
      }
    }
    throw axError(method.name, last);
  }

  /** `call`, tried again while refused for load, for at most `retryForMs`. A refusal creates nothing, so trying again cannot double a run. */
  private async callPatiently<I extends DescMessage, O extends DescMessage>(
    method: Method<I, O>,
    request: MessageInitShape<I>,
    retryForMs: number | undefined,
  ): Promise<MessageShape<O>> {
    const patience = retryForMs ?? this.retryForMs;
    const start = Date.now();
    let refusals = 0;
    for (;;) {
      try {
        return await this.call(method, request);
      } catch (error) {
        if (!(error instanceof AxError) || error.overloaded === undefined) throw error;
        refusals += 1;
        error.refusals = refusals;
        const wait = retryDelayMs(refusals, Number(error.overloaded.retryAfterMs), Math.random());
        if (Date.now() - start + wait > patience) throw error;
        this.log.warn(
          `${method.name} refused for load (${error.details}); trying again in ${(wait / 1000).toFixed(1)}s ` +
            `(refusal ${refusals}, giving up after ${patience / 1000}s)`,
        );
        await delay(wait);
      }
    }
  }

  // ---------------------------------------------------------------------------------------------
  // Workflows.

  /**
   * Applies a workflow: a file's text (`{ source }`), a file (`{ path }`) or one built in code.
   * A refusal names file:line: field.
   */
  async apply(
    workflow: WorkflowSource | { source: string; sourceName?: string } | { path: string },
    options: { dryRun?: boolean } = {},
  ): Promise<ApplyWorkflowResponse> {
    let source: string;
    let sourceName: string;
    if ("toYaml" in workflow) {
      source = workflow.toYaml();
      sourceName = `${workflow.name} (built in TypeScript)`;
    } else if ("path" in workflow) {
      try {
        source = readFileSync(workflow.path, "utf8");
      } catch (error) {
        throw new Error(`cannot read workflow file ${workflow.path}: ${(error as Error).message}`);
      }
      sourceName = workflow.path;
    } else {
      source = workflow.source;
      sourceName = workflow.sourceName ?? "workflow.yaml";
    }
    return this.call(ControlService.method.applyWorkflow, {
      source,
      sourceName,
      dryRun: options.dryRun ?? false,
      actor: this.actor,
    });
  }

  /** Applies many workflow files in one transaction: all or nothing (`axctl apply -f DIR`). */
  async applyFiles(
    files: ReadonlyArray<{ sourceName: string; source: string }>,
    options: { dryRun?: boolean; prune?: boolean; app?: string } = {},
  ): Promise<ApplyWorkflowsResponse> {
    return this.call(ControlService.method.applyWorkflows, {
      files: [...files],
      dryRun: options.dryRun ?? false,
      prune: options.prune ?? false,
      app: options.app ?? "",
      actor: this.actor,
    });
  }

  /** The workflow's latest version: its tasks, schedule, source, and the params it declares (`params`; typed by `workflowParams`). */
  getWorkflow(name: string): Promise<PbWorkflow> {
    return this.call(ControlService.method.getWorkflow, { name });
  }

  /** The params the workflow declares (`params:` in its file), in file order, typed: what a trigger form asks for. */
  async workflowParams(name: string): Promise<WorkflowParam[]> {
    return workflowParams(await this.getWorkflow(name));
  }

  async listWorkflows(app = ""): Promise<PbWorkflow[]> {
    return (await this.call(ControlService.method.listWorkflows, { app, summary: true })).workflows;
  }

  pause(name: string): Promise<PbWorkflow> {
    return this.call(ControlService.method.pauseWorkflow, { name, actor: this.actor });
  }

  resume(name: string): Promise<PbWorkflow> {
    return this.call(ControlService.method.resumeWorkflow, { name, actor: this.actor });
  }

  // ---------------------------------------------------------------------------------------------
  // Runs.

  /**
   * Starts a run. Each param reaches every task as AX_PARAM_<name>: a string as it is, any other
   * value as JSON (`{ n: 3, flag: true }` gives `3` and `true`), which a task function's typed
   * inputs read back. Refused for load, it tries again for `retryForMs`.
   */
  async trigger(
    workflow: string,
    params?: Readonly<Record<string, unknown>>,
    options: TriggerOptions = {},
  ): Promise<Triggered> {
    const logical = options.logicalTime;
    const response = await this.callPatiently(
      ControlService.method.triggerWorkflow,
      {
        name: workflow,
        params: encodeParams(params),
        idempotencyKey: options.idempotencyKey ?? "",
        actor: this.actor,
        logicalTimeMs: BigInt(logical === undefined ? 0 : logical instanceof Date ? logical.getTime() : logical),
      },
      options.retryForMs,
    );
    if (!response.run) throw new AxError("TriggerWorkflow", grpc.status.INTERNAL, "the answer holds no run");
    return { run: runFromPb(response.run), created: response.created };
  }

  async getRun(runId: number): Promise<Run> {
    return runFromPb(await this.call(ControlService.method.getRun, { id: BigInt(runId) }));
  }

  /** The newest runs (of `workflow`, in `state` when given), newest first. */
  async listRuns(options: { workflow?: string; limit?: number; state?: RunState } = {}): Promise<Run[]> {
    const response = await this.call(ControlService.method.listRuns, {
      workflow: options.workflow ?? "",
      limit: options.limit ?? 50,
      state: options.state === undefined ? 0 : runStateValue(options.state),
    });
    return response.runs.map(runFromPb);
  }

  /**
   * The run now, then each change of its state or counts, as the scheduler streams them
   * (`WatchRun`); ends once the run has ended and its processes have (at most `settleMs` after
   * its end). A broken stream throws AxError.
   */
  async *watch(runId: number, options: { settleMs?: number; timeoutMs?: number } = {}): AsyncGenerator<Run> {
    const stream = this.connect().serverStream(
      ControlService.method.watchRun,
      { id: BigInt(runId), settleMs: settleMs(options.settleMs ?? DEFAULT_SETTLE_MS) },
      options.timeoutMs,
    );
    try {
      for await (const message of stream) yield runFromPb(message as MessageShape<typeof ControlService.method.watchRun.output>);
    } catch (error) {
      throw axError("WatchRun", error);
    } finally {
      stream.cancel();
    }
  }

  /**
   * Waits until the run is SUCCESS, FAILED or CANCELLED and the processes of its attempts have
   * ended (a cancelled or timed-out attempt's process is killed after the run ends; at most
   * `settleMs` more), and returns it. It follows the scheduler's stream of the run's changes, and
   * while its node is unavailable (restarting) it tries the stream again, on the next address
   * when there are several. Throws WaitTimeout after `timeoutMs`.
   */
  async wait(runId: number, options: WaitOptions = {}): Promise<Run> {
    const deadline = options.timeoutMs === undefined ? Infinity : Date.now() + options.timeoutMs;
    let seen = "nothing yet";
    let last: Run | undefined;
    for (;;) {
      const remaining = deadline - Date.now();
      if (remaining <= 0) throw new WaitTimeout(`run ${runId} did not end within ${options.timeoutMs} ms (last seen: ${seen})`);
      try {
        for await (const run of this.watch(runId, {
          settleMs: options.settleMs ?? DEFAULT_SETTLE_MS,
          timeoutMs: Number.isFinite(remaining) ? remaining : undefined,
        })) {
          last = run;
          seen = run.state;
        }
        if (last && runEnded(last.state)) return last;
      } catch (error) {
        if (!(error instanceof AxError)) throw error;
        if (error.code === grpc.status.UNIMPLEMENTED) return this.pollUntilEnded(runId, deadline, options);
        if (
          error.code !== grpc.status.UNAVAILABLE &&
          error.code !== grpc.status.DEADLINE_EXCEEDED &&
          error.code !== grpc.status.CANCELLED
        ) {
          throw error;
        }
        if (error.code === grpc.status.UNAVAILABLE) {
          seen = `scheduler unavailable (${error.details})`;
          this.nextEndpoint();
          await delay(250);
        }
      }
    }
  }

  /** `wait` against a scheduler without WatchRun: GetRun four times a second, then the run's instances until no process may run. */
  private async pollUntilEnded(runId: number, deadline: number, options: WaitOptions): Promise<Run> {
    const settle = options.settleMs ?? DEFAULT_SETTLE_MS;
    let endedAt: number | undefined;
    let seen = "nothing yet";
    for (;;) {
      try {
        const run = await this.getRun(runId);
        seen = run.state;
        if (runEnded(run.state)) {
          endedAt ??= Date.now();
          const instances = await this.instances(runId);
          const settled = instances.every((i) => i.attempts.every((a) => !a.processMayRun));
          if (settled || Date.now() - endedAt >= settle) return run;
        }
      } catch (error) {
        if (!(error instanceof AxError) || (error.code !== grpc.status.UNAVAILABLE && error.code !== grpc.status.DEADLINE_EXCEEDED)) {
          throw error;
        }
        seen = `scheduler unavailable (${error.details})`;
      }
      if (Date.now() > deadline) throw new WaitTimeout(`run ${runId} did not end within ${options.timeoutMs} ms (last seen: ${seen})`);
      await delay(250);
    }
  }

  async cancelRun(runId: number, reason = ""): Promise<Run> {
    return runFromPb(await this.call(ControlService.method.cancelRun, { id: BigInt(runId), actor: this.actor, reason }));
  }

  /**
   * New attempts for part of a run: the failed part (`failed`), a task and everything below it
   * (`fromTask`), or chosen tasks and everything below each (`tasks`). The earlier attempts keep
   * their records. A refusal (none or several of the three, an unknown task, a task still active)
   * throws AxError naming it, and nothing is rerun.
   */
  async rerun(runId: number, options: RerunOptions = {}): Promise<Run> {
    const tasks = options.tasks ?? [];
    return runFromPb(
      await this.call(ControlService.method.rerunRun, {
        id: BigInt(runId),
        failed: options.failed ?? false,
        fromTask: options.fromTask ?? "",
        tasks: typeof tasks === "string" ? [tasks] : [...tasks],
        actor: this.actor,
      }),
    );
  }

  // ---------------------------------------------------------------------------------------------
  // Instances and logs.

  listInstances(runId: number, options: { attempts?: boolean } = {}): Promise<ListInstancesResponse> {
    return this.call(ControlService.method.listInstances, { runId: BigInt(runId), attempts: options.attempts ?? false });
  }

  /** The run's instances, each with its attempts. */
  async instances(runId: number): Promise<Instance[]> {
    return (await this.listInstances(runId, { attempts: true })).instances.map(instanceFromPb);
  }

  async getInstance(instanceId: number): Promise<Instance> {
    return instanceFromPb(await this.call(ControlService.method.getInstance, { id: BigInt(instanceId) }));
  }

  async cancelInstance(instanceId: number, reason = ""): Promise<Instance> {
    return instanceFromPb(
      await this.call(ControlService.method.cancelInstance, { id: BigInt(instanceId), actor: this.actor, reason }),
    );
  }

  async retryInstance(instanceId: number): Promise<Instance> {
    return instanceFromPb(await this.call(ControlService.method.retryInstance, { id: BigInt(instanceId), actor: this.actor }));
  }

  /**
   * Marks the instance SUCCESS or FAILED without running it (operator role; docs/dag-semantics.md,
   * "Marks"): a running attempt is killed and not retried, what depends on the task follows its
   * trigger rules, an ended run runs again until nothing is left. `reason` is required. A refusal
   * (no reason, a state the instance has already, a PENDING instance, a mapped task with items
   * still going) throws AxError saying why, and changes nothing; a state other than SUCCESS or
   * FAILED throws a RangeError before any call.
   *
   *     await client.mark(instance.id, "SUCCESS", { reason: "loaded by hand" });
   */
  async mark(instanceId: number, state: MarkState, options: MarkOptions): Promise<Instance> {
    const name = typeof state === "string" ? state.trim().toUpperCase() : "";
    if (name !== "SUCCESS" && name !== "FAILED") {
      throw new RangeError(`an instance can be marked SUCCESS or FAILED only, not ${JSON.stringify(state)}`);
    }
    return instanceFromPb(
      await this.call(ControlService.method.markInstance, {
        id: BigInt(instanceId),
        state: instanceStateValue(name),
        reason: options?.reason ?? "",
        actor: this.actor,
      }),
    );
  }

  /**
   * The attempt's log lines in order (attempt 0: the current one). With `follow` the iteration
   * ends once the attempt has ended and every line it produced was sent.
   */
  async *logs(
    instanceId: number,
    options: { attempt?: number; follow?: boolean; afterSeq?: number; contains?: string } = {},
  ): AsyncGenerator<LogLine> {
    const follow = options.follow ?? false;
    const stream = this.connect().serverStream(
      ControlService.method.getLogs,
      {
        instanceId: BigInt(instanceId),
        attempt: options.attempt ?? 0,
        follow,
        afterSeq: BigInt(options.afterSeq ?? 0),
        contains: options.contains ?? "",
      },
      follow ? undefined : this.timeoutMs,
    );
    try {
      for await (const raw of stream) {
        const chunk = raw as MessageShape<typeof ControlService.method.getLogs.output>;
        for (const line of chunk.lines) {
          yield {
            seq: Number(line.seq),
            stream: line.stream === LogStream.STDOUT ? "stdout" : line.stream === LogStream.STDERR ? "stderr" : "unspecified",
            text: line.text,
            at: line.atMs === 0n ? null : new Date(Number(line.atMs)),
            attempt: chunk.attempt,
          };
        }
      }
    } catch (error) {
      throw axError("GetLogs", error);
    } finally {
      stream.cancel();
    }
  }

  /** The text of every stored line of the attempt. */
  async logText(instanceId: number, attempt = 0): Promise<string[]> {
    const out: string[] = [];
    for await (const line of this.logs(instanceId, { attempt })) out.push(line.text);
    return out;
  }

  // ---------------------------------------------------------------------------------------------
  // The cluster.

  async listWorkers(): Promise<WorkerInfo[]> {
    return (await this.call(ControlService.method.listWorkers, {})).workers;
  }

  listNodes(): Promise<ListNodesResponse> {
    return this.call(ControlService.method.listNodes, {});
  }

  whoAmI(): Promise<Identity> {
    return this.call(ControlService.method.whoAmI, {});
  }

  explain(workflow: string, at?: Date): Promise<Explanation> {
    return this.call(ControlService.method.explainWorkflow, { name: workflow, atMs: BigInt(at ? at.getTime() : 0) });
  }

  /** One run per cron slot of the range; refused for load, tried again as `trigger` is. */
  backfill(
    workflow: string,
    from: Date,
    to: Date,
    options: { dryRun?: boolean; retryForMs?: number } = {},
  ): Promise<BackfillWorkflowResponse> {
    return this.callPatiently(
      ControlService.method.backfillWorkflow,
      {
        name: workflow,
        fromMs: BigInt(from.getTime()),
        toMs: BigInt(to.getTime()),
        dryRun: options.dryRun ?? false,
        actor: this.actor,
      },
      options.retryForMs,
    );
  }
}

function settleMs(ms: number): number {
  if (!(ms > 0 && ms <= 600_000)) throw new RangeError(`settleMs must be more than 0 and at most 600000, not ${ms}`);
  return Math.max(1, Math.floor(ms));
}
