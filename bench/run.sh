#!/usr/bin/env bash
# bench/run.sh BUILD_DIR: the local-path benchmark behind `make bench`.
#
# Starts BUILD_DIR/daemon/sluiced on a temporary config (a token bucket so
# large that every request is allowed, and a 1-per-hour rule for the denial
# path) and two references built from BUILD_DIR/bench/echo_server, a bare
# Unix-socket server with the daemon's threading and I/O pattern:
#   echo      raw: load writes blobs the size of a real acquire request with
#             read()/write() and gets blobs the size of a real response; no
#             per-message work at either end (the socket floor);
#   rpc-echo  (echo_server --rpc) driven through libsluice exactly like
#             sluiced (same calls, window, connections, placement), it answers
#             every request frame with a canned copy of a real sluiced acquire
#             response carrying the request's msgid: same client, same bytes
#             on the wire, and only the daemon's work missing.
# It measures all three with BUILD_DIR/bench/load and prints one markdown
# table, also saved to bench/results/latest.md. The targets are judged
# against rpc-echo, so that they measure what the daemon adds; the ratio to
# the raw echo is printed too, as the socket floor.
#
# Placement. A sync request is one wake-up of the server and one of the
# client, so its latency depends mostly on where the two run: on a VM,
# waking a thread on another CPU can cost far more than the work itself, and
# an unpinned run lands the client and the server on the same CPU or on
# different ones at random. The sync rows (sluiced and echo alike) are
# therefore measured in fixed placements, and a sync row is only ever
# compared with the echoes measured in the same placement:
#   same-cpu    every server thread and the client pinned to CPU 0
#   split-cpus  every server thread pinned to CPU 0, the client to CPU 1
#   unpinned    no pinning (the pipelined rows, which are throughput with
#               several connections and threads, always run this way)
#
# The machine is shared, so every row is measured ROUNDS times, sluiced and
# both echoes interleaved, and the table shows the median round (by rate for
# pipelined rows, by p50 for sync rows) with the spread over the rounds.
#
# Knobs (environment): BENCH_SECONDS per pipelined measurement (2),
# BENCH_SYNC_SECONDS per sync measurement (1: even split-cpus gets thousands
# of samples), BENCH_ROUNDS (3), BENCH_SYNC_ROUNDS rounds of the sync rows (5:
# they are short, and a shared machine flips their latency between rounds),
# BENCH_CONNECTIONS pipelined connections (2),
# BENCH_WINDOW requests in flight per connection (64), BENCH_KEYS distinct
# keys (1000000), BENCH_WORKERS threads of both servers (nproc),
# BENCH_PLACEMENTS the placements of the sync rows ("same-cpu split-cpus";
# BENCH_PLACEMENT=0, the old knob, means "unpinned").
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_setup run.sh "$@"
seconds=${BENCH_SECONDS:-2}
sync_seconds=${BENCH_SYNC_SECONDS:-1}
rounds=${BENCH_ROUNDS:-3}
sync_rounds=${BENCH_SYNC_ROUNDS:-5}
conns=${BENCH_CONNECTIONS:-2}
window=${BENCH_WINDOW:-64}
nkeys=${BENCH_KEYS:-1000000}
workers=${BENCH_WORKERS:-$(nproc)}
if [ "${BENCH_PLACEMENT:-1}" = 0 ]; then
  placements=${BENCH_PLACEMENTS:-unpinned}
else
  placements=${BENCH_PLACEMENTS:-same-cpu split-cpus}
fi
for p in $placements; do
  case $p in
    same-cpu | unpinned) ;;
    split-cpus)
      if [ "$(nproc)" -lt 2 ]; then
        echo "bench: split-cpus needs 2 CPUs; set BENCH_PLACEMENTS=same-cpu" >&2
        exit 2
      fi
      ;;
    *)
      echo "bench: unknown placement '$p' (same-cpu, split-cpus, unpinned)" >&2
      exit 2
      ;;
  esac
  if [ "$p" != unpinned ] && ! command -v taskset >/dev/null; then
    echo "bench: placement $p needs taskset (util-linux); set BENCH_PLACEMENTS=unpinned" >&2
    exit 2
  fi
done
load="$build/bench/load"

tmp=$(mktemp -d /tmp/slb.XXXXXX)  # short: a socket path has at most 107 bytes
sock="$tmp/d.sock"
echo_sock="$tmp/e.sock"
rpc_sock="$tmp/r.sock"
daemon_pid=
echo_pid=
rpc_pid=
cleanup() {
  for pid in $daemon_pid $echo_pid $rpc_pid; do
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


{
  bench_daemon_tables "$sock" "$workers"
  cat <<EOF

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
} >"$tmp/bench.toml"

"$build/daemon/sluiced" --config "$tmp/bench.toml" --socket "$sock" &
daemon_pid=$!
wait_for_socket "$sock"

sizes=$("$load" sizes "$sock" bench)
req_bytes=$(field request_bytes "$sizes")
resp_bytes=$(field response_bytes "$sizes")
resp_hex=$(field response_hex "$sizes")

"$build/bench/echo_server" "$echo_sock" "$req_bytes" "$resp_bytes" "$workers" >/dev/null &
echo_pid=$!
"$build/bench/echo_server" --rpc "$rpc_sock" "$resp_hex" "$workers" >/dev/null &
rpc_pid=$!
wait_for_socket "$echo_sock"
wait_for_socket "$rpc_sock"
# rpc-echo must answer libsluice's request with sluiced's exact bytes.
rpc_sizes=$("$load" sizes "$rpc_sock" bench)
if [ "$(field response_hex "$rpc_sizes")" != "$resp_hex" ]; then
  echo "bench: rpc-echo answers $(field response_hex "$rpc_sizes"), sluiced $resp_hex" >&2
  exit 1
fi

echo "bench: sluiced pid $daemon_pid, echo_server pid $echo_pid, rpc-echo pid $rpc_pid," \
  "$workers workers each; acquire request $req_bytes B, response $resp_bytes B" >&2

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

# The CPUs this script may use: what the servers go back to when unpinned.
all_cpus=$(taskset -c -p $$ 2>/dev/null | sed 's/.*: *//' || true)
# Pins every thread of both servers to CPU list $1 ("" = unpin). Threads the
# servers start later inherit their creator's affinity.
place_servers() {
  command -v taskset >/dev/null || return 0
  local cpus=${1:-$all_cpus} pid
  [ -n "$cpus" ] || return 0
  for pid in $daemon_pid $echo_pid $rpc_pid; do
    taskset -a -p -c "$cpus" "$pid" >/dev/null
  done
}
# Warns when a thread of server $1 may run elsewhere than CPU list $2.
check_affinity() {
  local status allowed
  for status in /proc/"$1"/task/*/status; do
    allowed=$(awk '/^Cpus_allowed_list:/ { print $2 }' "$status" 2>/dev/null) || continue
    [ -z "$allowed" ] || [ "$allowed" = "$2" ] ||
      echo "bench: warning: thread ${status%/status} may run on CPUs $allowed, not $2" >&2
  done
}
# Sets `client` (the command prefix of load) and pins the servers for
# placement $1.
client=()
place() {
  case $1 in
    same-cpu) place_servers 0; client=(taskset -c 0) ;;
    split-cpus) place_servers 0; client=(taskset -c 1) ;;
    unpinned) place_servers ""; client=() ;;
  esac
  if [ "$1" != unpinned ]; then
    check_affinity "$daemon_pid" 0
    check_affinity "$echo_pid" 0
    check_affinity "$rpc_pid" 0
  fi
}

# Rows are named ROW@PLACEMENT. In every round, each placement's sync rows,
# then the (unpinned) pipelined rows; sluiced and both echoes interleaved
# throughout.
# The sync rows get the first sync_rounds rounds, the pipelined rows the
# first `rounds`.
for round in $(seq "$((rounds > sync_rounds ? rounds : sync_rounds))"); do
  for p in $placements; do
    [ "$round" -le "$sync_rounds" ] || break
    place "$p"
    measure "sync-hot@$p" "$round" "$daemon_pid" "${client[@]}" "$load" sync "$sock" bench hot "$sync_seconds"
    measure "echo-sync@$p" "$round" "$echo_pid" "${client[@]}" "$load" echo-sync "$echo_sock" \
      "$req_bytes" "$resp_bytes" "$sync_seconds"
    measure "rpc-echo-sync@$p" "$round" "$rpc_pid" "${client[@]}" "$load" sync "$rpc_sock" bench hot "$sync_seconds"
    measure "sync-1M-keys@$p" "$round" "$daemon_pid" "${client[@]}" "$load" sync "$sock" bench "$nkeys" \
      "$sync_seconds"
  done
  place unpinned
  [ "$round" -le "$rounds" ] || continue
  measure pipelined-hot@unpinned "$round" "$daemon_pid" "$load" pipelined "$sock" bench hot "$conns" "$window" \
    "$seconds"
  measure echo-pipelined@unpinned "$round" "$echo_pid" "$load" echo-pipelined "$echo_sock" "$req_bytes" \
    "$resp_bytes" "$conns" "$window" "$seconds"
  measure rpc-echo-pipelined@unpinned "$round" "$rpc_pid" "$load" pipelined "$rpc_sock" bench hot "$conns" \
    "$window" "$seconds"
  measure pipelined-1M-keys@unpinned "$round" "$daemon_pid" "$load" pipelined "$sock" bench "$nkeys" "$conns" \
    "$window" "$seconds"
done
# Denials: one round each; the sync one in every sync placement, so that its
# latency can be read next to sync-hot's.
for p in $placements; do
  place "$p"
  measure "sync-denied@$p" 1 "$daemon_pid" "${client[@]}" "$load" sync "$sock" deny hot "$sync_seconds"
done
place unpinned
measure pipelined-denied@unpinned 1 "$daemon_pid" "$load" pipelined "$sock" deny hot "$conns" "$window" "$seconds"

stats=$("$build/client/sluicectl" --socket "$sock" --json stats 2>/dev/null || true)
key_count=$(grep -o '"count": *[0-9]*' <<<"$stats" | grep -o '[0-9]*$' || echo "?")
evictions=$(grep -o '"forced_evictions": *[0-9]*' <<<"$stats" | grep -o '[0-9]*$' || echo "?")

# The table. awk picks each row's median round and computes the ratios.
placement_text() {
  case $1 in
    same-cpu) echo "**same-cpu** = every thread of the server (sluiced or echo_server) and the client (load) pinned to CPU 0" ;;
    split-cpus) echo "**split-cpus** = every thread of the server pinned to CPU 0, the client to CPU 1" ;;
    unpinned) echo "**unpinned** = no pinning, the scheduler places client and server threads" ;;
  esac
}
report() {
  local p legend=
  for p in $placements unpinned; do
    case " $legend " in *"$(placement_text "$p")"*) continue ;; esac
    legend="${legend:+$legend; }$(placement_text "$p")"
  done
  echo "## sluice local-path benchmark"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -srm), $(nproc) CPUs ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1))," \
    "load average before: $load_before."
  echo "sluiced and both echo_servers (echo, rpc-echo): $workers worker threads each." \
    "Each measurement: 0.5 s warm-up, then ${sync_seconds} s (sync rows) or ${seconds} s (pipelined rows);" \
    "median of $sync_rounds (sync rows) or $rounds (pipelined rows) interleaved rounds" \
    "(spread = min..max of the headline figure over the rounds;" \
    "denial rows: one round)."
  echo "Rule \`bench\`: token bucket, limit 1e9 per 1s, burst 1e9 (every request allowed)." \
    "Pipelined: $conns connections x $window in flight, one thread each." \
    "Keys are 8 bytes; an acquire request is $req_bytes B and its response $resp_bytes B;" \
    "the raw echo sends and answers blobs of exactly those sizes with read()/write();" \
    "rpc-echo (\`echo_server --rpc\`) is driven through libsluice exactly like sluiced and answers each" \
    "request frame with a copy of a real sluiced acquire response, the request's msgid spliced in."
  echo "CPUs client+server: CPU-seconds per second that load and the server got during the measurement" \
    "(at most $(nproc)); per CPU-second = decisions/s divided by that, which is what the figures would be" \
    "per core if nothing else ran."
  echo
  echo "**Placement** (column 2): $legend." \
    "A sync request costs a wake-up of the server and one of the client, which on this kind of VM is" \
    "far cheaper on one CPU than across two, so each sync row is compared only with the echoes in the" \
    "same placement. Pipelined rows are throughput over $conns connections and run unpinned."
  echo
  echo "**Reference of the verdicts: rpc-echo.** Every target compares sluiced with rpc-echo in the same" \
    "placement, because it has the same client (libsluice encoding requests and decoding responses: the" \
    "'CPUs client' column shows what that costs), the same calls and the same bytes on the wire, so the ratio is what the daemon adds" \
    "over bare transport; the raw echo also skips the client's per-message work, so the ratio to it" \
    "(column 'vs echo (socket floor)', never judged) mixes the daemon's cost with the client library's."
  case " $placements " in *" unpinned "*)
    echo
    echo "**Warning: sync rows ran unpinned (BENCH_PLACEMENTS=$placements): each measurement put client and" \
      "server on one CPU or on two by chance, so their p50s and the sync verdicts depend on luck.**" ;;
  esac
  busy_warning "rates are lower bounds and vary between rounds: compare rows through the CPU and per-CPU-second columns."
  echo
  awk -v rounds="$rounds" -v placements="$placements" '
    function val(line, key,   i, n, parts, kv) {
      n = split(line, parts, " ")
      for (i = 3; i <= n; i++) { split(parts[i], kv, "="); if (kv[1] == key) return kv[2] }
      return ""
    }
    function median_line(row,   i, j, n, keys, tmp, lines, k, headline) {
      n = count[row]
      headline = (row ~ /pipelined/) ? "rate_per_s" : "p50_us"
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
      # Print the rows grouped by placement: the sync placements in the order
      # asked for, then unpinned; within one, sync rows before pipelined ones,
      # each in the order first measured.
      np = split(placements, place, " ")
      if (placements !~ /(^| )unpinned( |$)/) place[++np] = "unpinned"
      print "| row | placement | decisions/s | p50 µs | p99 µs | p999 µs | spread | CPUs client+server | per CPU-second | vs rpc-echo (same placement) | vs echo (socket floor) | target |"
      print "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|"
      for (q = 1; q <= np; q++) for (pass = 1; pass <= 2; pass++) for (r = 1; r <= rows; r++) {
        row = order[r]; split(row, part, "@"); name = part[1]; pl = part[2]
        if (pl != place[q] || (pass == 1) == (name ~ /pipelined/)) continue
        m = med[row]; rate = val(m, "rate_per_s"); vs = ""; floor = ""; target = ""
        es_p50 = val(med["echo-sync@" pl], "p50_us"); ep_rate = val(med["echo-pipelined@" pl], "rate_per_s")
        rs_p50 = val(med["rpc-echo-sync@" pl], "p50_us"); rp_rate = val(med["rpc-echo-pipelined@" pl], "rate_per_s")
        is_sync = name ~ /^sync-(hot|1M)/; is_pipe = name ~ /^pipelined-(hot|1M)/
        if ((is_sync || name == "rpc-echo-sync") && es_p50 > 0)
          floor = sprintf("p50 %.2fx", val(m, "p50_us") / es_p50)
        if ((is_pipe || name == "rpc-echo-pipelined") && ep_rate > 0)
          floor = sprintf("%.0f%% of rate", 100 * rate / ep_rate)
        if (is_sync && rs_p50 > 0) {
          ratio = val(m, "p50_us") / rs_p50
          vs = sprintf("p50 %.2fx", ratio)
          verdict = ratio <= 1.5 ? "PASS" : "MISS"
          target = sprintf("p50 <= 1.5x rpc-echo: %s", verdict)
          summary[pl] = summary[pl] sprintf("%s%s %.2fx %s (socket floor %s)", summary[pl] == "" ? "" : ", ", name, ratio, verdict, floor)
        }
        if (is_pipe && rp_rate > 0) {
          ratio = rate / rp_rate
          vs = sprintf("%.0f%% of rate", 100 * ratio)
          target = sprintf(">= 1M/s: %s; >= 50%% of rpc-echo: %s", rate >= 1e6 ? "PASS" : "MISS", ratio >= 0.5 ? "PASS" : "MISS")
          psummary = psummary sprintf("%s%s %.2fM/s, %.0f%% of rpc-echo: %s (socket floor %s)", psummary == "" ? "" : ", ", name, rate / 1e6, 100 * ratio, (rate >= 1e6 && ratio >= 0.5) ? "PASS" : "MISS", floor)
        }
        if (name ~ /^rpc-echo/ && val(m, "errors") != 0) target = sprintf("(%s errors!)", val(m, "errors"))
        if (name ~ /denied/) target = (val(m, "allowed") == 0 && val(m, "errors") == 0) ? "(every answer a denial)" : sprintf("(%s allowed, %s errors!)", val(m, "allowed"), val(m, "errors"))
        printf "| %s | %s | %.0f | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", name, pl, rate, us(val(m, "p50_us")), us(val(m, "p99_us")), us(val(m, "p999_us")), spread(row), cpus(m), per_cpu(m), vs, floor, target
      }
      line_out = ""
      for (q = 1; q <= np; q++) if (place[q] in summary) line_out = line_out sprintf("%s**%s**: %s", line_out == "" ? "" : "; ", place[q], summary[place[q]])
      if (line_out != "") { print ""; print "Sync target (p50 <= 1.5x the p50 of rpc-echo-sync in the same placement): " line_out "." }
      if (psummary != "") { print ""; print "Pipelined target (>= 1M/s and >= 50% of the rate of rpc-echo-pipelined): " psummary "." }
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
  echo "Reproduce: \`make bench\`, or \`BENCH_SECONDS=$seconds BENCH_SYNC_SECONDS=$sync_seconds BENCH_ROUNDS=$rounds BENCH_SYNC_ROUNDS=$sync_rounds" \
    "BENCH_CONNECTIONS=$conns BENCH_WINDOW=$window BENCH_KEYS=$nkeys BENCH_PLACEMENTS='$placements'" \
    "bench/run.sh build-release\`; one row by hand: \`build-release/bench/load pipelined SOCKET bench hot $conns" \
    "$window $seconds\`, or for split-cpus: \`taskset -a -p -c 0 SERVER_PID; taskset -c 1" \
    "build-release/bench/load sync SOCKET bench hot $sync_seconds\`."
}

mkdir -p "$here/results"
report | tee "$here/results/$(bench_result_name latest)"
