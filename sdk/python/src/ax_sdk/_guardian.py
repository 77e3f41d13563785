"""The worker's guardian: kills the attempts' process groups when the worker dies.

The worker starts it with a pipe on its stdin and writes `+GROUP` when an attempt's process group
starts, `-GROUP` when it ends, and `exit` when the worker stops cleanly. When the pipe closes
without `exit` (the worker died, even of SIGKILL), every group still listed gets SIGKILL: a task
dies with its worker, as worker.proto asks.
"""

import os
import signal
import sys


def main() -> int:
    # The worker's own signals (a terminal's Ctrl-C, a SIGTERM to its group) are not ours.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    groups = set()
    for line in sys.stdin.buffer:
        word = line.strip().decode("ascii", "replace")
        if word == "exit":
            return 0
        if len(word) > 1 and word[1:].isdigit():
            group = int(word[1:])
            if word[0] == "+":
                groups.add(group)
            elif word[0] == "-":
                groups.discard(group)
    for group in groups:
        try:
            os.killpg(group, signal.SIGKILL)
        except OSError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
