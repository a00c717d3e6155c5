#!/usr/bin/env bash
# bench/global.sh BUILD_DIR: the global-path benchmark behind `make bench`.
#
# Starts a redis-server of its own (a free loopback port, a temporary
# directory, no persistence) and BUILD_DIR/daemon/sluiced leasing from it,
# then measures, with the same load generator (BUILD_DIR/bench/load) and the
# same pipelined shape for every row:
#   local-hot          a local rule, one key: the reference of the ratios;
#   global-hot         a global rule, one key;
#   global-10k-keys    the global rule over 10,000 keys;
#   global-over-limit  a global rule whose limit (100,000/s) is far below the
#                      demand, one key: most answers are denials, which the
#                      negative cache keeps away from Redis;
#   evalsha-hot, evalsha-10k-keys
#                      the baseline: what most Redis limiters do, one EVALSHA
#                      per decision straight to the same Redis
#                      (lua/token_bucket.lua leasing one unit, i.e. the same
#                      script sluiced runs per lease), from the same load
#                      generator with the same connections and window.
# Around every measurement it reads Redis's INFO commandstats and INFO cpu,
# and sluiced's stats: Redis requests per decision counts every request
# clients sent Redis in that time (EVALSHAs of leases, returns and
# heartbeats, PINGs, INFO; not the commands scripts run inside) over every
# decision the load generator got back (its warm-up included), and a
# row that saw a fallback entry or an answer in fallback mode says so.
#
# Every row is measured ROUNDS times, interleaved; the table shows the median
# round by rate, with the spread. Knobs (environment): BENCH_SECONDS (2),
# BENCH_ROUNDS (3), BENCH_CONNECTIONS (2), BENCH_WINDOW (64),
# BENCH_WORKERS (nproc).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_setup global.sh "$@"
seconds=${BENCH_SECONDS:-2}
rounds=${BENCH_ROUNDS:-3}
conns=${BENCH_CONNECTIONS:-2}
window=${BENCH_WINDOW:-64}
workers=${BENCH_WORKERS:-$(nproc)}
many_keys=10000
load="$build/bench/load"
script="$here/../lua/token_bucket.lua"
for tool in redis-server redis-cli; do
  command -v "$tool" >/dev/null || { echo "bench: $tool is missing (make deps installs it)" >&2; exit 2; }
done

tmp=$(mktemp -d /tmp/slg.XXXXXX)  # short: a socket path has at most 107 bytes
sock="$tmp/d.sock"
daemon_pid=
redis_pid=
cleanup() {
  [ -z "$daemon_pid" ] || { kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; }
  [ -z "$redis_pid" ] || { kill "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; }
  rm -rf "$tmp"
}
trap cleanup EXIT

start_redis "$tmp"
rcli() { redis-cli -p "$port" "$@"; }

write_bench_config "$tmp/bench.toml" "$sock" "$workers"
cat >>"$tmp/bench.toml" <<EOF

[[rule]]
name = "global-over"
algorithm = "token_bucket"
limit = 100000
period = "1s"
burst = 1000
scope = "global"
EOF
"$build/daemon/sluiced" --config "$tmp/bench.toml" 2>"$tmp/sluiced.log" &
daemon_pid=$!
sluicectl_json() { "$build/client/sluicectl" --socket "$sock" --json "$@"; }
wait_for_leasing "$build/client/sluicectl" "$sock" 100 "$tmp/sluiced.log"
echo "bench: redis-server pid $redis_pid on port $port, sluiced pid $daemon_pid ($workers workers)" >&2

# Totals read around each measurement.
# Requests clients sent Redis: INFO commandstats also counts every TIME, GET,
# SET... that a script runs, so only commands no script can call are summed.
redis_calls() {
  rcli info commandstats | awk '
    /^cmdstat_/ {
      name = $0; sub(/^cmdstat_/, "", name); sub(/:.*/, "", name)
      calls = $0; sub(/.*:calls=/, "", calls); sub(/,.*/, "", calls)
      if (name ~ /^(eval|evalsha|eval_ro|evalsha_ro|ping|info|auth|select|hello)$/ || name ~ /^(script|client)[|]/) s += calls
    }
    END { print s + 0 }'
}
redis_cpu() { rcli info cpu | awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.3f", s }'; }
# sluiced's count of fallback entries plus answers given in fallback mode.
fallback_events() {
  sluicectl_json stats | awk '
    { text = text $0 }
    END {
      n = 0
      if (match(text, /"fallback_entries":[0-9]+/)) n += substr(text, RSTART + 19, RLENGTH - 19)
      while (match(text, /"fallback":[0-9]+/)) { n += substr(text, RSTART + 11, RLENGTH - 11); text = substr(text, RSTART + RLENGTH) }
      print n
    }'
}

results="$tmp/results"
: >"$results"
measure() {  # ROW ROUND SERVER_PID COMMAND...
  local row=$1 round=$2 server_pid=$3
  shift 3
  local calls0 cpu0 fb0 out calls1 cpu1 fb1 decisions
  calls0=$(redis_calls); cpu0=$(redis_cpu); fb0=$(fallback_events)
  out=$(BENCH_SERVER_PID=$server_pid "$@")
  calls1=$(redis_calls); cpu1=$(redis_cpu); fb1=$(fallback_events)
  decisions=$(($(field allowed "$out") + $(field denied "$out") + $(field errors "$out")))
  # The INFO calls of this script count too: take them out (2 per snapshot).
  out="$out decisions=$decisions redis_calls=$((calls1 - calls0 - 2))"
  out="$out redis_cpu_s=$(awk -v a="$cpu0" -v b="$cpu1" 'BEGIN { printf "%.3f", b - a }')"
  out="$out fallback=$((fb1 - fb0))"
  echo "$row $round $out" >>"$results"
  echo "bench: $row round $round: $out" >&2
}

addr="127.0.0.1:$port"
baseline_rule="1000000000/1000/1000000000"  # the `global` rule: LIMIT/PERIOD_MS/BURST
for round in $(seq "$rounds"); do
  measure local-hot "$round" "$daemon_pid" "$load" pipelined "$sock" local hot "$conns" "$window" "$seconds"
  measure global-hot "$round" "$daemon_pid" "$load" pipelined "$sock" global hot "$conns" "$window" "$seconds"
  measure evalsha-hot "$round" "$redis_pid" "$load" evalsha-pipelined "$addr" "$script" "$baseline_rule" hot \
    "$conns" "$window" "$seconds"
  measure global-10k-keys "$round" "$daemon_pid" "$load" pipelined "$sock" global "$many_keys" "$conns" \
    "$window" "$seconds"
  measure evalsha-10k-keys "$round" "$redis_pid" "$load" evalsha-pipelined "$addr" "$script" "$baseline_rule" \
    "$many_keys" "$conns" "$window" "$seconds"
  measure global-over-limit "$round" "$daemon_pid" "$load" pipelined "$sock" global-over hot "$conns" \
    "$window" "$seconds"
done
lease_stats=$(sluicectl_json stats | grep -o '"leases":{[^}]*}' || true)

report() {
  echo "## sluice global-path benchmark"
  echo
  echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -srm), $(nproc) CPUs, load average before: $load_before;" \
    "$(redis-server --version | sed 's/ sha=.*//'), sluiced with $workers workers, both on this machine."
  echo "Every row: the same load generator (\`bench/load\`), $conns connections x $window requests in flight," \
    "0.5 s warm-up, then ${seconds} s; median of $rounds interleaved rounds by rate (spread = min..max)."
  echo "Rules: \`local\` and \`global\` are token buckets of 1e9 per 1s, burst 1e9 (every request allowed);" \
    "\`global-over\` is 100,000 per 1s, burst 1,000, and gets far more. The evalsha rows send one" \
    "EVALSHA of lua/token_bucket.lua (lease one unit, the \`global\` rule's parameters) per decision" \
    "straight to the same Redis: the design of most Redis limiters."
  echo "Redis requests/decision: every request clients sent Redis during the row (EVALSHAs of leases," \
    "returns and heartbeats, PINGs, INFO; from INFO commandstats, without the commands scripts run inside)" \
    "/ every decision answered (warm-up included)." \
    "Redis CPU: \`used_cpu_user + used_cpu_sys\` seconds per 100,000 decisions." \
    "Fallback: fallback entries plus answers in fallback mode during the row (0 = Redis never left the path)."
  busy_warning "rates are lower bounds; the ratios, measured in the same rounds, are the figures to read."
  echo
  awk '
    function val(line, key,   i, n, parts, kv) {
      n = split(line, parts, " ")
      for (i = 3; i <= n; i++) { split(parts[i], kv, "="); if (kv[1] == key) return kv[2] }
      return ""
    }
    { row = $1; count[row]++; line[row, count[row]] = $0; if (!(row in seen)) { order[++rows] = row; seen[row] = 1 } }
    function median(row,   i, j, n, k, l, t) {
      n = count[row]
      for (i = 1; i <= n; i++) { k[i] = val(line[row, i], "rate_per_s") + 0; l[i] = line[row, i] }
      for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (k[j] < k[i]) {
        t = k[i]; k[i] = k[j]; k[j] = t; t = l[i]; l[i] = l[j]; l[j] = t
      }
      lo[row] = k[1]; hi[row] = k[n]
      return l[int((n + 1) / 2)]
    }
    function per_decision(m, key,   d) { d = val(m, "decisions"); return d > 0 ? val(m, key) / d : 0 }
    END {
      for (r = 1; r <= rows; r++) med[order[r]] = median(order[r])
      local_rate = val(med["local-hot"], "rate_per_s")
      print "| row | decisions/s | spread | allowed / denied | Redis requests/decision | Redis CPU s / 100k decisions | fallback | vs local-hot | vs evalsha (same keys) | target |"
      print "|---|---:|---|---|---:|---:|---:|---:|---:|---|"
      for (r = 1; r <= rows; r++) {
        row = order[r]; m = med[row]; rate = val(m, "rate_per_s")
        cmds = per_decision(m, "redis_calls"); cpu = 1e5 * per_decision(m, "redis_cpu_s")
        base = ""
        if (row == "global-hot") base = "evalsha-hot"
        if (row == "global-10k-keys") base = "evalsha-10k-keys"
        vs_local = local_rate > 0 && row != "local-hot" ? sprintf("%.0f%%", 100 * rate / local_rate) : ""
        vs_base = ""; target = ""
        if (base != "" && val(med[base], "rate_per_s") > 0) {
          ratio = rate / val(med[base], "rate_per_s")
          vs_base = sprintf("%.1fx", ratio)
        }
        if (row == "global-hot") {
          target = sprintf("<= 0.01 requests/decision: %s; >= 50%% of local: %s; >= 20x evalsha: %s",
                           cmds <= 0.01 ? "PASS" : "MISS", rate >= 0.5 * local_rate ? "PASS" : "MISS",
                           ratio >= 20 ? "PASS" : "MISS")
          summary = summary sprintf("global-hot: %.4f Redis requests/decision, %.0f%% of local-hot, %.1fx evalsha-hot. ", cmds, 100 * rate / local_rate, ratio)
        }
        if (row == "global-10k-keys") {
          target = sprintf("(no target) >= 20x evalsha: %s", ratio >= 20 ? "PASS" : "MISS")
          summary = summary sprintf("global-10k-keys: %.4f requests/decision, %.0f%% of local-hot, %.1fx evalsha-10k-keys. ", cmds, 100 * rate / local_rate, ratio)
        }
        if (row == "global-over-limit")
          summary = summary sprintf("global-over-limit: %.4f requests/decision with %.0f%% denied. ", cmds, 100 * val(m, "denied") / val(m, "decisions"))
        if (val(m, "errors") != 0) target = target sprintf(" (%s errors!)", val(m, "errors"))
        printf "| %s | %.0f | %.2f..%.2fM/s | %s / %s | %.4f | %.3f | %s | %s | %s | %s |\n", row, rate, lo[row] / 1e6, hi[row] / 1e6, val(m, "allowed"), val(m, "denied"), cmds, cpu, val(m, "fallback"), vs_local, vs_base, target
      }
      print ""
      print "Summary: " summary
    }' "$results"
  echo
  echo "sluiced's lease counters at the end of the run: \`$lease_stats\`"
  echo
  echo "Reproduce: \`make bench\`, or \`BENCH_SECONDS=$seconds BENCH_ROUNDS=$rounds BENCH_CONNECTIONS=$conns" \
    "BENCH_WINDOW=$window bench/global.sh build-release\`."
}

mkdir -p "$here/results"
report | tee "$here/results/$(bench_result_name global)"
