#!/usr/bin/env bash
# Where a MySQL/MariaDB store spends its time on a W1-shaped run: N independent `true` tasks in
# one run, on one node and one worker of 64. The server's slow log (every statement, with
# long_query_time 0) gives each statement shape's calls, rows examined and time; the table is
# sorted by time. Rows examined and calls per task do not depend on how busy the machine is;
# times do, so compare those of one sitting.
#
#   integration-tests/scripts/statement-profile.sh [BIN_DIR] [TASKS]
#
# BIN_DIR holds ax-scheduler, ax-worker and axctl (default target/release); TASKS defaults to
# 3000. Needs the `mysql` client, root on 127.0.0.1:3306 (it switches the slow log on and off),
# python3, and the server's slow log readable here.
set -euo pipefail
BIN=${1:-target/release}
TASKS=${2:-3000}
DB=ax_profile_$$
PORT=${AX_PORT:-7612}
DIR=$(mktemp -d)
sql() { mysql -h127.0.0.1 -uroot -N -e "$1"; }
LOG=$(sql "SELECT @@slow_query_log_file")
case "$LOG" in /*) ;; *) LOG="$(sql 'SELECT @@datadir')$LOG" ;; esac
OLD_LQT=$(sql "SELECT @@long_query_time")
sql "CREATE DATABASE $DB"
# A session takes the slow log's settings when it connects: on before the node opens its pool.
sql "SET GLOBAL long_query_time = 0; SET GLOBAL slow_query_log = 1"
"$BIN/ax-scheduler" --listen "127.0.0.1:$PORT" --store "mysql://root@127.0.0.1:3306/$DB" \
  --node-id profile1 >"$DIR/scheduler.log" 2>&1 &
SCHEDULER=$!
cleanup() {
  kill $SCHEDULER ${WORKER:-} 2>/dev/null || true
  sql "SET GLOBAL slow_query_log = 0; SET GLOBAL long_query_time = $OLD_LQT" || true
  sql "DROP DATABASE IF EXISTS $DB" || true
  rm -rf "$DIR"
}
trap cleanup EXIT
sleep 3
"$BIN/ax-worker" --scheduler "http://127.0.0.1:$PORT" --id profile-w1 --capacity 64 \
  --state-dir "$DIR/state" >"$DIR/worker.log" 2>&1 &
WORKER=$!
sleep 2
export AX_SERVER="http://127.0.0.1:$PORT"
{
  echo "name: profile-w1"
  echo "tasks:"
  for i in $(seq 1 "$TASKS"); do printf '  - name: t%05d\n    command: "true"\n' "$i"; done
} >"$DIR/w1.yaml"
"$BIN/axctl" apply -f "$DIR/w1.yaml" >/dev/null 2>&1
# Only the run is profiled, not the apply: the log is read from its size now.
FROM=$(stat -c %s "$LOG" 2>/dev/null || echo 0)
"$BIN/axctl" trigger profile-w1 --wait >/dev/null 2>&1
sql "SET GLOBAL slow_query_log = 0"
python3 - "$LOG" "$DB" "$TASKS" "$FROM" <<'PY'
import collections, re, sys
log, db, tasks, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
with open(log, "rb") as f:
    f.seek(start)
    text = f.read().decode(errors="replace")
shapes = collections.defaultdict(lambda: [0, 0, 0.0])
for entry in re.split(r"\n(?=# User@Host)", text):
    schema = re.search(r"Schema: (\S+)", entry)
    if not schema or schema.group(1) != db:
        continue
    rows = re.search(r"Rows_examined: (\d+)", entry)
    took = re.search(r"Query_time: ([\d.]+)", entry)
    body = " ".join(
        line for line in entry.split("\n")
        if line and not line.startswith(("#", "SET timestamp", "use "))
    )
    shape = shapes[re.sub(r"\d+", "N", body)[:90]]
    shape[0] += 1
    shape[1] += int(rows.group(1)) if rows else 0
    shape[2] += float(took.group(1)) if took else 0.0
calls = sum(s[0] for s in shapes.values())
rows = sum(s[1] for s in shapes.values())
took = sum(s[2] for s in shapes.values())
print(f"{tasks} tasks: {calls / tasks:.2f} statements, {rows / tasks:.1f} rows examined, "
      f"{took * 1e3 / tasks:.3f} ms of statement time per task")
print(f"{'calls':>7} {'rows':>9} {'ms':>8}  statement")
for shape, (n, r, t) in sorted(shapes.items(), key=lambda kv: -kv[1][2])[:15]:
    print(f"{n:7d} {r:9d} {t * 1e3:8.1f}  {shape}")
PY
