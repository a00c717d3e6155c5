#!/usr/bin/env bash
# bench/run.sh BUILD_DIR: the local-path benchmark behind `make bench`.
#
# Starts BUILD_DIR/daemon/sluiced on a temporary config (a token bucket so
# large that every request is allowed, and a 1-per-hour rule for the denial
# path) and BUILD_DIR/bench/echo_server (a bare Unix-socket echo with the
# daemon's threading, answering blobs the size of real acquire requests with
# blobs the size of real responses), then measures both with BUILD_DIR/bench/load
# and prints one markdown table, also saved to bench/results/latest.md.
#
# The machine is shared, so every row is measured ROUNDS times, sluiced and
# echo interleaved, and the table shows the median round (by rate for
# pipelined rows, by p50 for sync rows) with the spread over the rounds.
#
# Knobs (environment): BENCH_SECONDS per measurement (2), BENCH_ROUNDS (3),
# BENCH_CONNECTIONS pipelined connections (2), BENCH_WINDOW requests in flight
# per connection (64), BENCH_KEYS distinct keys (1000000), BENCH_WORKERS
# threads of both servers (nproc), BENCH_PLACEMENT=0 skips the taskset pass.
set -euo pipefail

if [ $# -ne 1 ] || [ ! -x "$1/daemon/sluiced" ] || [ ! -x "$1/bench/load" ]; then
  echo "usage: bench/run.sh BUILD_DIR (a build with sluiced and bench/load built)" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
seconds=${BENCH_SECONDS:-2}
rounds=${BENCH_ROUNDS:-3}
conns=${BENCH_CONNECTIONS:-2}
window=${BENCH_WINDOW:-64}
nkeys=${BENCH_KEYS:-1000000}
workers=${BENCH_WORKERS:-$(nproc)}
placement=${BENCH_PLACEMENT:-1}
load="$build/bench/load"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

tmp=$(mktemp -d /tmp/slb.XXXXXX)  # short: a socket path has at most 107 bytes
sock="$tmp/d.sock"
echo_sock="$tmp/e.sock"
daemon_pid=
echo_pid=
cleanup() {
  for pid in $daemon_pid $echo_pid; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

wait_for_socket() {
  for _ in $(seq 100); do
    [ -S "$1" ] && return 0
    sleep 0.05
  done
  echo "bench: $1 did not appear" >&2
  exit 1
}

rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }

# Value of key=... on a line of load's output.
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<<"$2"; }

cat >"$tmp/bench.toml" <<EOF
# Written by bench/run.sh.
[daemon]
socket = "$sock"
workers = $workers
log_level = "warn"

[limits]
max_output_bytes = 67108864
idle_timeout = "0"

[keys]
max_keys = $((nkeys + nkeys / 10 + 16))
# Allowed keys are back at a full bucket at once; no sweep may drop them.
sweep_interval = "1h"

[[rule]]
name = "bench"
algorithm = "token_bucket"
limit = 1000000000
period = "1s"
burst = 1000000000

[[rule]]
name = "deny"
algorithm = "token_bucket"
limit = 1
period = "1h"
EOF

"$build/daemon/sluiced" --config "$tmp/bench.toml" --socket "$sock" &
daemon_pid=$!
wait_for_socket "$sock"

sizes=$("$load" sizes "$sock" bench)
req_bytes=$(field request_bytes "$sizes")
resp_bytes=$(field response_bytes "$sizes")

"$build/bench/echo_server" "$echo_sock" "$req_bytes" "$resp_bytes" "$workers" >/dev/null &
echo_pid=$!
wait_for_socket "$echo_sock"

echo "bench: sluiced pid $daemon_pid, echo_server pid $echo_pid, $workers workers each;" \
  "acquire request $req_bytes B, response $resp_bytes B" >&2

# Memory: RSS before and after one acquire on each of nkeys new keys.
rss_before=$(rss_kb "$daemon_pid")
warm=$("$load" warm "$sock" bench "$nkeys" "$conns" "$window")
rss_after=$(rss_kb "$daemon_pid")
warm_seconds=$(field seconds "$warm")

results="$tmp/results"
: >"$results"
measure() {  # ROW ROUND SERVER_PID COMMAND...
  local row=$1 round=$2 server_pid=$3
  shift 3
  local out
  out=$(BENCH_SERVER_PID=$server_pid "$@")
  echo "$row $round $out" >>"$results"
  echo "bench: $row round $round: $out" >&2
}

for round in $(seq "$rounds"); do
  measure sync-hot "$round" "$daemon_pid" "$load" sync "$sock" bench hot "$seconds"
  measure echo-sync "$round" "$echo_pid" "$load" echo-sync "$echo_sock" "$req_bytes" "$resp_bytes" "$seconds"
  measure sync-1M-keys "$round" "$daemon_pid" "$load" sync "$sock" bench "$nkeys" "$seconds"
  measure pipelined-hot "$round" "$daemon_pid" "$load" pipelined "$sock" bench hot "$conns" "$window" "$seconds"
  measure echo-pipelined "$round" "$echo_pid" "$load" echo-pipelined "$echo_sock" "$req_bytes" "$resp_bytes" \
    "$conns" "$window" "$seconds"
  measure pipelined-1M-keys "$round" "$daemon_pid" "$load" pipelined "$sock" bench "$nkeys" "$conns" "$window" "$seconds"
done
measure sync-denied 1 "$daemon_pid" "$load" sync "$sock" deny hot "$seconds"
measure pipelined-denied 1 "$daemon_pid" "$load" pipelined "$sock" deny hot "$conns" "$window" "$seconds"

# Placement pass: sync, hot key, each server pinned to CPU 0 with all its
# threads, the client on the same CPU or on the other one.
placement_rows=
if [ "$placement" = 1 ] && command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  taskset -a -p -c 0 "$daemon_pid" >/dev/null
  taskset -a -p -c 0 "$echo_pid" >/dev/null
  for cpu in 0 1; do
    name=$([ "$cpu" = 0 ] && echo same-cpu || echo split-cpus)
    measure "sync-hot/$name" 1 "$daemon_pid" taskset -c "$cpu" "$load" sync "$sock" bench hot "$seconds"
    measure "echo-sync/$name" 1 "$echo_pid" taskset -c "$cpu" "$load" echo-sync "$echo_sock" "$req_bytes" \
      "$resp_bytes" "$seconds"
  done
  taskset -a -p -c "0-$(($(nproc) - 1))" "$daemon_pid" >/dev/null
  taskset -a -p -c "0-$(($(nproc) - 1))" "$echo_pid" >/dev/null
  placement_rows=1
fi

stats=$("$build/client/sluicectl" --socket "$sock" --json stats 2>/dev/null || true)
key_count=$(grep -o '"count": *[0-9]*' <<<"$stats" | grep -o '[0-9]*$' || echo "?")
evictions=$(grep -o '"forced_evictions": *[0-9]*' <<<"$stats" | grep -o '[0-9]*$' || echo "?")

# The table. awk picks each row's median round and computes the ratios.
report() {
  echo "## sluice local-path benchmark"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -srm), $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1))," \
    "load average before: $load_before."
  echo "sluiced and echo_server: $workers worker threads each; client and servers unpinned." \
    "Each measurement: 0.5 s warm-up, then ${seconds} s; median of $rounds interleaved rounds" \
    "(spread = min..max of the headline figure over the rounds)."
  echo "Rule \`bench\`: token bucket, limit 1e9 per 1s, burst 1e9 (every request allowed)." \
    "Pipelined: $conns connections x $window in flight, one thread each." \
    "Keys are 8 bytes; an acquire request is $req_bytes B and its response $resp_bytes B;" \
    "the echo sends and answers blobs of exactly those sizes."
  echo "CPUs client+server: CPU-seconds per second that load and the server got during the measurement" \
    "(at most $(nproc)); per CPU-second = decisions/s divided by that, which is what the figures would be" \
    "per core if nothing else ran."
  if awk -v l="${load_before%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
    echo
    echo "**Warning: the machine was busy before the run (1-min load average ${load_before%% *} on $(nproc) CPUs);" \
      "rates are lower bounds and vary between rounds: compare rows through the CPU and per-CPU-second columns.**"
  fi
  echo
  awk -v rounds="$rounds" '
    function val(line, key,   i, n, parts, kv) {
      n = split(line, parts, " ")
      for (i = 3; i <= n; i++) { split(parts[i], kv, "="); if (kv[1] == key) return kv[2] }
      return ""
    }
    function median_line(row,   i, j, n, keys, tmp, lines, k, headline) {
      n = count[row]
      headline = (row ~ /^pipelined|^echo-pipelined/) ? "rate_per_s" : "p50_us"
      for (i = 1; i <= n; i++) { keys[i] = val(line[row, i], headline) + 0; lines[i] = line[row, i] }
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (keys[j] < keys[i]) {
        tmp = keys[i]; keys[i] = keys[j]; keys[j] = tmp
        tmp = lines[i]; lines[i] = lines[j]; lines[j] = tmp
      }
      lo[row] = keys[1]; hi[row] = keys[n]
      return lines[int((n + 1) / 2)]
    }
    function us(x) { return x == "" ? "" : sprintf("%.1f", x) }
    function cpus(m) { return sprintf("%.2f+%.2f", val(m, "client_cpus"), val(m, "server_cpus")) }
    function per_cpu(m,   c) {
      c = val(m, "client_cpus") + val(m, "server_cpus")
      return c > 0 ? sprintf("%.0f", val(m, "rate_per_s") / c) : "-"
    }
    function spread(row) {
      if (count[row] < 2) return "-"
      if (row ~ /pipelined/) return sprintf("%.2f..%.2fM/s", lo[row] / 1e6, hi[row] / 1e6)
      return sprintf("p50 %.1f..%.1f", lo[row], hi[row])
    }
    { row = $1; count[row]++; line[row, count[row]] = $0; if (!(row in seen)) { order[++rows] = row; seen[row] = 1 } }
    END {
      for (r = 1; r <= rows; r++) med[order[r]] = median_line(order[r])
      es_p50 = val(med["echo-sync"], "p50_us"); ep_rate = val(med["echo-pipelined"], "rate_per_s")
      print "| row | decisions/s | p50 µs | p99 µs | p999 µs | spread | CPUs client+server | per CPU-second | vs echo | target |"
      print "|---|---:|---:|---:|---:|---|---:|---:|---:|---|"
      for (r = 1; r <= rows; r++) {
        row = order[r]; m = med[row]
        if (row ~ /\//) continue
        rate = val(m, "rate_per_s"); vs = ""; target = ""
        if (row ~ /^sync-(hot|1M)/ && es_p50 > 0) {
          ratio = val(m, "p50_us") / es_p50
          vs = sprintf("p50 %.2fx", ratio)
          target = sprintf("p50 <= 1.5x echo: %s", ratio <= 1.5 ? "PASS" : "MISS")
        }
        if (row ~ /^pipelined-(hot|1M)/ && ep_rate > 0) {
          ratio = rate / ep_rate
          vs = sprintf("%.0f%% of rate", 100 * ratio)
          target = sprintf(">= 1M/s: %s; >= 50%% of echo: %s", rate >= 1e6 ? "PASS" : "MISS", ratio >= 0.5 ? "PASS" : "MISS")
        }
        if (row ~ /denied/) target = (val(m, "allowed") == 0 && val(m, "errors") == 0) ? "(every answer a denial)" : sprintf("(%s allowed, %s errors!)", val(m, "allowed"), val(m, "errors"))
        printf "| %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s |\n", row, rate, us(val(m, "p50_us")), us(val(m, "p99_us")), us(val(m, "p999_us")), spread(row), cpus(m), per_cpu(m), vs, target
      }
      placed = 0
      for (r = 1; r <= rows; r++) if (order[r] ~ /\//) placed = 1
      if (placed) {
        print ""
        print "Placement (sync, hot key, one round; each server pinned to CPU 0, the client on CPU 0 = same-cpu or CPU 1 = split-cpus):"
        print ""
        print "| row | decisions/s | p50 µs | p99 µs | p999 µs | CPUs client+server | p50 vs echo |"
        print "|---|---:|---:|---:|---:|---:|---:|"
        for (r = 1; r <= rows; r++) {
          row = order[r]; if (row !~ /\//) continue
          m = med[row]; split(row, part, "/")
          ref = med["echo-sync/" part[2]]; vs = ""
          if (part[1] == "sync-hot" && val(ref, "p50_us") > 0) vs = sprintf("%.2fx", val(m, "p50_us") / val(ref, "p50_us"))
          printf "| %s | %.0f | %s | %s | %s | %s | %s |\n", row, val(m, "rate_per_s"), us(val(m, "p50_us")), us(val(m, "p99_us")), us(val(m, "p999_us")), cpus(m), vs
        }
      }
    }' "$results"
  echo
  local per_key=$(((rss_after - rss_before) * 1024 / nkeys))
  echo "Memory: sluiced VmRSS $((rss_before / 1024)) MiB before and $((rss_after / 1024)) MiB after one acquire on" \
    "each of $nkeys new keys (took ${warm_seconds} s): $per_key bytes per warm key" \
    "(target <= 256: $([ "$per_key" -le 256 ] && echo PASS || echo MISS));" \
    "whole RSS / keys = $((rss_after * 1024 / nkeys)) bytes. The bucket array sized by max_keys" \
    "($((nkeys + nkeys / 10 + 16))) is allocated at start and counts in 'before'." \
    "Keys held at the end: $key_count, forced evictions: $evictions."
  echo
  echo "Reproduce: \`make bench\`, or \`BENCH_SECONDS=$seconds BENCH_ROUNDS=$rounds BENCH_CONNECTIONS=$conns" \
    "BENCH_WINDOW=$window BENCH_KEYS=$nkeys bench/run.sh build-release\`;" \
    "one row by hand: \`build-release/bench/load pipelined SOCKET bench hot $conns $window $seconds\`."
}

mkdir -p "$here/results"
report | tee "$here/results/latest.md"
