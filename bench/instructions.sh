#!/usr/bin/env bash
# bench/instructions.sh OLD_BUILD NEW_BUILD: instructions per decision of two
# builds of sluiced, counted by callgrind inside Dispatcher::ask only, for a
# refactor of the decision path on a machine too busy for rates to compare.
#
# A rate measured on a shared machine moves by a factor of two between
# rounds; an instruction count does not depend on the load. Each build's
# sluiced runs under `valgrind --tool=callgrind` with collection on only
# inside Dispatcher::ask (and what it calls), on one Redis, with the rules
# of bench/compare.sh; NEW_BUILD's load generator sends a fixed shape:
#   local-hot     the local rule, one key, pipelined
#   local-10k     the local rule over 10,000 keys, pipelined
#   global-hot    the global rule, one key, pipelined (leased)
#   global-10k    the global rule over 10,000 keys, pipelined
# and prints one markdown table: instructions per call of Dispatcher::ask
# per request (Ir over the answers the load generator got) for each build and new/old (below 1 is cheaper). Rows run one
# after another, each on a fresh daemon, so one row's keys do not warm the
# next.
#
# Knobs (environment): BENCH_SECONDS of load per row (3; under callgrind a
# daemon answers some thousands of requests a second); BENCH_FUNCTION, the
# function whose instructions are counted ('sluice::Dispatcher::ask*';
# 'sluice::Connection::onRead*' counts a request's whole way through the
# worker: read, parse, decide, encode).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
if [ $# -ne 2 ] || [ ! -x "$1/daemon/sluiced" ] || [ ! -x "$2/daemon/sluiced" ] ||
   [ ! -x "$2/bench/load" ] || [ ! -x "$2/client/sluicectl" ]; then
  echo "usage: bench/instructions.sh OLD_BUILD NEW_BUILD (builds with sluiced; NEW_BUILD with bench/load and client/sluicectl)" >&2
  exit 2
fi
command -v valgrind >/dev/null || { echo "bench: valgrind is not installed" >&2; exit 2; }
old_build=$(cd "$1" && pwd)
new_build=$(cd "$2" && pwd)
seconds=${BENCH_SECONDS:-3}
function=${BENCH_FUNCTION:-sluice::Dispatcher::ask*}
load="$new_build/bench/load"

tmp=$(mktemp -d /tmp/sli.XXXXXX)  # short: a socket path has at most 107 bytes
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

start_redis "$tmp"
pids+=("$redis_pid")

# count ROW NAME BUILD: one daemon of BUILD under callgrind, one row's load,
# and its instructions per Dispatcher::ask.
count() {
  local row=$1 name=$2 build=$3 sock="$tmp/$2.sock" pid calls
  write_bench_config "$tmp/$name.toml" "$sock" 1 "$name-$row:"
  rm -f "$tmp/$name.out"
  valgrind --tool=callgrind --callgrind-out-file="$tmp/$name.out" \
    --toggle-collect="$function" \
    "$build/daemon/sluiced" --config "$tmp/$name.toml" 2>"$tmp/$name.log" &
  pid=$!
  wait_for_leasing "$new_build/client/sluicectl" "$sock" 400 "$tmp/$name.log"
  local out
  case $row in
    local-hot) out=$("$load" pipelined "$sock" local hot 1 64 "$seconds") ;;
    local-10k) out=$("$load" pipelined "$sock" local 10000 1 64 "$seconds") ;;
    global-hot) out=$("$load" pipelined "$sock" global hot 1 64 "$seconds") ;;
    global-10k) out=$("$load" pipelined "$sock" global 10000 1 64 "$seconds") ;;
  esac
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  # Every answer the load generator got was one ask (warm-up included).
  calls=$(( $(field allowed "$out") + $(field denied "$out") + $(field errors "$out") ))
  callgrind_annotate "$tmp/$name.out" 2>/dev/null |
    awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }' >"$tmp/$name.ir"
  echo "$row $name $(cat "$tmp/$name.ir") $calls"
}

echo "| row | old Ir/request | new Ir/request | new/old |"
echo "|---|---:|---:|---:|"
for row in local-hot local-10k global-hot global-10k; do
  read -r _ _ old_ir old_calls < <(count "$row" old "$old_build")
  read -r _ _ new_ir new_calls < <(count "$row" new "$new_build")
  awk -v r="$row" -v oi="$old_ir" -v oc="$old_calls" -v ni="$new_ir" -v nc="$new_calls" 'BEGIN {
    o = (oc > 0) ? oi / oc : 0; n = (nc > 0) ? ni / nc : 0
    printf "| %s | %.0f | %.0f | %.3f |\n", r, o, n, (o > 0) ? n / o : 0 }'
  echo "bench: $row old $old_ir Ir over $old_calls answers, new $new_ir Ir over $new_calls answers" >&2
done
echo
echo "Instructions counted by callgrind inside $function (inclusive) per answer, one worker, ${seconds} s of" \
  "load per row and build, 1 connection x 64 in flight."
