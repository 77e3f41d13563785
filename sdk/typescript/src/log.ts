/**
 * The SDK's logging: one line per event on stderr, `TIME LEVEL NAME: message`, at or above a
 * level (AX_LOG_LEVEL: debug, info, warn, error; info by default). A program that logs its own
 * way gives the worker or the client a `Logger` of its own.
 */

export interface Logger {
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}

const LEVELS = ["debug", "info", "warn", "error"] as const;
export type Level = (typeof LEVELS)[number];

function levelOf(text: string | undefined): Level {
  const lower = (text ?? "").trim().toLowerCase();
  if (lower === "warning") return "warn";
  return (LEVELS as readonly string[]).includes(lower) ? (lower as Level) : "info";
}

/** A logger writing to stderr from `level` up (default: AX_LOG_LEVEL, else info). */
export function stderrLogger(name: string, level?: Level): Logger {
  const threshold = LEVELS.indexOf(level ?? levelOf(process.env.AX_LOG_LEVEL));
  const write = (at: Level, message: string) => {
    if (LEVELS.indexOf(at) < threshold) return;
    process.stderr.write(`${new Date().toISOString()} ${at.toUpperCase()} ${name}: ${message}\n`);
  };
  return {
    debug: (m) => write("debug", m),
    info: (m) => write("info", m),
    warn: (m) => write("warn", m),
    error: (m) => write("error", m),
  };
}

/** A logger that drops everything. */
export const silentLogger: Logger = { debug() {}, info() {}, warn() {}, error() {} };
