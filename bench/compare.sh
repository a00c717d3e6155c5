#!/usr/bin/env bash
# bench/compare.sh OLD_BUILD NEW_BUILD: two builds of sluiced side by side,
# for a change that must not cost speed (a refactor).
#
# Starts one redis-server and, from each build, one sluiced on the same
# config (a local rule and a global rule leasing from that Redis, both too
# large to deny). Then measures, with NEW_BUILD's load generator and the
# same shape for both daemons, in interleaved rounds (old, new, new, old,
# ... so that a machine that slows down during the run does not favour one):
#   local-hot-pipelined   the local rule, one key, pipelined
#   local-1M-pipelined    the local rule over 1,000,000 keys, pipelined
#   local-hot-sync        the local rule, one key, one request at a time
#   global-hot-pipelined  the global rule, one key, pipelined
#   global-10k-pipelined  the global rule over 10,000 keys, pipelined
#   global-5k-over-pipelined
#                         a global rule of 10/s (burst 10) over 5,000 keys,
#                         pipelined, after 2 s of the same load unmeasured:
#                         every key is far over its limit and holds a rate
#                         lease; with it, global-5k-over-control: the
#                         daemon's control thread's CPU over the
#                         measurement (the lease traffic, and the sweep of
#                         rate holders)
# and prints one markdown table: each row's median over the rounds for the
# old and the new build, and new/old (above 1 is faster for rates, below 1
# is faster for latencies and CPU). Both daemons run at once, each with
# WORKERS threads, but only one is measured at a time.
#
# Knobs (environment): BENCH_SECONDS per measurement (2), BENCH_ROUNDS (5),
# BENCH_CONNECTIONS (2), BENCH_WINDOW (64), BENCH_WORKERS (nproc), BENCH_ROWS
# (the rows above, in that order; a subset measures only those).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
if [ $# -ne 2 ] || [ ! -x "$1/daemon/sluiced" ] || [ ! -x "$2/daemon/sluiced" ] ||
   [ ! -x "$2/bench/load" ]; then
  echo "usage: bench/compare.sh OLD_BUILD NEW_BUILD (builds with sluiced; NEW_BUILD with bench/load)" >&2
  exit 2
fi
old_build=$(cd "$1" && pwd)
new_build=$(cd "$2" && pwd)
seconds=${BENCH_SECONDS:-2}
rounds=${BENCH_ROUNDS:-5}
conns=${BENCH_CONNECTIONS:-2}
window=${BENCH_WINDOW:-64}
workers=${BENCH_WORKERS:-$(nproc)}
load="$new_build/bench/load"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

tmp=$(mktemp -d /tmp/slc.XXXXXX)  # short: a socket path has at most 107 bytes
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

start_redis "$tmp"
pids+=("$redis_pid")

# start NAME BUILD: one sluiced on its own socket, leasing from the Redis.
declare -A daemon_pid
start() {
  local name=$1 build=$2
  write_bench_config "$tmp/$name.toml" "$tmp/$name.sock" "$workers" "$name:"
  cat >>"$tmp/$name.toml" <<EOF

[[rule]]
name = "over"
algorithm = "token_bucket"
limit = 10
period = "1s"
burst = 10
scope = "global"
EOF
  "$build/daemon/sluiced" --config "$tmp/$name.toml" 2>"$tmp/$name.log" &
  pids+=($!)
  daemon_pid[$name]=$!
  wait_for_leasing "$new_build/client/sluicectl" "$tmp/$name.sock" 100 "$tmp/$name.log"
}
# control_ticks NAME: CPU clock ticks the daemon NAME's control thread has used.
control_ticks() {
  local task
  for task in /proc/"${daemon_pid[$1]}"/task/*; do
    if [ "$(cat "$task/comm")" = sluice-control ]; then awk '{ print $14 + $15 }' "$task/stat"; return; fi
  done
  echo 0
}
start old "$old_build"
start new "$new_build"

results="$tmp/results"
: >"$results"
# measure ROW BUILD_NAME ROUND: one measurement of ROW against one daemon.
measure() {
  local row=$1 name=$2 round=$3 sock="$tmp/$2.sock" out value ticks
  # The keys' first leases are token leases, one Redis call per request
  # until their buckets run dry and they lease rates: that start is not
  # what the row measures.
  [ "$row" != global-5k-over-pipelined ] || "$load" pipelined "$sock" over 5000 "$conns" "$window" 2 >/dev/null
  ticks=$(control_ticks "$name")
  case $row in
    local-hot-pipelined) out=$("$load" pipelined "$sock" local hot "$conns" "$window" "$seconds") ;;
    local-1M-pipelined) out=$("$load" pipelined "$sock" local 1000000 "$conns" "$window" "$seconds") ;;
    local-hot-sync) out=$("$load" sync "$sock" local hot "$seconds") ;;
    global-hot-pipelined) out=$("$load" pipelined "$sock" global hot "$conns" "$window" "$seconds") ;;
    global-10k-pipelined) out=$("$load" pipelined "$sock" global 10000 "$conns" "$window" "$seconds") ;;
    global-5k-over-pipelined) out=$("$load" pipelined "$sock" over 5000 "$conns" "$window" "$seconds") ;;
  esac
  if [ "$row" = global-5k-over-pipelined ]; then
    ticks=$(($(control_ticks "$name") - ticks))
    echo "global-5k-over-control $name $round $(awk -v t="$ticks" -v hz="$(getconf CLK_TCK)" \
      -v s="$seconds" 'BEGIN { printf "%.1f", 100 * t / hz / s }')" >>"$results"
  fi
  if [ "$row" = local-hot-sync ]; then value=$(field p50_us "$out"); else value=$(field rate_per_s "$out"); fi
  echo "$row $name $round $value" >>"$results"
  echo "bench: $row $name round $round: $out" >&2
}

rows=${BENCH_ROWS:-local-hot-pipelined local-1M-pipelined local-hot-sync global-hot-pipelined global-10k-pipelined global-5k-over-pipelined}
for round in $(seq "$rounds"); do
  for row in $rows; do
    if [ $((round % 2)) = 1 ]; then order="old new"; else order="new old"; fi
    for name in $order; do measure "$row" "$name" "$round"; done
  done
done

median() {
  sort -g | awk '{ v[NR] = $1 } END {
    m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    printf (m >= 1000) ? "%.0f\n" : "%.2f\n", m
  }'
}
echo "| row | unit | old (median) | new (median) | new/old |"
echo "|---|---|---:|---:|---:|"
shown=$rows
[[ " $rows " == *" global-5k-over-pipelined "* ]] && shown="$shown global-5k-over-control"
for row in $shown; do
  unit="decisions/s"
  [ "$row" = local-hot-sync ] && unit="p50 µs"
  [ "$row" = global-5k-over-control ] && unit="control thread CPU %"
  old=$(awk -v r="$row" '$1 == r && $2 == "old" { print $4 }' "$results" | median)
  new=$(awk -v r="$row" '$1 == r && $2 == "new" { print $4 }' "$results" | median)
  ratio=$(awk -v o="$old" -v n="$new" 'BEGIN { printf "%.3f", (o > 0) ? n / o : 0 }')
  echo "| $row | $unit | $old | $new | $ratio |"
done
echo
echo "$rounds interleaved rounds of ${seconds} s, $conns connections x $window in flight for pipelined rows," \
  "both daemons with $workers workers; $(nproc) CPUs, load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg)."
