/**
 * What the tests share: hang guards, waiting for a condition, process checks, and the scheduler
 * the scheduler tests run against.
 *
 * The scheduler is the one at AX_TEST_SCHEDULER (`http://127.0.0.1:PORT`); the Rust test
 * `integration-tests/tests/typescript_sdk.rs` starts one on a fresh store and runs this suite
 * with it. Without AX_TEST_SCHEDULER the scheduler tests are skipped, saying why, except under
 * CI=true, where they fail. AX_TEST_OUT, when set, is a directory where the suite writes what it
 * did (facts.json) for the Rust test to check through the scheduler's API on its own.
 * AX_TEST_TOKEN and AX_TEST_WORKER_TOKEN, when set, are the bearer tokens of the suite's client
 * and of its worker.
 */

import { existsSync, mkdirSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { fileURLToPath } from "node:url";

/** A hang guard for waits, never a measurement. */
export const GUARD_MS = 60_000;

/** The repository's root (this file is at sdk/typescript/dist/test/helpers.js once built). */
export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../../../..");
/** sdk/typescript. */
export const SDK = resolve(REPO, "sdk/typescript");

/** Waits until `predicate` gives a truthy value, and returns it; fails after the guard. */
export async function waitFor<T>(predicate: () => T | Promise<T>, what: string, guardMs = GUARD_MS): Promise<NonNullable<T>> {
  const deadline = Date.now() + guardMs;
  for (;;) {
    const value = await predicate();
    if (value) return value as NonNullable<T>;
    if (Date.now() > deadline) throw new Error(`waited ${guardMs} ms for ${what}`);
    await sleep(25);
  }
}

/** Whether the process runs (a zombie does not). */
export function pidAlive(pid: number): boolean {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return false;
  }
  const state = stat.slice(stat.lastIndexOf(")") + 1).trim().split(/\s+/)[0];
  return state !== "Z" && state !== "X" && state !== "x";
}

/** The pid a task wrote to `path`, once it is there. */
export async function readPid(path: string): Promise<number> {
  const text = await waitFor(() => existsSync(path) && readFileSync(path, "utf8").trim(), `the pid in ${path}`);
  return Number(text);
}

/** The scheduler of AX_TEST_SCHEDULER, or why the scheduler tests are skipped (a failure under CI=true). */
export function schedulerAddress(): { address: string; skip: false } | { address: undefined; skip: string } {
  const address = process.env.AX_TEST_SCHEDULER;
  if (address) return { address, skip: false };
  if (process.env.CI === "true") {
    throw new Error("CI=true but AX_TEST_SCHEDULER is not set: the SDK's scheduler tests cannot be skipped");
  }
  return {
    address: undefined,
    skip: "AX_TEST_SCHEDULER is not set (integration-tests/tests/typescript_sdk.rs runs this suite with a scheduler)",
  };
}

/** Where the suite writes its records: AX_TEST_OUT, else a temporary directory. */
export function outDir(): string {
  const configured = process.env.AX_TEST_OUT;
  if (configured) {
    mkdirSync(configured, { recursive: true });
    return configured;
  }
  return mkdtempSync(join(tmpdir(), "ax-ts-sdk-tests-"));
}

export function clientToken(): string | undefined {
  return process.env.AX_TEST_TOKEN || undefined;
}

export function workerToken(): string | undefined {
  return process.env.AX_TEST_WORKER_TOKEN || undefined;
}
