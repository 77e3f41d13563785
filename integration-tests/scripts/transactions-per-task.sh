#!/usr/bin/env bash
# Counts what five runs of a three-task chain (`true` each, 15 tasks) cost a MySQL/MariaDB
# store: transactions, statements and dispatcher claims, from the server's general log. The
# counts do not depend on how busy the machine is, so two builds compare on any machine.
#
#   integration-tests/scripts/transactions-per-task.sh [BIN_DIR]
#
# BIN_DIR holds ax-scheduler, ax-worker and axctl (default target/release). Needs the `mysql`
# client, root on 127.0.0.1:3306 (it switches the general log on and off) and the server's log
# file readable here; nothing else may use the server meanwhile (its statements would count).
set -euo pipefail
BIN=${1:-target/release}
DB=ax_tx_per_task_$$
PORT=${AX_PORT:-7611}
DIR=$(mktemp -d)
sql() { mysql -h127.0.0.1 -uroot -N -e "$1"; }
LOG=$(sql "SELECT @@general_log_file")
case "$LOG" in /*) ;; *) LOG="$(sql 'SELECT @@datadir')$LOG" ;; esac
sql "CREATE DATABASE $DB"
"$BIN/ax-scheduler" --listen "127.0.0.1:$PORT" --store "mysql://root@127.0.0.1:3306/$DB" \
  --node-id tx1 >"$DIR/scheduler.log" 2>&1 &
SCHEDULER=$!
trap 'kill $SCHEDULER ${WORKER:-} 2>/dev/null; sql "DROP DATABASE IF EXISTS $DB"; rm -rf "$DIR"' EXIT
sleep 3
"$BIN/ax-worker" --scheduler "http://127.0.0.1:$PORT" --id tx-w1 --capacity 8 >"$DIR/worker.log" 2>&1 &
WORKER=$!
sleep 2
export AX_SERVER="http://127.0.0.1:$PORT"
printf 'name: chain3\ntasks:\n  - name: a\n    command: "true"\n  - name: b\n    command: "true"\n    upstream: [a]\n  - name: c\n    command: "true"\n    upstream: [b]\n' >"$DIR/chain3.yaml"
"$BIN/axctl" apply -f "$DIR/chain3.yaml" >/dev/null
# A first run warms the caches; the five after it are counted.
"$BIN/axctl" trigger chain3 --wait >/dev/null
# The server opens the log afresh when it is switched on.
rm -f "$LOG"
sql "SET GLOBAL general_log = 1"
for _ in 1 2 3 4 5; do "$BIN/axctl" trigger chain3 --wait >/dev/null; sleep 0.7; done
sql "SET GLOBAL general_log = 0"
statements=$(grep -cE $' (Query|Execute)\t' "$LOG" || true)
commits=$(grep -cE $' Query\tCOMMIT' "$LOG" || true)
claims=$(grep -cE 'UPDATE task_instance SET held_slots' "$LOG" || true)
echo "five runs of a 3-task chain: $commits transactions, $statements statements, $claims claims"
