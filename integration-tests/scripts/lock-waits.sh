#!/usr/bin/env bash
# Who waits for whom in a MySQL/MariaDB store while a load runs beside it: every INTERVAL
# seconds (default 0.1) for DURATION seconds (default 60) it samples the server's lock waits
# (information_schema.innodb_lock_waits joined with innodb_trx), then prints each pair of
# statements (the waiting one, and what the blocking transaction runs now) with how many samples
# saw it and the longest wait. Start it beside the load, e.g. during `ax-bench --workload W9
# --nodes 3 --store mysql://root@127.0.0.1:3306`.
#
#   integration-tests/scripts/lock-waits.sh [DURATION] [INTERVAL]
#
# Needs the `mysql` client, root on 127.0.0.1:3306, and python3. A sample sees the waits of
# that instant only: a count is how often a pair was caught, not how many waits there were
# (the server's Innodb_row_lock_waits counts those).
set -euo pipefail
DURATION=${1:-60}
INTERVAL=${2:-0.1}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
QUERY="SELECT r.trx_wait_started, TIMESTAMPDIFF(MICROSECOND, r.trx_wait_started, NOW(6)),
  REPLACE(REPLACE(LEFT(r.trx_query, 160), '\n', ' '), '\t', ' '),
  REPLACE(REPLACE(LEFT(IFNULL(b.trx_query, CONCAT('(no statement: ', IFNULL(p.command, '?'), ' ',
    IFNULL(p.state, ''), ', trx ', b.trx_state, ' ', IFNULL(b.trx_operation_state, ''), ')')),
    160), '\n', ' '), '\t', ' ')
  FROM information_schema.innodb_lock_waits w
  JOIN information_schema.innodb_trx r ON r.trx_id = w.requesting_trx_id
  JOIN information_schema.innodb_trx b ON b.trx_id = w.blocking_trx_id
  LEFT JOIN information_schema.processlist p ON p.id = b.trx_mysql_thread_id"
END=$(($(date +%s) + DURATION))
SAMPLES=0
while [ "$(date +%s)" -lt "$END" ]; do
  mysql -h127.0.0.1 -uroot -N -B -e "$QUERY" >>"$OUT" 2>/dev/null || true
  SAMPLES=$((SAMPLES + 1))
  sleep "$INTERVAL"
done
python3 - "$OUT" "$SAMPLES" <<'EOF'
import collections, re, sys

path, samples = sys.argv[1], int(sys.argv[2])
def shape(query):
    # Literals and IN lists vary per call: the statement's shape is what repeats.
    query = re.sub(r"'[^']*'", "?", query)
    query = re.sub(r"\b\d+\b", "?", query)
    return re.sub(r"(\?\s*,\s*)+\?", "?..", query)

pairs = collections.defaultdict(lambda: [0, 0.0])
for line in open(path):
    parts = line.rstrip("\n").split("\t")
    if len(parts) != 4:
        continue
    _, waited_us, waiting, blocking = parts
    pair = pairs[(shape(waiting), shape(blocking))]
    pair[0] += 1
    pair[1] = max(pair[1], int(waited_us or 0) / 1000.0)
print(f"{samples} samples; {sum(p[0] for p in pairs.values())} waits caught")
for (waiting, blocking), (seen, longest) in sorted(pairs.items(), key=lambda kv: -kv[1][0]):
    print(f"\n{seen} samples, longest wait {longest:.0f} ms")
    print(f"  waiting:  {waiting}")
    print(f"  blocking: {blocking}")
EOF
