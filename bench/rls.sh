#!/usr/bin/env bash
# bench/rls.sh BUILD_DIR: Envoy's rate limit service behind `make bench`.
#
# Starts a redis-server of its own and BUILD_DIR/daemon/sluiced with [envoy]
# on a Unix socket and one global limit per descriptor key (high enough
# never to deny), then drives ShouldRateLimit with BUILD_DIR/bench/rls_load:
#   one-descriptor     one hot descriptor per call, as fast as it answers;
#   four-descriptors   four descriptors per call (four decisions), the same;
#   half-target        one descriptor paced at 25,000/s, half the issue's
#                      50,000/s target: the latency at a load it names;
#   half-rate          one descriptor paced at half the one-descriptor rate
#                      this run measured: the same, stricter when the
#                      measured rate is above the target;
#   overload           one round paced at twice the one-descriptor rate:
#                      most calls reach their deadline (below);
#   after overload     one round at half rate again, straight after: the
#                      front recovers instead of answering a backlog;
#   redis-down         Redis stopped (SIGSTOP, so its calls hang until
#                      lease_timeout) at a paced 1,000 calls/s: every call
#                      is answered from the node's share, p99 shows the wait.
# Redis calls per RPC: every client command Redis counted (INFO
# commandstats, as bench/global.sh sums them) over the calls answered.
# sluiced CPU µs per call: the daemon's user + system CPU time (/proc) over
# the calls answered, which a busy machine disturbs far less than calls/s;
# rls_load CPU µs per call: the driver's own, what it takes from the cores
# it shares with sluiced.
# Switches per call: the context switches of sluiced's threads (voluntary
# and not, /proc/PID/task/*/status) over the calls answered: the thread
# hops a call costs.
# The reference, measured on the same daemon in the same run: MessagePack-RPC
# acquires on the same hot global rule over the daemon's own socket, one at
# a time (bench/load sync: the round trip) and pipelined (2 connections × 64
# in flight: the throughput), so the gRPC figures read as ratios to them.
# rls_load (its header says how) speaks gRPC over nghttp2's HTTP/2, as
# Envoy's client does, one connection per BENCH_THREADS, at a few µs of CPU
# a call (gRPC's C++ client cost 15 to 45, CPU taken from sluiced on the
# same cores). Closed loop, a thread per connection, each answer sends the
# next call; paced, one thread for all connections, every call leaves at
# its own due time (evenly spaced), as Envoy sends each call when its
# request arrives, not in bursts; latency runs from the due time to the
# answer (a send the busy machine delayed counts its delay), and
# send_lag_p99_us says how late the sends left.
# Every call has a deadline, BENCH_DEADLINE_MS (20, Envoy's default
# timeout): rls_load sends it as grpc-timeout and gives up on the call
# then, as Envoy does; such calls are counted as "deadline exceeded", not
# as errors, and their latency (20 ms or more) counts in p50/p99.
# Each row is the median of BENCH_ROUNDS rounds (3; BENCH_MODE=quick: 1).
# Knobs: BENCH_SECONDS (3), BENCH_ROUNDS (3), BENCH_THREADS (2), BENCH_DEPTH (32),
# BENCH_DEADLINE_MS (20), BENCH_RLS_THREADS and BENCH_RLS_SPIN_US (sluiced's
# [envoy] threads and poll_spin_us; its defaults when unset), BENCH_SPIN_US
# (rls_load's SPIN_US, paced: poll for a call due within it; 0),
# BENCH_BATCH_US (rls_load's BATCH_US, paced: the calls due within each tick
# of it leave together at its end; 0: each at its own time).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_setup rls.sh "$@"
seconds=${BENCH_SECONDS:-3}
rounds=${BENCH_ROUNDS:-3}
threads=${BENCH_THREADS:-2}
depth=${BENCH_DEPTH:-32}
deadline_ms=${BENCH_DEADLINE_MS:-20}
spin_us=${BENCH_SPIN_US:-0}
batch_us=${BENCH_BATCH_US:-0}
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
${BENCH_RLS_THREADS:+threads = $BENCH_RLS_THREADS}
${BENCH_RLS_SPIN_US:+poll_spin_us = $BENCH_RLS_SPIN_US}
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

# sluiced's user + system CPU time, in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$daemon_pid/stat"; }
tick_us=$((1000000 / $(getconf CLK_TCK)))
# The context switches of sluiced's threads so far.
switches() { cat /proc/"$daemon_pid"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }'; }
# CPU µs per call: TICKS over CALLS.
cpu_per_call() { awk -v t="$1" -v c="$2" -v u="$tick_us" 'BEGIN { printf "%.1f", c ? t * u / c : 0 }'; }

rows=()
last_rate=0
one_cpu=0
# One round: rls_load's line with redis_calls_per_rpc=, cpu_us_per_call=
# and switches_per_call=.
round() {  # DESCRIPTORS SECONDS THREADS DEPTH RATE
  local before after ticks out answered hops
  before=$(redis_calls)
  ticks=$(cpu_ticks)
  hops=$(switches)
  out=$("$rls_load" "$target" "$@" 1 "$deadline_ms" "$spin_us" "$batch_us")
  hops=$(($(switches) - hops))
  ticks=$(($(cpu_ticks) - ticks))
  after=$(redis_calls)
  answered=$(($(field ok "$out") + $(field over_limit "$out") + $(field deadline_exceeded "$out") +
    $(field errors "$out")))
  echo "$out redis_calls_per_rpc=$(awk -v a="$answered" -v r=$((after - before)) \
    'BEGIN { printf "%.4f", r / a }') cpu_us_per_call=$(cpu_per_call "$ticks" "$answered") \
switches_per_call=$(awk -v h="$hops" -v a="$answered" 'BEGIN { printf "%.2f", a ? h / a : 0 }')"
}

# The median of `rounds` rounds: by calls/s as fast as it answers, by p99
# when paced (the rate is set); its whole line goes in the table.
measure() {  # NAME DESCRIPTORS [RATE [ROUNDS]]
  local name=$1 descriptors=$2 rate=${3:-0} count=${4:-$rounds} key=calls_per_s lines=() out
  [ "$rate" = 0 ] || key=p99_us
  for _ in $(seq "$count"); do
    lines+=("$(round "$descriptors" "$seconds" "$threads" "$depth" "$rate")")
    echo "$name: ${lines[-1]}" >&2
  done
  out=$(for line in "${lines[@]}"; do echo "$(field "$key" "$line") $line"; done |
    sort -n | sed -n "$(((count + 1) / 2))p" | cut -d' ' -f2-)
  rows+=("| $name | $(field calls_per_s "$out") | $(field p50_us "$out") | $(field p99_us "$out") | $(field cpu_us_per_call "$out") | $(field switches_per_call "$out") | $(field driver_cpu_us_per_call "$out") | $(field redis_calls_per_rpc "$out") | $(field deadline_exceeded "$out") | $(field errors "$out") |")
  last_rate=$(field calls_per_s "$out")
  last_p99=$(field p99_us "$out")
  last_calls=$(field redis_calls_per_rpc "$out")
  last_cpu=$(field cpu_us_per_call "$out")
  last_lag=$(field send_lag_p99_us "$out")
}

# The references: MessagePack-RPC on the same daemon, rule and key.
sync=$("$build/bench/load" sync "$tmp/d.sock" bench/k0 hot "$seconds")
echo "reference (sync): $sync" >&2
ticks=$(cpu_ticks)
ref=$("$build/bench/load" pipelined "$tmp/d.sock" bench/k0 hot 2 64 "$seconds")
ticks=$(($(cpu_ticks) - ticks))
ref_rate=$(field rate_per_s "$ref")
ref_cpu=$(cpu_per_call "$ticks" "$(field n "$ref")")
echo "reference: $ref sluiced_cpu_us_per_call=$ref_cpu" >&2

measure one-descriptor 1
one_rate=${last_rate%.*}
one_cpu=$last_cpu
one_calls=$last_calls
half=$((one_rate / 2))
measure four-descriptors 4
four_rate=${last_rate%.*}
target_half=25000
measure "half-target ($target_half/s, paced)" 1 "$target_half"
target_half_p99=$last_p99
measure "half-rate ($half/s, paced)" 1 "$half"
half_p99=$last_p99
half_lag=$last_lag
measure "overload ($((one_rate * 2))/s, paced)" 1 $((one_rate * 2)) 1
measure "after overload ($half/s, paced)" 1 "$half" 1
after_p99=$last_p99
kill -STOP "$redis_pid"
sleep 1  # the health check notices (health_interval + health_timeout)
down=$("$rls_load" "$target" 1 "$seconds" 1 8 1000 1 "$deadline_ms" "$spin_us" "$batch_us" 2>&1 || true)
kill -CONT "$redis_pid"
rows+=("| redis-down (SIGSTOP, 1000/s, paced) | $(field calls_per_s "$down") | $(field p50_us "$down") | $(field p99_us "$down") | - | - | - | - | $(field deadline_exceeded "$down") | $(field errors "$down") |")
echo "redis-down: $down" >&2
down_p99=$(field p99_us "$down")
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

verdict() { if awk "BEGIN { exit !($1) }"; then echo met; else echo "not met"; fi; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", b ? a / b : 0 }'; }
result="$here/results/$(bench_result_name rls)"
{
  echo "# Envoy's rate limit service"
  echo
  echo "\`bench/rls.sh $(basename "$build")\` (\`make bench\`, a Release build) on $(nproc) CPUs,"
  echo "$(date -u +%Y-%m-%d), sluice $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'):"
  echo "rls_load (on the same CPUs as sluiced) with $threads connections × $depth calls in flight (a thread each), or"
  echo "paced (calls evenly spaced, one thread, latency from each call's due time), over a Unix socket; each row the median of $rounds rounds of ${seconds}s"
  echo "(by calls/s, or by p99 when paced); sluiced (default"
  echo "workers, [envoy] threads ${BENCH_RLS_THREADS:-default}, poll_spin_us ${BENCH_RLS_SPIN_US:-default}; rls_load SPIN_US $spin_us, BATCH_US $batch_us) with one global limit per descriptor key on a local redis-server, one hot key"
  echo "each. Load average (1, 5, 15 min) before the run: $load_before; after: $load_after."
  echo "Paced at half rate, 99 % of the sends left within $half_lag µs of their due time."
  echo "Every call had a ${deadline_ms} ms deadline (grpc-timeout; rls_load gives up then, as Envoy does)."
  echo
  echo "| row | calls/s | p50 µs | p99 µs | sluiced CPU µs per call | switches per call | rls_load CPU µs per call | Redis calls per RPC | deadline exceeded | errors |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
  echo
  echo "Reference, same daemon, rule and key, same run: MessagePack-RPC \`acquire\` over the"
  echo "daemon's socket, one at a time (\`bench/load sync\`): $(field rate_per_s "$sync") decisions/s,"
  echo "p50 $(field p50_us "$sync") µs, p99 $(field p99_us "$sync") µs; pipelined (\`bench/load"
  echo "pipelined\`, 2 connections × 64 in flight): $ref_rate decisions/s, sluiced CPU $ref_cpu µs"
  echo "per decision. One-descriptor RPCs/s are $(ratio "$one_rate" "$(field rate_per_s "$sync")") of the"
  echo "one-at-a-time rate and $(ratio "$one_rate" "$ref_rate") of the pipelined one (four descriptors:"
  echo "$(ratio "$four_rate" "$ref_rate")); a one-descriptor RPC costs sluiced $(ratio "$one_cpu" "$ref_cpu" | sed 's/0*$//; s/\.$//')× the CPU of a"
  echo "pipelined decision."
  echo
  echo "| target (issue 20) | measured | |"
  echo "|---|---|---|"
  echo "| ≥ 50,000 RPCs/s, one descriptor | $one_rate | $(verdict "$one_rate >= 50000") |"
  echo "| p99 ≤ 1 ms at half that rate ($target_half/s) | $target_half_p99 µs | $(verdict "$target_half_p99 <= 1000") |"
  echo "| the same at half the rate measured ($half/s) | $half_p99 µs | $(verdict "$half_p99 <= 1000") |"
  echo "| the same, straight after an overload | $after_p99 µs | $(verdict "$after_p99 <= 1000") |"
  echo "| ≤ 0.01 Redis calls per RPC, hot descriptor | $one_calls | $(verdict "$one_calls <= 0.01") |"
  echo "| p99 ≤ 1 ms while Redis is down | $down_p99 µs | $(verdict "$down_p99 <= 1000") |"
  busy_warning "rerun on an idle machine for figures worth comparing."
} | tee "$result"
