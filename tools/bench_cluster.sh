#!/usr/bin/env bash
# Cluster benchmarks (docs/BENCHMARKS.md, "Cluster"), on one host:
#   1. routing cost: YCSB through the cluster client against a one-server
#      cluster, and against a single server (no --cluster) through a
#      session, alternated;
#   2. aggregate throughput and server CPU per operation with 1, 2, 3 ...
#      servers, every server pinned to CPU 0 and the client to CPU 1.
# It starts its own ZooKeeper (Debian's `zookeeper` package) on a free
# loopback port and stops everything at the end.
#
#   tools/bench_cluster.sh [BUILD_DIR] [-- remem-bench ycsb flags...]
# e.g. tools/bench_cluster.sh build -- --workloads A,C --records 1000000
set -euo pipefail
build=${1:-build}
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
extra=("$@")
[ ${#extra[@]} -eq 0 ] && extra=(--workloads A,C --records 1000000 --duration 2 --warmup 0.5 --depth 16)
servers_list=${SERVERS:-"1 2 3"}
rounds=${ROUNDS:-3}
transport=${TRANSPORT:-shm}

dir=$(mktemp -d /tmp/remem-bench-cluster-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

# A loopback port nobody answers on, for ZooKeeper.
zk_port=$((20000 + RANDOM % 20000))
while (exec 3<>/dev/tcp/127.0.0.1/$zk_port) 2>/dev/null; do zk_port=$((zk_port + 1)); done
cat >"$dir/zoo.cfg" <<EOF
tickTime=500
dataDir=$dir/zk
clientPort=$zk_port
clientPortAddress=127.0.0.1
admin.enableServer=false
4lw.commands.whitelist=ruok
EOF
java -Xmx256m -cp /etc/zookeeper/conf:/usr/share/java/zookeeper.jar \
  org.apache.zookeeper.server.ZooKeeperServerMain "$dir/zoo.cfg" >"$dir/zk.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
  (exec 3<>/dev/tcp/127.0.0.1/$zk_port && printf ruok >&3 && timeout 1 cat <&3) 2>/dev/null | grep -q imok && break
  sleep 0.1
done

# start_cluster NAME N: N servers of cluster NAME on CPU 0; sets seeds, spids.
start_cluster() {
  local name=$1 n=$2
  seeds="" spids=""
  for i in $(seq "$n"); do
    local log="$dir/$name-$i.log" addr=""
    "$build/remem-server" --listen 127.0.0.1:0 --transport "$transport" \
      --memory 2G --cpus 0 --cluster "127.0.0.1:$zk_port/bench/$name" \
      --cluster-size "$n" --log-level warn >"$log" 2>&1 &
    pids+=($!)
    spids+="${spids:+,}$!"
    for _ in $(seq 300); do
      addr=$(sed -n 's/^remem-server listening on \([^ ]*\) .*/\1/p' "$log")
      [ -n "$addr" ] && break
      sleep 0.1
    done
    [ -n "$addr" ] || { echo "server $i did not start: $(cat "$log")" >&2; return 1; }
    seeds+="${seeds:+,}$addr"
  done
  for _ in $(seq 200); do
    "$build/remem" --cluster "$seeds" --transport "$transport" cluster info >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "cluster $name did not form" >&2
  return 1
}
stop_cluster() {
  IFS=, read -ra ps <<<"$spids"
  for p in "${ps[@]}"; do kill "$p"; wait "$p" 2>/dev/null || true; done
}

bench() { "$build/remem-bench" ycsb --transport "$transport" --client-cpu 1 "${extra[@]}" "$@"; }

echo "== routing cost: a one-server cluster through the cluster client vs a single server (no --cluster) through a session ($rounds rounds, alternated)"
# The single server: the same flags without --cluster. (A plain session to
# a cluster member reads by RPC, so it is not the baseline.)
single_log="$dir/single.log"
"$build/remem-server" --listen 127.0.0.1:0 --transport "$transport" \
  --memory 2G --cpus 0 --log-level warn >"$single_log" 2>&1 &
single_pid=$!
pids+=($single_pid)
single=""
for _ in $(seq 300); do
  single=$(sed -n 's/^remem-server listening on \([^ ]*\) .*/\1/p' "$single_log")
  [ -n "$single" ] && break
  sleep 0.1
done
start_cluster routing 1
for r in $(seq "$rounds"); do
  echo "-- round $r: single server, direct session"
  bench --server "$single" --server-pids "$single_pid" | grep -E '^remem-' || true
  echo "-- round $r: one-server cluster, cluster client"
  bench --cluster "$seeds" --server-pids "$spids" | grep -E '^remem-' || true
done
stop_cluster
kill "$single_pid"

for n in $servers_list; do
  echo "== $n server(s), all on CPU 0"
  start_cluster "n$n" "$n"
  bench --cluster "$seeds" --server-pids "$spids" | grep -E '^remem-' || true
  stop_cluster
done
