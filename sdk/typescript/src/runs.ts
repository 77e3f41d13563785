/**
 * Runs, instances and attempts as the client returns them, and a workflow's declared params: ids
 * as numbers, states as their names ("SUCCESS"), times as Dates (null for none). Each keeps the
 * message it was made from as `pb`, for the fields this view leaves out.
 *
 *     const run = await client.wait(runId);
 *     if (run.state === "FAILED") {
 *       for (const instance of await client.instances(run.id)) console.log(instance.task, instance.state);
 *     }
 */

import type {
  Attempt as PbAttempt,
  Instance as PbInstance,
  Run as PbRun,
  Workflow as PbWorkflow,
  WorkflowParam as PbWorkflowParam,
} from "./gen/ax/v1/control_pb.js";
import { InstanceState as PbInstanceState, RunState as PbRunState, TriggerKind } from "./gen/ax/v1/types_pb.js";

export type RunState = "UNSPECIFIED" | "RUNNING" | "SUCCESS" | "FAILED" | "CANCELLED" | "QUEUED";
export type InstanceState =
  | "UNSPECIFIED"
  | "WAITING"
  | "DISPATCHED"
  | "RUNNING"
  | "SUCCESS"
  | "FAILED"
  | "TIMEOUT"
  | "CANCELLED"
  | "PENDING"
  | "SKIPPED"
  | "UPSTREAM_FAILED";
export type Trigger = "UNSPECIFIED" | "CRON" | "MANUAL" | "API" | "DEPENDENCY" | "BACKFILL" | "PARENT";

const RUN_ENDED: ReadonlySet<RunState> = new Set(["SUCCESS", "FAILED", "CANCELLED"]);
const INSTANCE_ENDED: ReadonlySet<InstanceState> = new Set([
  "SUCCESS",
  "FAILED",
  "TIMEOUT",
  "CANCELLED",
  "SKIPPED",
  "UPSTREAM_FAILED",
]);

/** SUCCESS, FAILED or CANCELLED: the run will not change state again by itself. */
export function runEnded(state: RunState): boolean {
  return RUN_ENDED.has(state);
}

export function instanceEnded(state: InstanceState): boolean {
  return INSTANCE_ENDED.has(state);
}

/** The name of a protocol enum value, less its prefix ("RUN_STATE_SUCCESS" → "SUCCESS"). */
function named<T extends string>(names: Record<number, string>, value: number, prefix: string): T {
  const name = names[value];
  if (typeof name !== "string") return "UNSPECIFIED" as T;
  return (name.startsWith(prefix) ? name.slice(prefix.length) : name) as T;
}

/** A protocol state name as the view names it ("SUCCESS"): protobuf-es names enum values without their prefix. */
export function runStateName(value: PbRunState): RunState {
  return named<RunState>(PbRunState, value, "RUN_STATE_");
}

export function instanceStateName(value: PbInstanceState): InstanceState {
  return named<InstanceState>(PbInstanceState, value, "INSTANCE_STATE_");
}

/** The protocol value of a run state name. */
export function runStateValue(state: RunState): PbRunState {
  return PbRunState[state as keyof typeof PbRunState] ?? PbRunState.UNSPECIFIED;
}

export function instanceStateValue(state: InstanceState): PbInstanceState {
  return PbInstanceState[state as keyof typeof PbInstanceState] ?? PbInstanceState.UNSPECIFIED;
}

function time(ms: bigint): Date | null {
  return ms === 0n ? null : new Date(Number(ms));
}

export interface Run {
  readonly id: number;
  readonly workflow: string;
  readonly workflowVersion: number;
  readonly state: RunState;
  readonly trigger: Trigger;
  readonly logicalTime: Date | null;
  readonly idempotencyKey: string;
  readonly params: Readonly<Record<string, string>>;
  readonly triggeredBy: string;
  readonly createdAt: Date | null;
  readonly finishedAt: Date | null;
  /** The run's instances by state (waiting, running, success, failed, ...: `ax.v1.InstanceCounts`). */
  readonly counts: Readonly<Record<string, number>>;
  readonly parentRunId: number;
  readonly childRunIds: readonly number[];
  readonly pb: PbRun;
}

export function runFromPb(message: PbRun): Run {
  const counts: Record<string, number> = {};
  const c = message.counts;
  if (c) {
    for (const [key, value] of Object.entries(c)) {
      if (typeof value === "number") counts[key] = value;
    }
  }
  return {
    id: Number(message.id),
    workflow: message.workflow,
    workflowVersion: message.workflowVersion,
    state: runStateName(message.state),
    trigger: named<Trigger>(TriggerKind, message.trigger, "TRIGGER_KIND_"),
    logicalTime: time(message.logicalTimeMs),
    idempotencyKey: message.idempotencyKey,
    params: { ...message.params },
    triggeredBy: message.triggeredBy,
    createdAt: time(message.createdAtMs),
    finishedAt: time(message.finishedAtMs),
    counts,
    parentRunId: Number(message.parentRunId),
    childRunIds: message.childRunIds.map(Number),
    pb: message,
  };
}

export interface Attempt {
  readonly attempt: number;
  readonly state: InstanceState;
  readonly workerId: string;
  readonly dispatchedAt: Date | null;
  readonly startedAt: Date | null;
  readonly finishedAt: Date | null;
  readonly exitCode: number | undefined;
  readonly signal: number | undefined;
  readonly pid: number;
  readonly logLines: number;
  readonly message: string;
  readonly outputs: Readonly<Record<string, string>>;
  /** The scheduler ended the attempt (cancel, timeout) after its process started, and no end of the process was reported yet. */
  readonly processMayRun: boolean;
  readonly pb: PbAttempt;
}

export function attemptFromPb(message: PbAttempt): Attempt {
  const state = instanceStateName(message.state);
  return {
    attempt: message.attempt,
    state,
    workerId: message.workerId,
    dispatchedAt: time(message.dispatchedAtMs),
    startedAt: time(message.startedAtMs),
    finishedAt: time(message.finishedAtMs),
    exitCode: message.exitCode,
    signal: message.signal,
    pid: message.pid,
    logLines: Number(message.logLines),
    message: message.message,
    outputs: { ...message.outputs },
    processMayRun:
      (state === "CANCELLED" || state === "TIMEOUT") &&
      message.startedAtMs !== 0n &&
      message.exitCode === undefined &&
      message.signal === undefined,
    pb: message,
  };
}

export interface Instance {
  readonly id: number;
  readonly runId: number;
  readonly workflow: string;
  readonly task: string;
  readonly state: InstanceState;
  readonly attempt: number;
  readonly workerId: string;
  readonly createdAt: Date | null;
  readonly startedAt: Date | null;
  readonly finishedAt: Date | null;
  readonly exitCode: number | undefined;
  /** Each attempt, oldest first (empty where the call does not list them). */
  readonly attempts: readonly Attempt[];
  /** For an item of a for_each task: its element. */
  readonly item: string | undefined;
  /** What the latest attempt passed on. */
  readonly outputs: Readonly<Record<string, string>>;
  readonly pb: PbInstance;
}

export function instanceFromPb(message: PbInstance): Instance {
  const attempts = message.attempts.map(attemptFromPb);
  return {
    id: Number(message.id),
    runId: Number(message.runId),
    workflow: message.workflow,
    task: message.task,
    state: instanceStateName(message.state),
    attempt: message.attempt,
    workerId: message.workerId,
    createdAt: time(message.createdAtMs),
    startedAt: time(message.startedAtMs),
    finishedAt: time(message.finishedAtMs),
    exitCode: message.exitCode,
    attempts,
    item: message.item,
    outputs: attempts.length > 0 ? attempts[attempts.length - 1]!.outputs : {},
    pb: message,
  };
}

/** What a trigger returned: the run, and whether this call created it (false: an earlier call with the same idempotency key did). */
export interface Triggered {
  readonly run: Run;
  readonly created: boolean;
}

/**
 * A param the workflow declares (`params:` in its file, docs/workflow-format.md): a trigger that
 * leaves it out gets `default`, a `required` one must be given (not empty), one with `choices`
 * takes only those.
 */
export interface WorkflowParam {
  readonly name: string;
  readonly description: string;
  /** The default; undefined when the param has none (an empty string is a default). */
  readonly default: string | undefined;
  readonly required: boolean;
  /** The only values it may take; empty: any value. */
  readonly choices: readonly string[];
  readonly pb: PbWorkflowParam;
}

export function workflowParamFromPb(message: PbWorkflowParam): WorkflowParam {
  return {
    name: message.name,
    description: message.description,
    default: message.hasDefault ? message.defaultValue : undefined,
    required: message.required,
    choices: [...message.choices],
    pb: message,
  };
}

/** The params a workflow (as `getWorkflow` returns it) declares, in file order. */
export function workflowParams(workflow: PbWorkflow): WorkflowParam[] {
  return workflow.params.map(workflowParamFromPb);
}
