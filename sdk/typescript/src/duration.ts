/**
 * Durations as people write them, read by the grammar of ax's Rust binaries
 * (`scheduler/core/src/duration.rs`) with the same error text; tested against the same table of
 * forms (`scheduler/core/tests/durations.json`) as the Rust parser and the Python SDK.
 *
 *     duration = number | part { [spaces] part }   a bare number is seconds
 *     part     = number [spaces] unit              units from the largest, each at most once
 *     number   = ["+"] digits ["." [digits]] | ["+"] "." digits
 *     unit     = "d" | "h" | "m" | "s" | "ms"      a day is 24 hours
 */

const NANOS_PER_SEC = 1_000_000_000n;
const MAX_NANOS = (2n ** 64n - 1n) * 1_000_000n + 999_999n;
const U128 = 2n ** 128n - 1n;
const UNITS: ReadonlyArray<readonly [string, bigint]> = [
  ["d", 86_400n * NANOS_PER_SEC],
  ["h", 3_600n * NANOS_PER_SEC],
  ["m", 60n * NANOS_PER_SEC],
  ["s", NANOS_PER_SEC],
  ["ms", 1_000_000n],
];
const NUMBER = /^\+?(?:([0-9]+)(?:\.([0-9]*))?|\.([0-9]+))/;
const LETTERS = /^[A-Za-z]*/;
// Python's str.strip(): ASCII whitespace and the other Unicode spaces alike.
const SPACES = /^\s+|\s+$/g;

/** A text that is not a duration; the message quotes it. */
export class DurationError extends Error {
  override name = "DurationError";
}

function invalid(text: string): DurationError {
  return new DurationError(
    `invalid duration "${text}": expected a form like 500ms, 1.5s, 10m, 2h, 1h30m, 90d or a number of seconds`,
  );
}

function tooLarge(text: string): DurationError {
  return new DurationError(`duration "${text}" is too large`);
}

/** The duration `text` reads as, in nanoseconds; DurationError when it is not one. */
export function parseDurationNs(text: string): bigint {
  let rest = text.replace(SPACES, "");
  if (!rest) throw invalid(text);
  let total = 0n;
  let nextUnit = 0;
  let first = true;
  while (rest) {
    const number = NUMBER.exec(rest);
    if (!number) throw invalid(text);
    const whole = number[1] ?? "";
    let fraction = (number[1] !== undefined ? number[2] : number[3]) ?? "";
    const after = rest.slice(number[0].length).replace(/^\s+/, "");
    const letters = (LETTERS.exec(after) ?? [""])[0];
    let unitNanos: bigint;
    if (!letters) {
      if (!(first && !after)) throw invalid(text);
      unitNanos = NANOS_PER_SEC;
      rest = "";
    } else {
      const names = UNITS.slice(nextUnit).map(([name]) => name);
      const at = names.indexOf(letters);
      if (at < 0) throw invalid(text);
      nextUnit += at + 1;
      unitNanos = UNITS[nextUnit - 1]![1];
      rest = after.slice(letters.length).replace(/^\s+/, "");
    }
    // Digits past the 18th are below a nanosecond for every unit.
    fraction = fraction.slice(0, 18);
    let nanos = BigInt(whole || "0") * unitNanos;
    if (fraction) nanos += (BigInt(fraction) * unitNanos) / 10n ** BigInt(fraction.length);
    if (nanos > U128) throw tooLarge(text);
    total += nanos;
    if (total > U128) throw tooLarge(text);
    first = false;
  }
  if (total > MAX_NANOS) throw tooLarge(text);
  return total;
}

/** The duration `text` reads as, in milliseconds (fractions kept); DurationError when it is not one. */
export function parseDurationMs(text: string): number {
  return Number(parseDurationNs(text)) / 1e6;
}
