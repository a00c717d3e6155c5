#!/usr/bin/env bash
# bench/rls_compare.sh OLD_BUILD NEW_BUILD: Envoy's rate limit service of two
# builds side by side at paced rates, for a change to the front's or the
# driver's cost a call on a machine too shared for bench/rls.sh's rates.
#
# Starts one redis-server and, from each build, one sluiced with
# bench/rls.sh's config (one global limit per descriptor key, never
# denying). Then, in interleaved rounds (the pairs' order turning each
# round, so a machine that slows down during the run favours none), drives
# one descriptor paced at each of BENCH_RATES with three pairs of daemon and
# driver (each build's bench/rls_load):
#   old        OLD_BUILD's sluiced, OLD_BUILD's rls_load
#   old+drv    OLD_BUILD's sluiced, NEW_BUILD's rls_load (the driver's share)
#   new        NEW_BUILD's sluiced, NEW_BUILD's rls_load
# and prints one markdown table, each figure the median of its rounds:
# calls/s answered, p50 and p99 latency (each driver's own measure), calls
# past their 20 ms deadline, sluiced's CPU µs per call (/proc: user +
# system over the calls answered) and its threads' context switches per
# call, rls_load's CPU µs per call, the two together (the CPU the pair
# takes from the 2 cores it shares), and the p99 of how late the sends
# left. CPU a call is the figure that holds on a busy machine; p99 is
# indicative there. Both daemons run at once; one is driven at a time.
#
# Knobs (environment): BENCH_RATES ("20000 36951": 20,000/s and half the
# one-descriptor rate of bench/results/rls.md's quiet run), BENCH_SECONDS
# per round (3), BENCH_ROUNDS (5), BENCH_THREADS connections (2),
# BENCH_DEPTH (32), BENCH_DEADLINE_MS (20).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
if [ $# -ne 2 ]; then
  echo "usage: bench/rls_compare.sh OLD_BUILD NEW_BUILD (builds with sluiced and bench/rls_load)" >&2
  exit 2
fi
for b in "$1" "$2"; do
  if [ ! -x "$b/daemon/sluiced" ] || [ ! -x "$b/bench/rls_load" ]; then
    echo "bench: $b has no daemon/sluiced or bench/rls_load (a build with SLUICE_GRPC=ON)" >&2
    exit 2
  fi
done
old_build=$(cd "$1" && pwd)
new_build=$(cd "$2" && pwd)
rates=${BENCH_RATES:-20000 36951}
seconds=${BENCH_SECONDS:-3}
rounds=${BENCH_ROUNDS:-5}
threads=${BENCH_THREADS:-2}
depth=${BENCH_DEPTH:-32}
deadline_ms=${BENCH_DEADLINE_MS:-20}
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

tmp=$(mktemp -d /tmp/slrc.XXXXXX)
redis_pid=
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; done
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

# Starts BUILD's sluiced in DIR; its pid is appended to `pids`.
start_daemon() {  # BUILD DIR
  mkdir -p "$2"
  cat >"$2/bench.toml" <<EOF
# Written by bench/rls_compare.sh.
[daemon]
socket = "$2/d.sock"
log_level = "warn"

[redis]
url = "redis://127.0.0.1:$port"

[envoy]
listen = "unix:$2/rls.sock"
config = "$tmp/bench.yaml"
EOF
  "$1/daemon/sluiced" --config "$2/bench.toml" 2>"$2/sluiced.log" &
  pids+=($!)
  for _ in $(seq 100); do [ -S "$2/rls.sock" ] && break; sleep 0.05; done
  "$new_build/bench/rls_load" "unix:$2/rls.sock" 1 0.5 1 1 >/dev/null  # warm: the first lease
}
start_daemon "$old_build" "$tmp/old"
old_pid=${pids[0]}
start_daemon "$new_build" "$tmp/new"
new_pid=${pids[1]}

# The pairs: name, the daemon's pid and directory, the driver.
pair_names=(old old+drv new)
pair_pids=("$old_pid" "$old_pid" "$new_pid")
pair_dirs=("$tmp/old" "$tmp/old" "$tmp/new")
pair_drivers=("$old_build/bench/rls_load" "$new_build/bench/rls_load" "$new_build/bench/rls_load")

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
switches() { cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }'; }
tick_us=$((1000000 / $(getconf CLK_TCK)))

# One round of pair P at RATE: appends "rate pair calls_per_s p50 p99 late
# sluiced_us switches driver_us lag" to $tmp/rounds.
round() {  # P RATE
  local p=$1 rate=$2 pid ticks hops out answered
  pid=${pair_pids[$p]}
  ticks=$(cpu_ticks "$pid")
  hops=$(switches "$pid")
  out=$("${pair_drivers[$p]}" "unix:${pair_dirs[$p]}/rls.sock" 1 "$seconds" "$threads" "$depth" "$rate" 1 \
    "$deadline_ms" 2>&1 || true)
  ticks=$(($(cpu_ticks "$pid") - ticks))
  hops=$(($(switches "$pid") - hops))
  answered=$(($(field ok "$out") + $(field over_limit "$out") + $(field deadline_exceeded "$out") +
    $(field errors "$out")))
  echo "${pair_names[$p]} @ $rate: $out" >&2
  awk -v rate="$rate" -v pair="${pair_names[$p]}" -v calls="$(field calls_per_s "$out")" \
    -v p50="$(field p50_us "$out")" -v p99="$(field p99_us "$out")" \
    -v late="$(field deadline_exceeded "$out")" -v t="$ticks" -v u="$tick_us" -v h="$hops" \
    -v a="$answered" -v d="$(field driver_cpu_us_per_call "$out")" -v lag="$(field send_lag_p99_us "$out")" \
    'BEGIN { printf "%s %s %s %s %s %s %.1f %.2f %s %s\n", rate, pair, calls, p50, p99, late,
             a ? t * u / a : 0, a ? h / a : 0, d, lag }' >>"$tmp/rounds"
}

: >"$tmp/rounds"
for r in $(seq "$rounds"); do
  for rate in $rates; do
    for k in 0 1 2; do
      round $(((k + r) % 3)) "$rate"
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)

# The median of column C of the rounds of RATE and PAIR.
median() {  # RATE PAIR C
  awk -v rate="$1" -v pair="$2" -v c="$3" '$1 == rate && $2 == pair { print $c }' "$tmp/rounds" |
    sort -g | awk '{ v[NR] = $1 } END { print NR ? v[int((NR + 1) / 2)] : "-" }'
}

echo "\`bench/rls_compare.sh $(basename "$old_build") $(basename "$new_build")\` on $(nproc) CPUs, $(date -u '+%Y-%m-%d %H:%M') UTC:"
echo "one descriptor paced, $threads connections, ${deadline_ms} ms deadline, medians of $rounds interleaved rounds of ${seconds}s."
echo "Load average (1, 5, 15 min) before: $load_before; after: $load_after."
echo
echo "| rate/s | pair | calls/s | p50 µs | p99 µs | deadline exceeded | sluiced CPU µs a call | switches a call | rls_load CPU µs a call | both, µs a call | send lag p99 µs | p99 µs of each round |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for rate in $rates; do
  for name in "${pair_names[@]}"; do
    s=$(median "$rate" "$name" 7)
    d=$(median "$rate" "$name" 9)
    each=$(awk -v rate="$rate" -v pair="$name" '$1 == rate && $2 == pair { printf "%s%s", sep, $5; sep = ", " }' "$tmp/rounds")
    echo "| $rate | $name | $(median "$rate" "$name" 3) | $(median "$rate" "$name" 4) | $(median "$rate" "$name" 5) | $(median "$rate" "$name" 6) | $s | $(median "$rate" "$name" 8) | $d | $(awk -v s="$s" -v d="$d" 'BEGIN { printf "%.1f", s + d }') | $(median "$rate" "$name" 10) | $each |"
  done
done
