/**
 * Workflows defined in TypeScript: a builder that writes the workflow file, which a client
 * applies (`client.apply(workflow)`).
 *
 *     const etl = new Workflow("etl", { schedule: { cron: "0 2 * * *", timezone: "Europe/Paris" } });
 *     etl.task(extract, { labels: { sdk: "node" } });
 *     etl.task(load, { labels: { sdk: "node" } });          // upstream: extract, from its inputs
 *     etl.shell("report", "echo loaded ${tasks.load.outputs.return} rows", { upstream: "load" });
 *
 * A function task's command is `ax-node NAME` for the name its function was registered under.
 * Its upstreams are those given with `upstream`, plus the tasks its inputs read (`upstream(...)`)
 * and the tasks of the workflow an input is named after (an input `extract` reads what task
 * `extract` returned; `-` and `.` in a task's name as `_`). A task or upstream named twice, or an
 * upstream that is not a task added before it, is refused as it is added.
 *
 * `toYaml()` writes the file in the format of docs/workflow-format.md (every string quoted); the
 * scheduler checks the rest when it is applied (`client.apply(workflow, { dryRun: true })`).
 */

import { COMMAND, type TaskDefinition } from "./functions.js";
import { isParamInput, isUpstreamInput } from "./inputs.js";

type Value = string | number | boolean | null | readonly Value[] | { readonly [key: string]: Value | undefined };

export type TriggerRule = "all_success" | "all_done" | "one_failed" | "one_success" | "none_failed" | "always";
export type Routing =
  | "default"
  | "least_running"
  | "round_robin"
  | "random"
  | "consistent_hash"
  | "failover"
  | "sharded_broadcast";

/** A task's fields other than its name, command and upstreams (as in the file). */
export interface TaskFields {
  timeout?: string;
  retries?: number;
  retry_backoff?: string;
  env?: Readonly<Record<string, string | { secret: string }>>;
  labels?: Readonly<Record<string, string>>;
  priority?: number;
  trigger_rule?: TriggerRule;
  /** The task's `if:` (CEL). */
  condition?: string;
  for_each?: string | readonly Value[];
  concurrency?: number;
  pool?: string;
  routing?: Routing;
  working_dir?: string;
  /** Any other field of the file, by its name (`{ survive_worker_restart: true }`). */
  fields?: Readonly<Record<string, Value>>;
}

type Upstreams = string | WorkflowTask | ReadonlyArray<string | WorkflowTask>;

export interface AddOptions extends TaskFields {
  upstream?: Upstreams;
  handler?: "on_failure" | "on_success";
}

export interface FunctionTaskOptions extends AddOptions {
  /** The task's name (the function's by default). */
  name?: string;
  /** Words after the function's name (`ctx.args`). */
  args?: readonly string[];
}

/** A task of a Workflow; `name` is what other tasks give as their upstream. */
export interface WorkflowTask {
  readonly name: string;
  readonly fields: Readonly<Record<string, Value>>;
}

export interface WorkflowOptions {
  app?: string;
  description?: string;
  owner?: string;
  schedule?: Readonly<Record<string, Value>>;
  concurrency?: Readonly<Record<string, Value>>;
  defaults?: Readonly<Record<string, Value>>;
  retention?: string;
  deadline?: string;
  on_deadline?: "alert" | "cancel";
}

function names(upstream: Upstreams | undefined): string[] {
  if (upstream === undefined) return [];
  const list = typeof upstream === "string" || !Array.isArray(upstream) ? [upstream as string | WorkflowTask] : upstream;
  return list.map((u) => (typeof u === "string" ? u : u.name));
}

function inputName(task: string): string {
  return [...task].map((c) => (/^[\p{L}\p{N}_]$/u.test(c) ? c : "_")).join("");
}

/** A workflow file built in code. */
export class Workflow {
  readonly name: string;
  private readonly top: Record<string, Value>;
  private readonly tasks: WorkflowTask[] = [];
  private readonly handlers: Record<"on_failure" | "on_success", WorkflowTask[]> = { on_failure: [], on_success: [] };

  constructor(name: string, options: WorkflowOptions = {}) {
    this.name = name;
    this.top = {};
    for (const [key, value] of Object.entries(options)) if (value !== undefined) this.top[key] = value as Value;
  }

  /** A task running `command`: a shell command line, or a list of words run without a shell (`argv`). */
  shell(name: string, command: string | readonly string[], options: AddOptions = {}): WorkflowTask {
    const fields: Record<string, Value> = typeof command === "string" ? { command } : { argv: [...command] };
    return this.add(name, fields, names(options.upstream), options);
  }

  /** A task running a registered task function on a worker that serves it (`ax-node NAME`). */
  task(definition: TaskDefinition<any, any>, options: FunctionTaskOptions = {}): WorkflowTask {
    const name = options.name ?? definition.name;
    const fields: Record<string, Value> = { argv: [COMMAND, definition.name, ...(options.args ?? [])] };
    const byInputName = new Map(this.tasks.map((t) => [inputName(t.name), t.name]));
    const read: string[] = [];
    for (const [input, spec] of Object.entries(definition.inputs)) {
      if (isUpstreamInput(spec)) read.push(spec.task);
      else if (!isParamInput(spec) && byInputName.has(input)) read.push(byInputName.get(input)!);
    }
    const upstreams = [...names(options.upstream), ...read.filter((u) => u !== name)];
    return this.add(name, fields, upstreams, options);
  }

  private add(name: string, fields: Record<string, Value>, upstreams: string[], options: AddOptions): WorkflowTask {
    const known = new Set([...this.tasks, ...this.handlers.on_failure, ...this.handlers.on_success].map((t) => t.name));
    if (known.has(name)) throw new Error(`workflow ${this.name}: task ${name} is added twice`);
    const unique = [...new Set(upstreams)];
    const before = new Set(this.tasks.map((t) => t.name));
    for (const upstream of unique) {
      if (!before.has(upstream)) {
        throw new Error(`workflow ${this.name}: task ${name}'s upstream ${upstream} is not a task added before it`);
      }
    }
    const body: Record<string, Value> = { name, ...fields };
    if (unique.length > 0) body.upstream = unique.length > 1 ? unique : unique[0]!;
    const given: Record<string, unknown> = { ...options, ...(options.fields ?? {}) };
    for (const [key, value] of Object.entries(given)) {
      if (value === undefined || ["upstream", "handler", "name", "args", "fields"].includes(key)) continue;
      if (key === "command" || key === "argv") {
        throw new Error(`workflow ${this.name}: task ${name}: give ${key} as an argument, not an option`);
      }
      body[key === "condition" ? "if" : key] = value as Value;
    }
    const task: WorkflowTask = { name, fields: body };
    if (options.handler === undefined) {
      this.tasks.push(task);
    } else {
      if (unique.length > 0) throw new Error(`workflow ${this.name}: handler ${name} cannot have upstreams`);
      this.handlers[options.handler].push(task);
    }
    return task;
  }

  toObject(): Record<string, Value> {
    if (this.tasks.length === 0) throw new Error(`workflow ${this.name} has no tasks`);
    const document: Record<string, Value> = { name: this.name, ...this.top, tasks: this.tasks.map((t) => t.fields) };
    for (const key of ["on_failure", "on_success"] as const) {
      if (this.handlers[key].length > 0) document[key] = this.handlers[key].map((t) => t.fields);
    }
    return document;
  }

  /** The workflow file's text. */
  toYaml(): string {
    return `${yaml(this.toObject(), 0)}\n`;
  }
}

function scalar(value: Value | undefined): string {
  if (value === null || value === undefined) return "null";
  if (typeof value === "boolean") return value ? "true" : "false";
  if (typeof value === "number") {
    if (!Number.isFinite(value)) throw new TypeError(`${value} cannot be written in a workflow file`);
    return JSON.stringify(value);
  }
  // A JSON string is a YAML double-quoted scalar: nothing in it is read as YAML.
  if (typeof value === "string") return JSON.stringify(value);
  throw new TypeError(`a ${typeof value} cannot be written in a workflow file`);
}

function plainKey(key: string): boolean {
  return /^[A-Za-z_][A-Za-z0-9_-]*$/.test(key);
}

function isContainer(value: Value | undefined): value is readonly Value[] | { readonly [key: string]: Value } {
  return typeof value === "object" && value !== null;
}

function nonEmpty(value: Value | undefined): boolean {
  return isContainer(value) && (Array.isArray(value) ? value.length > 0 : Object.keys(value).length > 0);
}

function yaml(value: Value | undefined, indent: number): string {
  const pad = " ".repeat(indent);
  if (Array.isArray(value)) {
    if (value.length === 0) return "[]";
    return value
      .map((item: Value) => {
        if (nonEmpty(item) && !Array.isArray(item)) return `${pad}- ${yaml(item, indent + 2).slice(indent + 2)}`;
        if (nonEmpty(item)) return `${pad}-\n${yaml(item, indent + 2)}`;
        return `${pad}- ${isContainer(item) ? yaml(item, 0) : scalar(item)}`;
      })
      .join("\n");
  }
  if (isContainer(value)) {
    const entries = Object.entries(value).filter(([, item]) => item !== undefined);
    if (entries.length === 0) return "{}";
    return entries
      .map(([key, item]) => {
        const label = `${pad}${plainKey(key) ? key : JSON.stringify(key)}:`;
        if (nonEmpty(item)) return `${label}\n${yaml(item, indent + 2)}`;
        return `${label} ${isContainer(item) ? yaml(item, 0) : scalar(item)}`;
      })
      .join("\n");
  }
  return pad + scalar(value);
}
