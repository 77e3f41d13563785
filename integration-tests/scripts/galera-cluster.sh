#!/usr/bin/env bash
# A three-node MariaDB Galera cluster on loopback, beside the machine's own MariaDB: each node
# has its own data directory under DIR and its own ports (SQL 4401–4403, group communication
# 4571–4573, IST 4581–4583, SST 4591–4593). Root connects over TCP without a password, as on
# the CI server: mysql://root@127.0.0.1:4401 (4402, 4403).
#
#   integration-tests/scripts/galera-cluster.sh start [DIR]     bootstrap node 1, join 2 and 3
#   integration-tests/scripts/galera-cluster.sh stop [DIR]      stop every node
#   integration-tests/scripts/galera-cluster.sh kill N [DIR]    kill -9 node N
#   integration-tests/scripts/galera-cluster.sh rejoin N [DIR]  start node N again (IST or SST)
#
# DIR defaults to /tmp/ax-galera. Needs Debian's mariadb-server, galera-4 and rsync, and root
# (the nodes run as the mysql user).
set -euo pipefail
COMMAND=${1:?usage: galera-cluster.sh start|stop|kill N|rejoin N [DIR]}
shift
NODE=
case "$COMMAND" in kill | rejoin) NODE=${1:?which node}; shift ;; esac
DIR=${1:-/tmp/ax-galera}
PROVIDER=/usr/lib/galera/libgalera_smm.so
MEMBERS=gcomm://127.0.0.1:4571,127.0.0.1:4572,127.0.0.1:4573

config() {
  local n=$1
  mkdir -p "$DIR/n$n/data"
  cat >"$DIR/n$n/my.cnf" <<EOF
[mysqld]
user = mysql
datadir = $DIR/n$n/data
socket = $DIR/n$n/mysqld.sock
pid-file = $DIR/n$n/mysqld.pid
log-error = $DIR/n$n/error.log
port = 440$n
bind-address = 127.0.0.1
skip-name-resolve
max_connections = 1000
innodb_buffer_pool_size = 64M
innodb_log_file_size = 48M
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2
wsrep_on = ON
wsrep_provider = $PROVIDER
wsrep_cluster_name = ax_test
wsrep_cluster_address = $MEMBERS
wsrep_node_name = n$n
wsrep_node_address = 127.0.0.1:457$n
wsrep_provider_options = "gmcast.listen_addr=tcp://127.0.0.1:457$n;ist.recv_addr=127.0.0.1:458$n;gcache.size=64M"
wsrep_sst_method = rsync
# Certification conflicts and brute-force aborts in error.log: what a fault test's failure is
# read against.
wsrep_log_conflicts = ON
wsrep_sst_receive_address = 127.0.0.1:459$n
EOF
}

sql() { mariadb --socket="$DIR/n$1/mysqld.sock" -uroot -N -e "$2"; }

# Waits until node N says it is Synced.
wait_synced() {
  local n=$1
  for _ in $(seq 1 120); do
    if [ "$(sql "$n" "SHOW STATUS LIKE 'wsrep_local_state_comment'" 2>/dev/null | cut -f2)" = Synced ]; then
      return 0
    fi
    sleep 0.5
  done
  echo "galera node $n did not sync; its log: $DIR/n$n/error.log" >&2
  tail -20 "$DIR/n$n/error.log" >&2
  return 1
}

start_node() {
  local n=$1
  shift
  mariadbd --defaults-file="$DIR/n$n/my.cnf" "$@" >/dev/null 2>&1 &
  wait_synced "$n"
}

case "$COMMAND" in
start)
  # A cluster already running here is stopped first: its data directories go.
  "$0" stop "$DIR"
  rm -rf "$DIR"
  for n in 1 2 3; do config "$n"; done
  # As mysql, not root: the joiner's rsync daemon (the state transfer) would run as nobody.
  chown -R mysql:mysql "$DIR"
  mariadb-install-db --defaults-file="$DIR/n1/my.cnf" --auth-root-authentication-method=normal \
    >"$DIR/n1/install.log" 2>&1
  start_node 1 --wsrep-new-cluster
  # Root from 127.0.0.1 without a password, as the CI server has it; copied to the joiners.
  sql 1 "CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
         GRANT ALL ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION"
  for n in 2 3; do start_node "$n"; done
  echo "galera: $(sql 1 "SHOW STATUS LIKE 'wsrep_cluster_size'" | cut -f2) nodes synced at 127.0.0.1:4401-4403"
  ;;
stop)
  for n in 1 2 3; do
    if [ -f "$DIR/n$n/mysqld.pid" ]; then kill "$(cat "$DIR/n$n/mysqld.pid")" 2>/dev/null || true; fi
  done
  for n in 1 2 3; do
    while [ -f "$DIR/n$n/mysqld.pid" ] && kill -0 "$(cat "$DIR/n$n/mysqld.pid")" 2>/dev/null; do sleep 0.2; done
  done
  ;;
kill)
  kill -9 "$(cat "$DIR/n$NODE/mysqld.pid")"
  rm -f "$DIR/n$NODE/mysqld.pid"
  ;;
rejoin)
  start_node "$NODE"
  ;;
*)
  echo "usage: galera-cluster.sh start|stop|kill N|rejoin N [DIR]" >&2
  exit 2
  ;;
esac
