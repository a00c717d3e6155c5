#!/usr/bin/env bash
# bench/rls_instructions.sh OLD_BUILD NEW_BUILD: user-space instructions per
# ShouldRateLimit call of two builds of sluiced, counted by callgrind, for a
# change to Envoy's rate limit service on a machine too busy for rates to
# compare.
#
# Each build's sluiced runs under `valgrind --tool=callgrind` with
# instrumentation off until the load starts (startup and the first lease
# are not counted), on a redis-server of its own, with bench/rls.sh's
# policy (one global limit per descriptor key, never denying). NEW_BUILD's
# bench/rls_load drives it, 2 threads × 32 calls in flight, for
# BENCH_SECONDS (5), with one and with four descriptors; every thread of
# the daemon counts (gRPC's, the workers', the control thread's). Prints a
# markdown table: instructions per call (Ir over the calls answered) for
# each build and new/old (below 1 is cheaper). Callgrind counts no kernel
# time: a thread hop's cost (futex, eventfd, the scheduler) is not in it;
# bench/rls.sh's switches per call counts those.
set -euo pipefail

if [ $# -ne 2 ] || [ ! -x "$1/daemon/sluiced" ] || [ ! -x "$2/daemon/sluiced" ] ||
   [ ! -x "$2/bench/rls_load" ]; then
  echo "usage: bench/rls_instructions.sh OLD_BUILD NEW_BUILD (builds with sluiced; NEW_BUILD with bench/rls_load)" >&2
  exit 2
fi
command -v valgrind >/dev/null || { echo "bench: valgrind is not installed" >&2; exit 2; }
old_build=$(cd "$1" && pwd)
new_build=$(cd "$2" && pwd)
seconds=${BENCH_SECONDS:-5}
rls_load="$new_build/bench/rls_load"
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"

tmp=$(mktemp -d /tmp/slri.XXXXXX)
daemon_pid=
redis_pid=
cleanup() {
  [ -z "$daemon_pid" ] || { kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; }
  [ -z "$redis_pid" ] || { kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; }
  rm -rf "$tmp"
}
trap cleanup EXIT

start_redis "$tmp"
{
  echo "domain: bench"
  echo "descriptors:"
  for d in 0 1 2 3; do
    echo "  - key: k$d"
    echo "    rate_limit: {unit: second, requests_per_unit: 1000000000}"
  done
} >"$tmp/bench.yaml"

# Instructions per call of BUILD's sluiced with DESCRIPTORS per call.
count() {  # BUILD DESCRIPTORS
  local build=$1 descriptors=$2 dir out calls ir
  dir=$(mktemp -d "$tmp/run.XXXXXX")
  cat >"$dir/bench.toml" <<EOT
[daemon]
socket = "$dir/d.sock"
log_level = "warn"

[redis]
url = "redis://127.0.0.1:$port"

[envoy]
listen = "unix:$dir/rls.sock"
config = "$tmp/bench.yaml"
EOT
  valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$dir/cg.out" \
    "$build/daemon/sluiced" --config "$dir/bench.toml" 2>"$dir/valgrind.log" &
  daemon_pid=$!
  for _ in $(seq 600); do [ -S "$dir/rls.sock" ] && break; sleep 0.1; done
  # Each call has a deadline, as Envoy's do, but a minute away
  # (DEADLINE_MS 60000): under callgrind sluiced answers slower than
  # Envoy's 20 ms, and every call would be given up on.
  "$rls_load" "unix:$dir/rls.sock" "$descriptors" 2 1 4 0 1 60000 >/dev/null  # warm: the first leases
  callgrind_control -i on "$daemon_pid" >/dev/null 2>&1
  out=$("$rls_load" "unix:$dir/rls.sock" "$descriptors" "$seconds" 2 32 0 1 60000)
  callgrind_control -d "$daemon_pid" >/dev/null 2>&1  # cg.out.1: the counts since instrumentation began
  kill "$daemon_pid"
  wait "$daemon_pid" 2>/dev/null || true
  daemon_pid=
  calls=$(($(field ok "$out") + $(field over_limit "$out")))
  ir=$(awk '/^summary:/ { s += $2 } END { print s + 0 }' "$dir"/cg.out.1)
  echo $((ir / calls))
}

echo "| row | $(basename "$old_build") Ir per call | $(basename "$new_build") Ir per call | new/old |"
echo "|---|---|---|---|"
for descriptors in 1 4; do
  old=$(count "$old_build" "$descriptors")
  new=$(count "$new_build" "$descriptors")
  echo "| $descriptors descriptor(s) | $old | $new | $(awk -v a="$new" -v b="$old" 'BEGIN { printf "%.3f", a / b }') |"
done
