/**
 * The worker's guardian: kills the attempts' process groups when the worker dies.
 *
 * The worker starts it (in a session of its own) with a pipe on its stdin and writes `+GROUP`
 * when an attempt's process group starts, `-GROUP` when it ends, and `exit` when the worker stops
 * cleanly. When the pipe closes without `exit` (the worker died, even of SIGKILL), every group
 * still listed gets SIGKILL: a task dies with its worker, as worker.proto asks.
 */

// The worker's own signals (a terminal's Ctrl-C, a SIGTERM to its group) are not the guardian's.
process.on("SIGINT", () => {});
process.on("SIGTERM", () => {});

const groups = new Set<number>();
let carry = "";
let done = false;

process.stdin.setEncoding("ascii");
process.stdin.on("data", (chunk: string) => {
  carry += chunk;
  let newline = carry.indexOf("\n");
  while (newline >= 0) {
    const word = carry.slice(0, newline).trim();
    carry = carry.slice(newline + 1);
    if (word === "exit") {
      done = true;
      process.exit(0);
    }
    if (/^[+-][0-9]+$/.test(word)) {
      const group = Number(word.slice(1));
      if (word[0] === "+") groups.add(group);
      else groups.delete(group);
    }
    newline = carry.indexOf("\n");
  }
});

function killLeft(): void {
  if (done) return;
  done = true;
  for (const group of groups) {
    if (group <= 1) continue;
    try {
      process.kill(-group, "SIGKILL");
    } catch {
      // Already gone.
    }
  }
  process.exit(0);
}

process.stdin.on("end", killLeft);
process.stdin.on("error", killLeft);
process.stdin.on("close", killLeft);
