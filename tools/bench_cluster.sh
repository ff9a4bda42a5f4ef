#!/usr/bin/env bash
# Cluster benchmarks (docs/BENCHMARKS.md, "Cluster"), on one host:
#   1. routing cost: YCSB through the cluster client against a one-server
#      cluster, and against a single server (no --cluster) through a
#      session, alternated;
#   2. aggregate throughput and server CPU per operation with 1, 2, 3 ...
#      servers, every server pinned to CPU 0 and the client to CPU 1;
#   3. rebalancing: a YCSB run on three servers, then the same run during
#      which one of them is drained (after the load) and its shards move to
#      the other two: the run's throughput second by second and its errors,
#      and each move step's pairs, copy time and write pause (from the
#      manager's log). RB_SHARDS sets the clusters' shard count (10 at 1 M
#      records: shards of 100 K pairs), RB_DURATION the runs' length; with
#      workload E and TREE_SPLITS, set RB_STAT=tree_pairs (the load is
#      done when the trees hold the records), and the drained server's
#      ordered range moves too;
#   4. replication (REPLICAS="0 1 2"; off by default): three servers with
#      --replicas f for each f listed, the same runs; with f = 0 also with
#      gets by RPC (remem-shm-rpc), as replicated shards were read before
#      their serving marks; with f > 0 and READ_FROM="primary any", the
#      runs once per --read-from (any: gets from backups too, a weaker
#      mode), and each server's hash_backup_gets after them.
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
servers_list=${SERVERS-"1 2 3"}  # SERVERS= skips part 2; ROUTING=0 part 1,
                                  # REBALANCE=0 part 3
rounds=${ROUNDS:-3}
# SERVER_FLAGS: more remem-server flags for every server, the single one of
# part 1 too (e.g. "--spin-us 0", "--tree-memory 1G").
# TREE_SPLITS: the clusters' --tree-splits (their ordered store, for YCSB-E:
# e.g. TREE_SPLITS=zzzz, one range; TREE_SPLITS=user5,usera, three).
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
      --cluster-size "$n" --shards "${shards:-1024}" \
      --log-level "${log_level:-warn}" ${replica_flags:-} ${SERVER_FLAGS:-} \
      ${TREE_SPLITS:+--tree-splits "$TREE_SPLITS"} >"$log" 2>&1 &
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

if [ "${ROUTING:-1}" = 1 ]; then
echo "== routing cost: a one-server cluster through the cluster client vs a single server (no --cluster) through a session ($rounds rounds, alternated)"
# The single server: the same flags without --cluster. (A plain session to
# a cluster member reads by RPC, so it is not the baseline.)
single_log="$dir/single.log"
"$build/remem-server" --listen 127.0.0.1:0 --transport "$transport" \
  --memory 2G --cpus 0 --log-level warn ${SERVER_FLAGS:-} >"$single_log" 2>&1 &
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
fi

for n in $servers_list; do
  echo "== $n server(s), all on CPU 0"
  start_cluster "n$n" "$n"
  bench --cluster "$seeds" --server-pids "$spids" | grep -E '^remem-' || true
  stop_cluster
done

for f in ${REPLICAS:-}; do
  echo "== replication: 3 servers, $f backup(s) per shard"
  replica_flags="--replicas $f" start_cluster "rf$f" 3
  if [ "$f" = 0 ]; then
    echo "-- gets by RPC (as replicated shards were read before their serving marks)"
    bench --cluster "$seeds" --server-pids "$spids" --systems "remem-$transport-rpc" |
      grep -E '^remem-' || true
    echo "-- gets on the read path the client chooses"
  fi
  if [ "$f" != 0 ] && [ -n "${READ_FROM:-}" ]; then
    for rf in $READ_FROM; do
      echo "-- --read-from $rf"
      bench --cluster "$seeds" --server-pids "$spids" --read-from "$rf" |
        grep -E '^remem-' || true
      "$build/remem" --cluster "$seeds" --transport "$transport" stats |
        grep -E 'hash_backup_gets' || true
    done
  else
    bench --cluster "$seeds" --server-pids "$spids" | grep -E '^remem-' || true
  fi
  stop_cluster
done

if [ "${REBALANCE:-1}" = 1 ]; then
  rb_duration=${RB_DURATION:-20}
  rb_shards=${RB_SHARDS:-1024}   # e.g. 10: shards of 100 K pairs at 1 M records
  rb_interval=${RB_INTERVAL:-1}  # seconds per throughput line
  # The records flag of the run (default 1000000).
  records=1000000
  for ((i = 0; i < ${#extra[@]}; i++)); do
    [ "${extra[$i]}" = --records ] && records=${extra[$((i + 1))]}
  done
  # Three servers; the same run without and with a drain of one of them
  # (its shards move to the other two) a few seconds into the timed run.
  # A drain rather than a join: a server starting on the shared server core
  # stalls the others for seconds (a plain server does too), which would
  # hide the move.
  for with in no yes; do
    case $with in
      yes) echo "== rebalance: 3 servers, one drained during the run (${rb_duration}s run)" ;;
      no) echo "== rebalance baseline: 3 servers, nothing moves (${rb_duration}s run)" ;;
    esac
    log_level=info shards=$rb_shards start_cluster "rb-$with" 3
    bench --cluster "$seeds" --server-pids "$spids" --duration "$rb_duration" \
      --interval "$rb_interval" >"$dir/rb-$with.out" 2>&1 &
    bpid=$!
    if [ "$with" = yes ]; then
      # After the load: every pair is on the servers.
      for _ in $(seq 600); do
        n=$("$build/remem" --cluster "$seeds" --transport "$transport" stats 2>/dev/null |
            awk -v stat="${RB_STAT:-hash_pairs}" '$1 == stat {s += $2} END {print s + 0}')
        [ "$n" -ge "$records" ] && break
        sleep 0.5
      done
      sleep 3  # into the timed run
      victim=${seeds%%,*}
      "$build/remem" --cluster "$seeds" --transport "$transport" --timeout 120 \
        cluster drain "$victim" | sed 's/^/  /'
    fi
    wait "$bpid" || true
    grep -E '^remem-|error| s: ' "$dir/rb-$with.out" || true
    if [ "$with" = yes ]; then
      grep -h "ranges moved" "$dir"/rb-yes-*.log | sed 's/^/  /'
      "$build/remem" --cluster "${seeds#*,}" --transport "$transport" cluster nodes
    fi
    stop_cluster
  done
fi
