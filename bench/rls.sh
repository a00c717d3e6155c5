#!/usr/bin/env bash
# bench/rls.sh BUILD_DIR: Envoy's rate limit service behind `make bench`.
#
# Starts a redis-server of its own and BUILD_DIR/daemon/sluiced with [envoy]
# on a Unix socket and one global limit per descriptor key (high enough
# never to deny), then drives ShouldRateLimit with BUILD_DIR/bench/rls_load:
#   one-descriptor     one hot descriptor per call, as fast as it answers;
#   four-descriptors   four descriptors per call (four decisions), the same;
#   half-rate          one descriptor paced at half the one-descriptor rate:
#                      the latency at a load the machine carries;
#   redis-down         Redis stopped (SIGSTOP, so its calls hang until
#                      lease_timeout) at a paced 1,000 calls/s: every call
#                      is answered from the node's share, p99 shows the wait.
# Redis calls per RPC: every client command Redis counted (INFO
# commandstats, as bench/global.sh sums them) over the calls answered.
# Knobs: BENCH_SECONDS (3), BENCH_THREADS (2), BENCH_DEPTH (32).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_setup rls.sh "$@"
seconds=${BENCH_SECONDS:-3}
threads=${BENCH_THREADS:-2}
depth=${BENCH_DEPTH:-32}
rls_load="$build/bench/rls_load"
[ -x "$rls_load" ] || { echo "bench: $rls_load is missing (built with SLUICE_GRPC=ON)" >&2; exit 2; }

tmp=$(mktemp -d /tmp/slr.XXXXXX)
daemon_pid=
redis_pid=
cleanup() {
  [ -z "$redis_pid" ] || kill -CONT "$redis_pid" 2>/dev/null || true
  [ -z "$daemon_pid" ] || { kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; }
  [ -z "$redis_pid" ] || { kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; }
  rm -rf "$tmp"
}
trap cleanup EXIT

start_redis "$tmp"
rcli() { redis-cli -p "$port" "$@"; }
{
  echo "domain: bench"
  echo "descriptors:"
  for d in 0 1 2 3; do
    echo "  - key: k$d"
    echo "    rate_limit: {unit: second, requests_per_unit: 1000000000}"
  done
} >"$tmp/bench.yaml"
cat >"$tmp/bench.toml" <<EOF
# Written by bench/rls.sh.
[daemon]
socket = "$tmp/d.sock"
log_level = "warn"

[redis]
url = "redis://127.0.0.1:$port"

[envoy]
listen = "unix:$tmp/rls.sock"
config = "$tmp/bench.yaml"
EOF
"$build/daemon/sluiced" --config "$tmp/bench.toml" 2>"$tmp/sluiced.log" &
daemon_pid=$!
for _ in $(seq 100); do [ -S "$tmp/rls.sock" ] && break; sleep 0.05; done
target="unix:$tmp/rls.sock"
"$rls_load" "$target" 1 0.5 1 1 >/dev/null  # warm: the first lease

redis_calls() {
  rcli info commandstats | awk '
    /^cmdstat_/ {
      name = $0; sub(/^cmdstat_/, "", name); sub(/:.*/, "", name)
      calls = $0; sub(/.*:calls=/, "", calls); sub(/,.*/, "", calls)
      if (name ~ /^(eval|evalsha|eval_ro|evalsha_ro|ping|info|auth|select|hello)$/ || name ~ /^(script|client)[|]/) s += calls
    }
    END { print s + 0 }'
}

rows=()
last_rate=0
measure() {  # NAME DESCRIPTORS [RATE]
  local name=$1 descriptors=$2 rate=${3:-0} before after out calls
  before=$(redis_calls)
  out=$("$rls_load" "$target" "$descriptors" "$seconds" "$threads" "$depth" "$rate")
  after=$(redis_calls)
  calls=$(awk -v c="$(field calls_per_s "$out")" -v s="$seconds" -v r=$((after - before)) \
    'BEGIN { printf "%.4f", r / (c * s) }')
  rows+=("| $name | $(field calls_per_s "$out") | $(field p50_us "$out") | $(field p99_us "$out") | $calls | $(field errors "$out") |")
  echo "$name: $out redis_calls_per_rpc=$calls" >&2
  last_rate=$(field calls_per_s "$out")
}

measure one-descriptor 1
half=$((${last_rate%.*} / 2))
measure four-descriptors 4
measure "half-rate ($half/s)" 1 "$half"
kill -STOP "$redis_pid"
sleep 1  # the health check notices (health_interval + health_timeout)
out=$("$rls_load" "$target" 1 "$seconds" 1 8 1000 2>&1 || true)
kill -CONT "$redis_pid"
rows+=("| redis-down (SIGSTOP, 1000/s) | $(field calls_per_s "$out") | $(field p50_us "$out") | $(field p99_us "$out") | - | $(field errors "$out") |")
echo "redis-down: $out" >&2

result="$here/results/$(bench_result_name rls)"
{
  echo "# Envoy's rate limit service"
  echo
  echo "bench/rls.sh on $(nproc) CPUs: rls_load, $threads threads × $depth calls in flight over a"
  echo "Unix socket, ${seconds}s per row, sluiced with one global limit per descriptor key on a"
  echo "local redis-server (one hot key each)."
  echo
  echo "| row | calls/s | p50 µs | p99 µs | Redis calls per RPC | errors |"
  echo "|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  busy_warning "rerun on an idle machine for figures worth comparing."
} | tee "$result"
