/**
 * Typed inputs of task functions: where each value comes from and what type it must have.
 *
 *     tasks.task("load", {
 *       inputs: {
 *         day: t.date(),                                  // the run's param "day" (or upstream "day")
 *         rows: upstream(extract),                        // what task `extract` returned, typed by it
 *         limit: param("limit", t.integer(), 1000),       // param "limit", 1000 without it
 *         region: upstream("geo", "region", t.string()),  // output "region" of upstream task "geo"
 *       },
 *       async run({ day, rows, limit, region }, ctx) { ... },
 *     });
 *
 * An input given as a decoder alone (`t.integer()`) takes the value of the direct upstream task
 * of its name (`-` and `.` in the task's name as `_`) when that task passed one on, else the
 * run's param of its name, else the decoder's default (`t.optional(...)`); without any, the
 * attempt fails before the function runs, naming the input.
 *
 * Values reach a task as environment text (`AX_PARAM_<name>`, `AX_UPSTREAM_<TASK>_<KEY>`). A
 * string decoder takes the text as it is; any other reads it as JSON first (text that is not
 * JSON stays text, so `--param city=Lyon` is the string "Lyon"), then checks and converts it. An
 * upstream's `return` output is always JSON (what its function returned). A value that does not
 * fit fails the attempt, naming the input, where its value came from and what was wrong.
 *
 * A schema of zod (or any object with `parse(value)` returning the value or throwing) is a
 * decoder too: `inputs: { order: OrderSchema }`. zod is not a dependency of the SDK.
 */

import { paramEnvName, upstreamEnvName } from "./outputs.js";

/** A value that does not fit its decoder. */
export class ConversionError extends Error {
  override name = "ConversionError";
}

/** An input that cannot be given a value (missing, or not of its type). */
export class InputError extends Error {
  override name = "InputError";
}

/** Checks (and converts) a decoded JSON value to T, or throws a ConversionError saying why. */
export interface Decoder<T> {
  readonly [DECODER]: true;
  /** What it expects, for messages: "an integer", "a list of strings". */
  readonly expected: string;
  /** Takes environment text as it is, without reading it as JSON (strings). */
  readonly text?: boolean;
  /** The value when none is given (an optional decoder). */
  readonly fallback?: { value: T } | undefined;
  decode(value: unknown): T;
}

const DECODER: unique symbol = Symbol.for("ax-sdk.decoder");

/** A schema of a validation library: `parse` returns the value or throws (zod, valibot's wrappers). */
export interface ParseSchema<T> {
  parse(value: unknown): T;
}

/** What an input may be declared with. */
export type Schema<T> = Decoder<T> | ParseSchema<T>;

/** The type a schema gives. */
export type SchemaType<S> = S extends Decoder<infer T> ? T : S extends ParseSchema<infer T> ? T : never;

function shown(value: unknown): string {
  let text: string;
  try {
    text = JSON.stringify(value) ?? String(value);
  } catch {
    text = String(value);
  }
  return text.length <= 60 ? text : `${text.slice(0, 59)}…`;
}

function decoder<T>(expected: string, decode: (value: unknown) => T, extra: Partial<Decoder<T>> = {}): Decoder<T> {
  return { [DECODER]: true, expected, decode, ...extra };
}

export function isDecoder(value: unknown): value is Decoder<unknown> {
  return typeof value === "object" && value !== null && (value as { [DECODER]?: unknown })[DECODER] === true;
}

/** A decoder of a schema (a Decoder as it is; a zod-like schema through its `parse`). */
export function asDecoder<T>(schema: Schema<T>): Decoder<T> {
  if (isDecoder(schema)) return schema as Decoder<T>;
  if (typeof (schema as ParseSchema<T>)?.parse === "function") {
    const parse = (schema as ParseSchema<T>).parse.bind(schema);
    return decoder("a value its schema accepts", (value) => {
      try {
        return parse(value);
      } catch (error) {
        const issues = (error as { issues?: Array<{ path?: unknown[]; message?: string }> }).issues;
        if (Array.isArray(issues) && issues.length > 0) {
          throw new ConversionError(
            issues
              .map((issue) => {
                const path = Array.isArray(issue.path) && issue.path.length > 0 ? `${issue.path.join(".")}: ` : "";
                return `${path}${issue.message ?? "invalid"}`;
              })
              .join("; "),
          );
        }
        throw new ConversionError(error instanceof Error ? error.message : String(error));
      }
    });
  }
  throw new TypeError("an input's schema must be a decoder (t.string(), ...) or have a parse(value) method (zod)");
}

function expectIn<T>(inner: Decoder<T>, where: string, value: unknown): T {
  try {
    return inner.decode(value);
  } catch (error) {
    if (error instanceof ConversionError) throw new ConversionError(`${where}: ${error.message}`);
    throw error;
  }
}

/** The decoders. */
export const t = {
  /** Text as it is (from JSON: a string; a number or boolean as its JSON text). */
  string(): Decoder<string> {
    return decoder(
      "a string",
      (value) => {
        if (typeof value === "string") return value;
        if (typeof value === "number" || typeof value === "boolean") return JSON.stringify(value);
        throw new ConversionError(`expected a string, got ${shown(value)}`);
      },
      { text: true },
    );
  },
  /** A finite number (from JSON, or numeric text). */
  number(): Decoder<number> {
    return decoder("a number", (value) => {
      if (typeof value === "number" && Number.isFinite(value)) return value;
      if (typeof value === "string" && value.trim() !== "" && Number.isFinite(Number(value))) return Number(value);
      throw new ConversionError(`expected a number, got ${shown(value)}`);
    });
  },
  /** A safe integer (from JSON, or integer text). */
  integer(): Decoder<number> {
    return decoder("an integer", (value) => {
      const n = typeof value === "string" && /^\s*[+-]?\d+\s*$/.test(value) ? Number(value) : value;
      if (typeof n === "number" && Number.isSafeInteger(n)) return n;
      throw new ConversionError(`expected an integer, got ${shown(value)}`);
    });
  },
  /** JSON true or false. */
  boolean(): Decoder<boolean> {
    return decoder("true or false", (value) => {
      if (typeof value === "boolean") return value;
      throw new ConversionError(`expected true or false, got ${shown(value)}`);
    });
  },
  /** A Date from ISO 8601 text (2026-01-31, 2026-01-31T02:30:00Z). */
  date(): Decoder<Date> {
    return decoder(
      "a date in ISO 8601",
      (value) => {
        if (typeof value === "string" && /^\d{4}-\d{2}-\d{2}/.test(value)) {
          const date = new Date(value);
          if (!Number.isNaN(date.getTime())) return date;
        }
        throw new ConversionError(`expected a date in ISO 8601, got ${shown(value)}`);
      },
      { text: true },
    );
  },
  /** One of the given values (strings, numbers or booleans). */
  literal<const L extends readonly (string | number | boolean)[]>(...values: L): Decoder<L[number]> {
    const list = values.map((v) => JSON.stringify(v)).join(", ");
    // Literals that are all strings take the text as it is ("true" stays a string).
    const text = values.length > 0 && values.every((v) => typeof v === "string");
    return decoder(
      `one of ${list}`,
      (value) => {
        if ((values as readonly unknown[]).includes(value)) return value as L[number];
        throw new ConversionError(`expected one of ${list}, got ${shown(value)}`);
      },
      { text },
    );
  },
  /** A list whose items each fit `item`. */
  array<T>(item: Schema<T>): Decoder<T[]> {
    const inner = asDecoder(item);
    return decoder(`a list of ${inner.expected}`, (value) => {
      if (!Array.isArray(value)) throw new ConversionError(`expected a list, got ${shown(value)}`);
      return value.map((v, i) => expectIn(inner, `item ${i}`, v));
    });
  },
  /** An object of string keys whose values each fit `item`. */
  record<T>(item: Schema<T>): Decoder<Record<string, T>> {
    const inner = asDecoder(item);
    return decoder(`an object of ${inner.expected}`, (value) => {
      if (typeof value !== "object" || value === null || Array.isArray(value)) {
        throw new ConversionError(`expected an object, got ${shown(value)}`);
      }
      const out: Record<string, T> = {};
      for (const [key, v] of Object.entries(value)) out[key] = expectIn(inner, key, v);
      return out;
    });
  },
  /**
   * An object with these fields, each checked by its own decoder (an optional decoder's field may
   * be absent); a key it does not declare is refused, as is a missing required field.
   */
  object<F extends Record<string, Schema<unknown>>>(fields: F): Decoder<ObjectOf<F>> {
    const decoders = Object.entries(fields).map(([name, schema]) => [name, asDecoder(schema)] as const);
    return decoder("an object", (value) => {
      if (typeof value !== "object" || value === null || Array.isArray(value)) {
        throw new ConversionError(`expected an object, got ${shown(value)}`);
      }
      const given = value as Record<string, unknown>;
      const unknown = Object.keys(given).filter((key) => !(key in fields)).sort();
      if (unknown.length > 0) throw new ConversionError(`no field ${unknown.join(", ")} is expected`);
      const out: Record<string, unknown> = {};
      for (const [name, inner] of decoders) {
        if (!(name in given) || given[name] === undefined) {
          if (inner.fallback) {
            if (inner.fallback.value !== undefined) out[name] = inner.fallback.value;
            continue;
          }
          throw new ConversionError(`field ${name} is missing`);
        }
        out[name] = expectIn(inner, name, given[name]);
      }
      return out as ObjectOf<F>;
    });
  },
  /** `inner`, or `value` (undefined by default) when nothing is given or the value is null. */
  optional<T, D extends T | undefined = undefined>(inner: Schema<T>, value?: D): Decoder<T | D> {
    const d = asDecoder(inner);
    return decoder(
      `${d.expected} (optional)`,
      (v) => (v === null || v === undefined ? (value as D) : d.decode(v)),
      { text: d.text === true, fallback: { value: value as D } },
    );
  },
  /** Any JSON value, unchecked, typed as T (trust the producer). */
  json<T = unknown>(): Decoder<T> {
    return decoder("any JSON value", (value) => value as T);
  },
};

type OptionalKeys<F> = { [K in keyof F]: F[K] extends Decoder<infer _T> & { fallback: object } ? K : never }[keyof F];
/** The type of `t.object(fields)`. */
export type ObjectOf<F extends Record<string, Schema<unknown>>> = {
  [K in Exclude<keyof F, OptionalKeys<F>>]: SchemaType<F[K]>;
} & { [K in OptionalKeys<F>]?: SchemaType<F[K]> };

// ------------------------------------------------------------------------------------------------
// Where an input comes from.

const SOURCE: unique symbol = Symbol.for("ax-sdk.input-source");

/** An input read from the run's param `name`. */
export interface ParamInput<T> {
  readonly [SOURCE]: "param";
  readonly name: string | undefined;
  readonly decoder: Decoder<T>;
  readonly fallback: { value: T } | undefined;
}

/** An input read from output `key` of the direct upstream task `task`. */
export interface UpstreamInput<T> {
  readonly [SOURCE]: "upstream";
  readonly task: string;
  readonly key: string;
  readonly decoder: Decoder<T>;
}

/** What a task's `inputs` maps each name to. */
export type Input<T = unknown> = Schema<T> | ParamInput<T> | UpstreamInput<T>;
export type InputSpec = Record<string, Input<any>>;

/** The value type of one input. */
export type InputType<I> =
  I extends ParamInput<infer T> ? T : I extends UpstreamInput<infer T> ? T : I extends Schema<infer T> ? T : never;

/** The object a task function receives: each input's value by name. */
export type Inputs<S extends InputSpec> = { [K in keyof S]: InputType<S[K]> };

/** Anything that names a task and says what it returns (a task definition). */
export interface TaskRef<R = unknown> {
  readonly name: string;
  /** Type-level only: what the task's function returns. */
  readonly __returns?: R;
}

/**
 * The run's param `name` (this input's own name when omitted), checked by `schema` (text as it
 * is when omitted); `fallback` when the run has none (without one, a run without it fails).
 */
export function param(name?: string): ParamInput<string>;
export function param<T>(name: string | undefined, schema: Schema<T>): ParamInput<T>;
export function param<T>(name: string | undefined, schema: Schema<T>, fallback: T): ParamInput<T>;
export function param<T>(name?: string, schema?: Schema<T>, ...rest: [T?]): ParamInput<T> {
  return {
    [SOURCE]: "param",
    name,
    decoder: (schema ? asDecoder(schema) : t.string()) as Decoder<T>,
    fallback: rest.length > 0 ? { value: rest[0] as T } : undefined,
  };
}

/**
 * Output `key` ("return": what its function returned) of direct upstream `task`: a task
 * definition (the value typed by what its function returns, unchecked) or a task's name, checked
 * by `schema` (any JSON value when omitted).
 */
export function upstream<R>(task: TaskRef<R>): UpstreamInput<Awaited<R>>;
export function upstream<T>(task: TaskRef<unknown> | string, key: string, schema: Schema<T>): UpstreamInput<T>;
export function upstream<T>(task: TaskRef<unknown> | string, schema: Schema<T>): UpstreamInput<T>;
export function upstream(task: TaskRef<unknown> | string, key?: string): UpstreamInput<unknown>;
export function upstream<T>(
  task: TaskRef<unknown> | string,
  keyOrSchema?: string | Schema<T>,
  schema?: Schema<T>,
): UpstreamInput<T> {
  const name = typeof task === "string" ? task : task.name;
  const key = typeof keyOrSchema === "string" ? keyOrSchema : "return";
  const chosen = typeof keyOrSchema === "string" || keyOrSchema === undefined ? schema : keyOrSchema;
  return {
    [SOURCE]: "upstream",
    task: name,
    key,
    decoder: (chosen ? asDecoder(chosen) : t.json()) as Decoder<T>,
  };
}

export function isParamInput(value: unknown): value is ParamInput<unknown> {
  return typeof value === "object" && value !== null && (value as { [SOURCE]?: unknown })[SOURCE] === "param";
}

export function isUpstreamInput(value: unknown): value is UpstreamInput<unknown> {
  return typeof value === "object" && value !== null && (value as { [SOURCE]?: unknown })[SOURCE] === "upstream";
}

/** The value of environment text read by `decoder`: as it is for text, else JSON first. */
export function fromText<T>(text: string, decoder: Decoder<T>, alwaysJson = false): T {
  if (decoder.text && !alwaysJson) return decoder.decode(text);
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    value = text;
  }
  return decoder.decode(value);
}

function convert<T>(what: string, text: string, decoder: Decoder<T>, alwaysJson: boolean): T {
  try {
    return fromText(text, decoder, alwaysJson);
  } catch (error) {
    if (!(error instanceof ConversionError)) throw error;
    const shownText = text.length <= 60 ? text : `${text.slice(0, 59)}…`;
    throw new InputError(`${what} is ${JSON.stringify(shownText)}, not ${decoder.expected}: ${error.message}`);
  }
}

function readUpstream<T>(input: string, task: string, key: string, decoder: Decoder<T>, env: Env): T {
  const text = env[upstreamEnvName(task, key)];
  const what = `input ${input}: output ${key} of task ${task}`;
  if (text === undefined) {
    throw new InputError(
      `${what} was not passed on (is ${task} a direct upstream, and did it ${
        key === "return" ? "return a value" : `write ${key}`
      }?)`,
    );
  }
  return convert(what, text, decoder, key === "return");
}

type Env = Readonly<Record<string, string | undefined>>;

/** The value of each input of `spec`, read from the attempt's environment. */
export function bindInputs<S extends InputSpec>(spec: S, env: Env): Inputs<S> {
  const out: Record<string, unknown> = {};
  for (const [name, input] of Object.entries(spec)) {
    if (isUpstreamInput(input)) {
      out[name] = readUpstream(name, input.task, input.key, input.decoder, env);
    } else if (isParamInput(input)) {
      const paramName = input.name ?? name;
      const text = env[paramEnvName(paramName)];
      if (text === undefined) {
        if (input.fallback) {
          out[name] = input.fallback.value;
          continue;
        }
        if (input.decoder.fallback) {
          out[name] = input.decoder.fallback.value;
          continue;
        }
        throw new InputError(`input ${name}: the run has no param ${paramName}`);
      }
      out[name] = convert(`input ${name}: param ${paramName}`, text, input.decoder, false);
    } else {
      const decoder = asDecoder(input as Schema<unknown>);
      if (env[upstreamEnvName(name, "return")] !== undefined) {
        out[name] = readUpstream(name, name, "return", decoder, env);
      } else if (env[paramEnvName(name)] !== undefined) {
        out[name] = convert(`input ${name}: param ${name}`, env[paramEnvName(name)]!, decoder, false);
      } else if (decoder.fallback) {
        out[name] = decoder.fallback.value;
      } else {
        throw new InputError(
          `input ${name}: no direct upstream task ${name} passed on a value and the run has no param ${name} ` +
            `(name an upstream task or a param, or read another with upstream(TASK, KEY) or param(NAME))`,
        );
      }
    }
  }
  return out as Inputs<S>;
}
