#!/usr/bin/env node
/**
 * `ax-node-worker`: a worker serving shell tasks and the task functions of `--module` files.
 *
 *     ax-node-worker --scheduler http://sched-1:7070,http://sched-2:7070 --id etl-1 \
 *       --label sdk=node --module dist/tasks.js
 *
 * Exit codes: 0 stopped (SIGTERM or SIGINT drains; a second stops at once), 2 a setting is wrong,
 * 3 a scheduler refused the worker's credentials.
 */

import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

import { ConfigError } from "./connection.js";
import { DurationError, parseDurationMs } from "./duration.js";
import { isTasks, registriesCreated, type Tasks } from "./functions.js";
import { stderrLogger, type Level } from "./log.js";
import { Worker, WorkerRefused } from "./worker.js";

const USAGE = `Usage: ax-node-worker [OPTIONS]

An ax worker in Node: runs shell tasks and the task functions of --module files.

Options:
  --scheduler ADDRESS        scheduler address (http://host:port or https://host:port); repeat or
                             comma-separate; env AX_SCHEDULER; default http://127.0.0.1:7070
  --id ID                    worker id, stable across restarts and unique among live workers;
                             default <host name>-<pid>
  --label KEY=VALUE          a label; repeatable
  --capacity N               attempts run at once (default 20)
  --module FILE              a JavaScript module whose task registries (new Tasks(import.meta.url))
                             are served; repeatable
  --node-arg ARG             an argument for node when it runs a task function; repeatable
  --heartbeat-interval D     (default 5s)
  --task-heartbeat-interval D  (default 30s)
  --kill-grace D             SIGTERM to SIGKILL (default 5s)
  --self-fence-after D       a duration, or "off" (default 10s)
  --token TOKEN              bearer token (env AX_TOKEN)
  --token-file FILE          file holding the bearer token (env AX_TOKEN_FILE)
  --tls-ca FILE              CA file for https:// addresses (env AX_TLS_CA)
  --tls-cert FILE            client certificate (env AX_TLS_CERT)
  --tls-key FILE             the client certificate's key (env AX_TLS_KEY)
  --log-level LEVEL          debug, info, warn or error (env AX_LOG_LEVEL; default info)
  -h, --help                 this text
`;

function duration(flag: string, text: string | undefined, fallback: number): number {
  if (text === undefined) return fallback;
  try {
    return parseDurationMs(text);
  } catch (error) {
    if (error instanceof DurationError) throw new ConfigError(`--${flag}: ${error.message}`);
    throw error;
  }
}

async function loadModule(path: string): Promise<Tasks[]> {
  const url = pathToFileURL(resolve(path)).href;
  const before = new Set(registriesCreated());
  let imported: Record<string, unknown>;
  try {
    imported = (await import(url)) as Record<string, unknown>;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ERR_MODULE_NOT_FOUND" && String((error as Error).message).includes(resolve(path))) {
      throw new ConfigError(`--module ${path}: no such file`);
    }
    throw error;
  }
  const found = new Set<Tasks>();
  for (const registry of registriesCreated()) {
    if (!before.has(registry)) found.add(registry);
  }
  for (const value of Object.values(imported)) if (isTasks(value)) found.add(value);
  for (const registry of found) registry.module ??= url;
  if (found.size === 0) throw new ConfigError(`--module ${path}: it makes no task registry (new Tasks(import.meta.url))`);
  return [...found];
}

async function main(argv: string[]): Promise<number> {
  const env = process.env;
  let worker: Worker;
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        scheduler: { type: "string", multiple: true },
        id: { type: "string" },
        label: { type: "string", multiple: true },
        capacity: { type: "string" },
        module: { type: "string", multiple: true },
        "node-arg": { type: "string", multiple: true },
        "heartbeat-interval": { type: "string" },
        "task-heartbeat-interval": { type: "string" },
        "kill-grace": { type: "string" },
        "self-fence-after": { type: "string" },
        token: { type: "string" },
        "token-file": { type: "string" },
        "tls-ca": { type: "string" },
        "tls-cert": { type: "string" },
        "tls-key": { type: "string" },
        "log-level": { type: "string" },
        help: { type: "boolean", short: "h" },
      },
      strict: true,
    });
    if (values.help) {
      process.stdout.write(USAGE);
      return 0;
    }
    const labels: Record<string, string> = {};
    for (const label of values.label ?? []) {
      const eq = label.indexOf("=");
      if (eq <= 0) throw new ConfigError(`--label ${JSON.stringify(label)} is not key=value`);
      labels[label.slice(0, eq)] = label.slice(eq + 1);
    }
    const capacity = values.capacity === undefined ? 20 : Number(values.capacity);
    if (!Number.isInteger(capacity)) throw new ConfigError(`--capacity ${values.capacity} is not a whole number`);
    const fenceText = values["self-fence-after"]?.trim();
    const fence = fenceText === "off" ? null : duration("self-fence-after", fenceText, 10_000);
    const registries: Tasks[] = [];
    for (const path of values.module ?? []) registries.push(...(await loadModule(path)));
    const token = values.token ?? (values["token-file"] ? undefined : env.AX_TOKEN || undefined);
    const tokenFile = values["token-file"] ?? (token ? undefined : env.AX_TOKEN_FILE || undefined);
    const level = values["log-level"] ?? env.AX_LOG_LEVEL;
    worker = new Worker({
      scheduler: (values.scheduler ?? []).join(",") || env.AX_SCHEDULER || "http://127.0.0.1:7070",
      id: values.id,
      labels,
      capacity,
      tasks: registries,
      token,
      tokenFile,
      tlsCa: values["tls-ca"] ?? (env.AX_TLS_CA || undefined),
      tlsCert: values["tls-cert"] ?? (env.AX_TLS_CERT || undefined),
      tlsKey: values["tls-key"] ?? (env.AX_TLS_KEY || undefined),
      heartbeatIntervalMs: duration("heartbeat-interval", values["heartbeat-interval"], 5000) || 5000,
      taskHeartbeatIntervalMs: duration("task-heartbeat-interval", values["task-heartbeat-interval"], 30_000) || 30_000,
      killGraceMs: duration("kill-grace", values["kill-grace"], 5000),
      selfFenceAfterMs: fence,
      nodeArgs: values["node-arg"] ?? [],
      logger: stderrLogger("ax-sdk.worker", level as Level | undefined),
    });
  } catch (error) {
    if (error instanceof ConfigError || (error as NodeJS.ErrnoException).code?.startsWith("ERR_PARSE_ARGS")) {
      process.stderr.write(`ax-node-worker: ${(error as Error).message}\n`);
      return 2;
    }
    throw error;
  }
  const log = stderrLogger("ax-sdk.worker");
  log.info(
    `worker ${worker.id} starting: ${worker.endpoints.map((e) => e.address).join(", ")}; functions: ${
      worker.functionNames().join(", ") || "none"
    }`,
  );
  try {
    await worker.run();
  } catch (error) {
    if (error instanceof WorkerRefused) {
      process.stderr.write(`ax-node-worker: ${error.message}\n`);
      return 3;
    }
    throw error;
  }
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error) => {
    process.stderr.write(`ax-node-worker: ${(error as Error).stack ?? error}\n`);
    process.exit(1);
  },
);
