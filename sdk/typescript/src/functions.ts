/**
 * Functions as tasks: the registry, the workflow convention and what a function gets.
 *
 * A workflow task selects a registered function by its command, with no change to the scheduler:
 *
 *     command: ax-node NAME [ARG ...]        # words split as a shell would
 *     argv: [ax-node, NAME, ARG, ...]        # or the argv form
 *
 * A TypeScript worker that has NAME registered runs the function; on any other worker the command
 * fails to start (`ax-node: not found`), so route such tasks to these workers with a label
 * (`labels: {sdk: node}` on the task, `--label sdk=node` on the worker).
 *
 * The function runs in a child process of its own (`node` running the SDK's `fnrun.js`, which
 * imports the function's module), in a process group of its own like a shell task, so a cancel
 * or a timeout kills it and whatever it started; what it prints on stdout and stderr are the
 * attempt's log lines. It receives its typed inputs (see `inputs.ts`) and a `TaskContext`. Its
 * return value becomes its outputs (`outputsFromReturn`); a thrown error fails the attempt (exit
 * code 1, the stack on stderr); `process.exit(n)` exits with n. A cancel or a timeout (SIGTERM)
 * aborts `ctx.signal`, once, so the function can clean up; the process then ends by SIGTERM.
 *
 * A registry knows its module (`new Tasks(import.meta.url)`), which the child imports to find the
 * function again: define tasks at the top level of a module, and start a worker from another
 * module (or behind `if (isMain(import.meta.url))`), since the child imports the module anew.
 */

import { isAbsolute } from "node:path";
import { pathToFileURL } from "node:url";

import {
  ConversionError,
  fromText,
  asDecoder,
  type Inputs,
  type InputSpec,
  type Schema,
  type TaskRef,
} from "./inputs.js";
import { paramEnvName, upstreamEnvName } from "./outputs.js";

/** The first word of a command (or argv[0]) that selects a registered function. */
export const COMMAND = "ax-node";

/** The environment variable the child runner reads its function from (JSON). */
export const SPEC_ENV = "AX_SDK_FUNCTION";

const TASK: unique symbol = Symbol.for("ax-sdk.task");
const TASKS: unique symbol = Symbol.for("ax-sdk.tasks");
const CREATED: unique symbol = Symbol.for("ax-sdk.registries");

/**
 * The reason `ctx.signal` is aborted with when the attempt is cancelled or timed out (SIGTERM).
 * Catch it only to clean up: the attempt ends cancelled whatever the function does.
 */
export class Cancelled extends Error {
  override name = "Cancelled";
}

/** What a task function is told about its attempt. */
export class TaskContext {
  /** The words after the function's name in the task's command. */
  readonly args: readonly string[];
  /** The run's params, as text (`AX_PARAM_<name>`). */
  readonly params: Readonly<Record<string, string>>;
  /** The attempt's whole environment. */
  readonly env: Readonly<Record<string, string>>;
  readonly runId: number;
  readonly instanceId: number;
  readonly attempt: number;
  readonly workflow: string;
  readonly task: string;
  /** The run's logical time, RFC 3339 (2026-01-31T02:30:00Z). */
  readonly logicalTime: string;
  readonly shardIndex: number | undefined;
  readonly shardTotal: number | undefined;
  /** Aborted (once, with a `Cancelled`) when the attempt is cancelled or timed out. */
  readonly signal: AbortSignal;

  constructor(args: readonly string[], env: Readonly<Record<string, string | undefined>>, signal?: AbortSignal) {
    const clean: Record<string, string> = {};
    for (const [key, value] of Object.entries(env)) if (value !== undefined) clean[key] = value;
    const number = (name: string) => {
      const n = Number(clean[name] ?? "0");
      return Number.isFinite(n) ? n : 0;
    };
    const params: Record<string, string> = {};
    for (const [key, value] of Object.entries(clean)) {
      if (key.startsWith("AX_PARAM_")) params[key.slice("AX_PARAM_".length)] = value;
    }
    const sharded = clean.AX_SHARD_TOTAL !== undefined && clean.AX_SHARD_TOTAL !== "";
    this.args = Object.freeze([...args]);
    this.params = Object.freeze(params);
    this.env = Object.freeze(clean);
    this.runId = number("AX_RUN_ID");
    this.instanceId = number("AX_INSTANCE_ID");
    this.attempt = number("AX_ATTEMPT");
    this.workflow = clean.AX_WORKFLOW ?? "";
    this.task = clean.AX_TASK ?? "";
    this.logicalTime = clean.AX_LOGICAL_TIME ?? "";
    this.shardIndex = sharded ? number("AX_SHARD_INDEX") : undefined;
    this.shardTotal = sharded ? number("AX_SHARD_TOTAL") : undefined;
    this.signal = signal ?? new AbortController().signal;
  }

  /**
   * The run's param `name`: as text, or checked by `schema`; `fallback` when the run has none
   * (without one, an Error names the param).
   */
  param(name: string): string;
  param<T>(name: string, schema: Schema<T>, ...fallback: [T?]): T;
  param<T>(name: string, schema?: Schema<T>, ...fallback: [T?]): T | string {
    const text = this.env[paramEnvName(name)];
    if (text === undefined) {
      if (fallback.length > 0) return fallback[0] as T;
      throw new Error(`the run has no param ${name}`);
    }
    if (!schema) return text;
    const decoder = asDecoder(schema);
    try {
      return fromText(text, decoder);
    } catch (error) {
      if (error instanceof ConversionError) {
        throw new Error(`param ${name} is ${JSON.stringify(text)}, not ${decoder.expected}: ${error.message}`);
      }
      throw error;
    }
  }

  /** The output `key` a direct upstream `task` passed on, as text (undefined when none). */
  output(task: string | TaskRef, key: string): string | undefined {
    return this.env[upstreamEnvName(typeof task === "string" ? task : task.name, key)];
  }

  /** An upstream's output read back as JSON: what its function returned (`key` "return"), or one key of it. */
  outputJson(task: string | TaskRef, key = "return"): unknown {
    const name = typeof task === "string" ? task : task.name;
    const text = this.output(name, key);
    if (text === undefined) throw new Error(`task ${name} passed on no output ${key}`);
    return JSON.parse(text);
  }
}

/** A task function's definition, as `Tasks.task` makes it. */
export interface TaskDefinition<S extends InputSpec = InputSpec, R = unknown> extends TaskRef<R> {
  readonly [TASK]: true;
  readonly name: string;
  readonly description: string | undefined;
  readonly inputs: S;
  readonly run: (inputs: Inputs<S>, ctx: TaskContext) => R | Promise<R>;
  /** The registry it belongs to. */
  readonly tasks: Tasks;
}

export function isTaskDefinition(value: unknown): value is TaskDefinition {
  return typeof value === "object" && value !== null && (value as { [TASK]?: unknown })[TASK] === true;
}

/** Options of a task with typed inputs. */
export interface TaskOptions<S extends InputSpec, R> {
  /** Each input's source and type (see `inputs.ts`). */
  inputs?: S;
  description?: string;
  run: (inputs: Inputs<S>, ctx: TaskContext) => R | Promise<R>;
}

function moduleUrl(module: string | URL): string {
  const text = module instanceof URL ? module.href : module;
  if (text.startsWith("file:")) return text;
  if (isAbsolute(text)) return pathToFileURL(text).href;
  throw new Error(
    `a task registry's module must be a file: URL or an absolute path (new Tasks(import.meta.url)), not ${JSON.stringify(text)}`,
  );
}

function createdRegistries(): Tasks[] {
  const holder = globalThis as unknown as { [CREATED]?: Tasks[] };
  holder[CREATED] ??= [];
  return holder[CREATED];
}

/**
 * A registry of task functions, `tasks.task(name, ...)`. `module` is the module that defines them
 * (`import.meta.url`, or `__filename` in CommonJS): the child process imports it to find the
 * function. The worker's command line serves the registries its `--module` files create.
 */
export class Tasks {
  readonly [TASKS] = true as const;
  /** The defining module's file: URL; undefined until known. */
  module: string | undefined;
  private readonly functions = new Map<string, TaskDefinition<any, any>>();

  constructor(module?: string | URL) {
    this.module = module === undefined ? undefined : moduleUrl(module);
    createdRegistries().push(this);
  }

  /** A task whose function takes the context only. */
  task<R>(name: string, run: (ctx: TaskContext) => R | Promise<R>): TaskDefinition<Record<never, never>, R>;
  /** A task whose function takes typed inputs and the context. */
  task<S extends InputSpec, R>(name: string, options: TaskOptions<S, R>): TaskDefinition<S, R>;
  task(
    name: string,
    options: TaskOptions<InputSpec, unknown> | ((ctx: TaskContext) => unknown),
  ): TaskDefinition<InputSpec, unknown> {
    if (!name || /\s/.test(name)) {
      throw new Error(`task function name ${JSON.stringify(name)} must be non-empty and without whitespace`);
    }
    if (this.functions.has(name)) throw new Error(`task function name ${JSON.stringify(name)} is already registered`);
    const run =
      typeof options === "function" ? (_inputs: Inputs<InputSpec>, ctx: TaskContext) => options(ctx) : options.run;
    if (typeof run !== "function") throw new Error(`task function ${name} needs a run function`);
    for (const [input, spec] of Object.entries(typeof options === "function" ? {} : (options.inputs ?? {}))) {
      if (spec === null || typeof spec !== "object") {
        throw new Error(`task function ${name}: input ${input} must be a decoder, param(...) or upstream(...)`);
      }
    }
    const definition: TaskDefinition<InputSpec, unknown> = Object.freeze({
      [TASK]: true as const,
      name,
      description: typeof options === "function" ? undefined : options.description,
      inputs: typeof options === "function" ? {} : (options.inputs ?? {}),
      run,
      tasks: this,
    });
    this.functions.set(name, definition);
    return definition;
  }

  get(name: string): TaskDefinition<any, any> | undefined {
    return this.functions.get(name);
  }

  names(): string[] {
    return [...this.functions.keys()].sort();
  }

  definitions(): TaskDefinition<any, any>[] {
    return [...this.functions.values()];
  }
}

export function isTasks(value: unknown): value is Tasks {
  return typeof value === "object" && value !== null && (value as { [TASKS]?: unknown })[TASKS] === true;
}

/** The registries made in this process so far (the child runner looks a function up in them). */
export function registriesCreated(): readonly Tasks[] {
  return createdRegistries();
}

/** Splits a command line into words as a POSIX shell would (quotes and backslashes), like shlex. */
export function shellWords(line: string): string[] {
  const words: string[] = [];
  let word = "";
  let inWord = false;
  let i = 0;
  while (i < line.length) {
    const c = line[i]!;
    if (c === "'") {
      const end = line.indexOf("'", i + 1);
      if (end < 0) throw new Error("No closing quotation");
      word += line.slice(i + 1, end);
      inWord = true;
      i = end + 1;
    } else if (c === '"') {
      i += 1;
      let closed = false;
      while (i < line.length) {
        const d = line[i]!;
        if (d === '"') {
          closed = true;
          i += 1;
          break;
        }
        if (d === "\\" && i + 1 < line.length && '\\"$`\n'.includes(line[i + 1]!)) {
          if (line[i + 1] !== "\n") word += line[i + 1];
          i += 2;
          continue;
        }
        word += d;
        i += 1;
      }
      if (!closed) throw new Error("No closing quotation");
      inWord = true;
    } else if (c === "\\") {
      if (i + 1 >= line.length) throw new Error("No escaped character");
      if (line[i + 1] !== "\n") word += line[i + 1];
      inWord = true;
      i += 2;
    } else if (/\s/.test(c)) {
      if (inWord) words.push(word);
      word = "";
      inWord = false;
      i += 1;
    } else {
      word += c;
      inWord = true;
      i += 1;
    }
  }
  if (inWord) words.push(word);
  return words;
}

/**
 * [name, args] when a dispatch selects a registered function, else undefined. Throws for a
 * selection without a name or with unbalanced quotes.
 */
export function functionCall(command: string, argv: readonly string[]): [string, string[]] | undefined {
  let words: string[];
  if (argv.length > 0) {
    if (argv[0] !== COMMAND) return undefined;
    words = [...argv];
  } else {
    const stripped = command.trim();
    if (stripped !== COMMAND && !stripped.startsWith(`${COMMAND} `) && !stripped.startsWith(`${COMMAND}\t`)) {
      return undefined;
    }
    try {
      words = shellWords(stripped);
    } catch (error) {
      throw new Error(`cannot split the command ${JSON.stringify(command)}: ${(error as Error).message}`);
    }
  }
  if (words.length < 2) throw new Error(`${COMMAND} needs a function name: ${COMMAND} NAME [ARG ...]`);
  return [words[1]!, words.slice(2)];
}

/** What the child runner gets in AX_SDK_FUNCTION. */
export interface ChildSpec {
  name: string;
  module: string;
  args: string[];
}

/** Whether this process is a task function's child (the runner sets this before importing). */
export function inFunctionChild(): boolean {
  return (globalThis as { [key: symbol]: unknown })[Symbol.for("ax-sdk.function-child")] === true;
}

/**
 * Whether the module of `metaUrl` (`import.meta.url`) is the program node was started with:
 * `if (isMain(import.meta.url)) await worker.run()` keeps a module that both defines tasks and
 * starts a worker from starting one again in each task's child process.
 */
export function isMain(metaUrl: string): boolean {
  const entry = process.argv[1];
  if (!entry) return false;
  try {
    return pathToFileURL(entry).href === metaUrl;
  } catch {
    return false;
  }
}
