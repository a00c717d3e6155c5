#!/usr/bin/env bash
# bench/fronts.sh BUILD_DIR: the HTTP and Redis protocol fronts behind
# `make bench`, next to the MessagePack path and redis-server in one run.
#
# Starts BUILD_DIR/daemon/sluiced with [http] and [resp] on free loopback
# ports (a token bucket so large that every call is allowed, and
# CL.THROTTLE's parameters as large), and a redis-server of its own, and
# measures, one after another on this machine:
#   msgpack-pipelined   bench/load pipelined on the Unix socket (the
#                       MessagePack path, for reference)
#   http-check          wrk, keep-alive connections, GET /v1/check: checks/s,
#                       p99 and the daemon's CPU time per check (utime +
#                       stime from /proc over the run)
#   resp-pipelined      redis-benchmark -P WINDOW, CL.THROTTLE: calls/s
#   resp-one-at-a-time  redis-benchmark -P 1, CL.THROTTLE
#   evalsha-pipelined   bench/load evalsha-pipelined: redis-server answering
#                       one EVALSHA of lua/gcra.lua per call, as redis-cell
#                       costs a call
# and prints one markdown table, also saved to bench/results/fronts.md, with
# each row's rate as a fraction of msgpack-pipelined's in the same run.
#
# BENCH_HTTP_BASELINE=PATH/TO/sluiced adds http-check-baseline: the same
# measurement, in the same run, of another build's daemon (an older one,
# to compare), started beside this one with [http] alone.
#
# Knobs (environment): BENCH_SECONDS per measurement (3), BENCH_CONNECTIONS
# (8 for wrk and redis-benchmark, 2 for load), BENCH_WINDOW pipelined calls
# in flight per connection (64), BENCH_MODE=quick (bench/common.sh).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_setup fronts.sh "$@"
seconds=${BENCH_SECONDS:-3}
window=${BENCH_WINDOW:-64}
conns=${BENCH_CONNECTIONS:-8}
for tool in wrk curl redis-benchmark redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing (make deps)" >&2; exit 1; }
done

tmp=$(mktemp -d /tmp/sluice-fronts.XXXXXX)
daemon_pid=
baseline_pid=
redis_pid=
cleanup() {
  for pid in $daemon_pid $baseline_pid $redis_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

start_redis "$tmp"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
http_port=$(free_port)
resp_port=$(free_port)
sock="$tmp/s.sock"
cat >"$tmp/sluice.toml" <<EOF
[daemon]
socket = "$sock"
log_level = "warn"

[http]
listen = "127.0.0.1:$http_port"

[resp]
listen = "127.0.0.1:$resp_port"

[[rule]]
name = "bench"
algorithm = "token_bucket"
limit = 1000000000
period = "1s"
EOF
"$build/daemon/sluiced" --config "$tmp/sluice.toml" >"$tmp/sluiced.log" 2>&1 &
daemon_pid=$!
for _ in $(seq 100); do
  redis-cli -p "$resp_port" ping >/dev/null 2>&1 && break
  sleep 0.05
done
throttle=(CL.THROTTLE bench 999999999 1000000000 1)
redis-cli -p "$resp_port" "${throttle[@]}" >/dev/null

if [ -n "${BENCH_HTTP_BASELINE:-}" ]; then
  baseline_port=$(free_port)
  sed -e "s|^socket = .*|socket = \"$tmp/b.sock\"|" \
    -e "s|^listen = \"127.0.0.1:$http_port\"|listen = \"127.0.0.1:$baseline_port\"|" \
    -e '/^\[resp\]/,/^$/d' "$tmp/sluice.toml" >"$tmp/baseline.toml"
  "$BENCH_HTTP_BASELINE" --config "$tmp/baseline.toml" >"$tmp/baseline.log" 2>&1 &
  baseline_pid=$!
fi

results="$tmp/results"
: >"$results"
row() {  # NAME RATE P99 [CPU_PER_CALL]
  echo "$1 $2 $3 ${4:--}" >>"$results"
  echo "bench: $1: $2 calls/s, p99 $3, daemon CPU per call ${4:--}" >&2
}
# A process's CPU time so far (utime + stime), in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# The MessagePack path, in the same run.
out=$(BENCH_SERVER_PID=$daemon_pid "$build/bench/load" pipelined "$sock" bench hot 2 "$window" "$seconds")
row msgpack-pipelined "$(field rate_per_s "$out")" "-"

# HTTP: wrk's rate and p99 (its --latency table), and the daemon's CPU
# time per check.
http_row() {  # NAME PORT PID
  local before after out rate p99 errors requests
  for _ in $(seq 100); do
    curl -s -o /dev/null "http://127.0.0.1:$2/v1/check?rule=bench&key=warm" && break
    sleep 0.05
  done
  before=$(cpu_ticks "$3")
  out=$(wrk -t2 -c"$conns" -d"${seconds}s" --latency "http://127.0.0.1:$2/v1/check?rule=bench&key=k")
  after=$(cpu_ticks "$3")
  rate=$(awk '/Requests\/sec/ { printf "%d", $2 }' <<<"$out")
  p99=$(awk '$1 == "99%" { print $2 }' <<<"$out")
  requests=$(awk '/requests in/ { print $1 }' <<<"$out")
  errors=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
  [ -z "$errors" ] || { echo "bench: $errors HTTP checks were not 200" >&2; exit 1; }
  row "$1" "$rate" "$p99" "$(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" -v n="$requests" \
    'BEGIN { printf "%d ns", (n > 0 ? t / hz * 1e9 / n : 0) }')"
}
http_row http-check "$http_port" "$daemon_pid"
if [ -n "$baseline_pid" ]; then
  http_row http-check-baseline "$baseline_port" "$baseline_pid"
fi

# RESP: redis-benchmark's rate (requests per second in its -q line).
resp_rate() {  # PIPELINE COUNT
  redis-benchmark -p "$resp_port" -c "$conns" -P "$1" -n "$2" -q "${throttle[@]}" 2>&1 |
    tr '\r' '\n' | awk '/requests per second/ { for (i = 1; i <= NF; i++) if ($(i+1) == "requests") { printf "%d", $i; exit } }'
}
pipelined_calls=$(awk -v s="$seconds" 'BEGIN { printf "%d", s * 300000 }')
row resp-pipelined "$(resp_rate "$window" "$pipelined_calls")" "-"
row resp-one-at-a-time "$(resp_rate 1 "$(awk -v s="$seconds" 'BEGIN { printf "%d", s * 20000 }')")" "-"

# redis-server answering one EVALSHA of the GCRA script per call.
out=$(BENCH_SERVER_PID=$redis_pid "$build/bench/load" evalsha-pipelined "127.0.0.1:$port" \
  "$here/../lua/gcra.lua" "1000000000/1000/1000000000" hot 2 "$window" "$seconds")
[ "$(field errors "$out")" = 0 ] || { echo "bench: evalsha errors: $out" >&2; exit 1; }
row evalsha-pipelined "$(field rate_per_s "$out")" "-"

report() {
  echo "## The fronts: HTTP and the Redis protocol"
  echo
  echo "$(date -u +%F), $(nproc) CPUs, $(redis-server --version | sed 's/ sha=.*//');" \
    "load average ${load_before} at the start. Every call is allowed (a rule too large to deny)."
  echo
  echo "| row | calls/s | vs msgpack-pipelined | p99 | daemon CPU per call |"
  echo "|---|---:|---:|---:|---:|"
  local reference
  reference=$(awk '$1 == "msgpack-pipelined" { print $2 }' "$results")
  while read -r name rate p99 cpu; do
    printf '| %s | %s | %s | %s | %s |\n' "$name" "$rate" \
      "$(awk -v r="$rate" -v m="$reference" 'BEGIN { printf "%.2f", (m > 0 ? r / m : 0) }')" "$p99" \
      "$cpu"
  done <"$results"
  echo
  echo "Targets on 2 CPUs: RESP pipelined >= 1,000,000 calls/s, HTTP >= 50,000 checks/s."
  busy_warning "rerun on a quiet machine for figures to compare."
}
report | tee "$here/results/$(bench_result_name fronts)"
