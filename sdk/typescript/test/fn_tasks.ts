/** Task functions of the tests, on a registry the test workers serve. */

import { writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";

import { Tasks, t, param, upstream } from "../src/index.js";

export const tasks = new Tasks(import.meta.url);

export const greet = tasks.task("greet", (ctx) => {
  console.log(`hello ${ctx.args[0]} from ${ctx.params.who}`);
  console.log(`run ${ctx.runId} task ${ctx.task} attempt ${ctx.attempt} of ${ctx.workflow}`);
  console.log(`instance ${ctx.instanceId} env ${ctx.env.GREETING_ENV}`);
});

export const exitWith = tasks.task("exit_with", (ctx) => {
  console.log(`exiting with ${ctx.args[0]}`);
  process.exit(Number(ctx.args[0]));
});

export const boom = tasks.task("boom", async (ctx) => {
  console.log("about to throw");
  throw new RangeError(`boom: ${ctx.params.who} is not welcome`);
});

/** Writes its pid where its first argument says, then waits until killed (ignoring the abort). */
export const sleeper = tasks.task("sleeper", async (ctx) => {
  writeFileSync(ctx.args[0]!, String(process.pid));
  console.log("sleeping");
  await sleep(300_000);
});

/** Returns its outputs: an object, one output per key. */
export const countRows = tasks.task("count_rows", () => ({ rows: 3, names: ["a", "b"], note: "two\nlines" }));

/** Reads the outputs of its upstream `count` through the context. */
export const useRows = tasks.task("use_rows", (ctx) => {
  console.log(`rows=${ctx.output("count", "rows")} names=${JSON.stringify(ctx.outputJson("count", "names"))}`);
  console.log(ctx.output("count", "note"));
  return { doubled: (ctx.outputJson("count", "rows") as number) * 2 };
});

/** Takes its upstream's outputs as typed inputs; returns a list (the output `return`). */
export const useTyped = tasks.task("use_typed", {
  inputs: {
    rows: upstream("count", "rows", t.integer()),
    names: upstream("count", "names", t.array(t.string())),
  },
  run({ rows, names }) {
    console.log(`typed rows+1=${rows + 1} names=${names.join(",")}`);
    return [rows, ...names];
  },
});

/** Takes what its upstream `typed` returned, by the upstream's name. */
export const byName = tasks.task("by_name", {
  inputs: { typed: t.array(t.json<number | string>()), missing: t.optional(t.string(), "default") },
  run({ typed, missing }, ctx) {
    console.log(`from typed: ${JSON.stringify(typed)} (${Array.isArray(typed) ? "array" : typeof typed}), missing=${missing}, task ${ctx.task}`);
  },
});

/** On a cancel, takes 300 ms to clean up (within the test worker's kill grace), then writes where its first argument says. */
export const slowToStop = tasks.task("slow_to_stop", async (ctx) => {
  console.log("working");
  try {
    await sleep(300_000, undefined, { signal: ctx.signal });
  } catch (error) {
    console.log("cancelled: cleaning up");
    await sleep(300);
    writeFileSync(ctx.args[0]!, "cleaned up");
    throw error;
  }
});

/** Params arrive typed; the return value is the outputs. */
export const typedParams = tasks.task("typed_params", {
  inputs: {
    n: t.integer(),
    flag: t.boolean(),
    window: t.object({ days: t.integer() }),
    names: t.array(t.string()),
    note: param("note", t.string(), "none"),
  },
  run({ n, flag, window, names, note }) {
    console.log(`n+1=${n + 1} flag=${flag} window=${JSON.stringify(window)} names=${names.join("|")} note=${note}`);
    return { n_squared: n * n, flag: !flag };
  },
});

export const asyncFetch = tasks.task("async_fetch", {
  inputs: { n: t.integer() },
  async run({ n }) {
    await sleep(50);
    console.log(`fetched ${n}`);
    return Array.from({ length: n }, (_, i) => i);
  },
});
