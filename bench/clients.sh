#!/usr/bin/env bash
# bench/clients.sh BUILD_DIR: the client libraries' rows of `make bench`.
#
# Starts BUILD_DIR/daemon/sluiced on a temporary config with a rule `bench`
# (a token bucket too large to deny) and measures, against it, one after the
# other:
#   c        libsluice through BUILD_DIR/bench/load: one connection with
#            1,024 requests in flight (pipelined) and one call at a time
#            (sequential), the reference for the other languages;
#   python   client/python/bench.py;
#   node     client/node/bench.js, installed with its dependencies (npm ci)
#            into a temporary directory;
#   go       client/go/bench through client/go/tools/go.sh (offline);
#   java     client/java/bench/run.sh.
# Each language's bench prints, for one connection, `pipelined` (many calls
# in flight), `sequential` (one call at a time) and `raw_pipelined`: a tight
# loop of that language over a raw socket and the same MessagePack library,
# the most a client in it could do, which its pipelined rate is judged
# against. The Java and Python benches alternate those two modes for
# BENCH_ROUNDS rounds and report each one's best round. The table
# (decisions per second) is saved to bench/results/clients.md.
#
# Knobs (environment): BENCH_SECONDS per mode (3), BENCH_ROUNDS (3),
# BENCH_WORKERS (nproc), BENCH_CLIENTS the languages to measure
# ("c python node go java").
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/common.sh
source "$here/common.sh"
bench_setup clients.sh "$@"
seconds=${BENCH_SECONDS:-3}
rounds=${BENCH_ROUNDS:-3}
workers=${BENCH_WORKERS:-$(nproc)}
languages=${BENCH_CLIENTS:-c python node go java}
repo=$(cd "$here/.." && pwd)

tmp=$(mktemp -d /tmp/slb.XXXXXX)  # short: a socket path has at most 107 bytes
sock="$tmp/d.sock"
daemon_pid=
cleanup() {
  [ -z "$daemon_pid" ] || { kill "$daemon_pid" 2>/dev/null || true; wait "$daemon_pid" 2>/dev/null || true; }
  rm -rf "$tmp"
}
trap cleanup EXIT

{
  bench_daemon_tables "$sock" "$workers"
  cat <<EOF

[[rule]]
name = "bench"
algorithm = "token_bucket"
limit = 1000000000
period = "1s"
burst = 1000000000
EOF
} >"$tmp/bench.toml"
"$build/daemon/sluiced" --config "$tmp/bench.toml" 2>"$tmp/sluiced.log" &
daemon_pid=$!
for _ in $(seq 100); do
  [ -S "$sock" ] && "$build/client/sluicectl" --socket "$sock" health >/dev/null 2>&1 && break
  sleep 0.05
done
export SLUICE_SOCKET=$sock BENCH_SECONDS=$seconds BENCH_ROUNDS=$rounds

lines="$tmp/lines"
: >"$lines"
run() {  # LANGUAGE COMMAND...
  local language=$1
  shift
  echo "bench: $language" >&2
  if ! "$@" >"$tmp/$language.out" 2>"$tmp/$language.err"; then
    echo "bench: $language failed:" >&2
    tail -n 20 "$tmp/$language.err" >&2
    return 0
  fi
  grep '^client=' "$tmp/$language.out" >>"$lines" || true
}

c_bench() {
  local out
  out=$("$build/bench/load" pipelined "$sock" bench hot 1 1024 "$seconds")
  echo "client=c mode=pipelined decisions_per_s=$(field rate_per_s "$out")"
  out=$("$build/bench/load" sync "$sock" bench hot "$seconds")
  echo "client=c mode=sequential decisions_per_s=$(field rate_per_s "$out")"
}
node_bench() {
  sh "$repo/client/node/test/install.sh" "$repo/client/node" "$tmp/node" >&2
  node "$tmp/node/bench.js"
}

for language in $languages; do
  case $language in
    c) run c c_bench ;;
    python) run python /usr/bin/python3 "$repo/client/python/bench.py" ;;
    node) run node node_bench ;;
    go) run go sh "$repo/client/go/tools/go.sh" "$tmp/go" bench ;;
    java) run java sh "$repo/client/java/bench/run.sh" "$tmp/java" ;;
    *) echo "bench: no client '$language'" >&2; exit 2 ;;
  esac
done

rate() {  # LANGUAGE MODE
  sed -n "s/^client=$1 mode=$2 decisions_per_s=\\([0-9.]*\\).*/\\1/p" "$lines" | head -n 1
}
result="$here/results/$(bench_result_name clients)"
{
  echo "# Client libraries"
  echo
  echo "One connection to one sluiced ($workers workers) on this machine, rule \`bench\` (never denies);"
  echo "$seconds s per mode. raw is the language's own ceiling: a tight loop over a raw socket and the"
  echo "same MessagePack library; pipelined/raw is the target's ratio (at least 0.5). Java and"
  echo "Python alternate pipelined and raw for $rounds rounds and show each one's best round."
  echo
  echo "| client | pipelined | sequential | raw (same language) | pipelined/raw | pipelined/C |"
  echo "|---|---:|---:|---:|---:|---:|"
  c_rate=$(rate c pipelined)
  for language in $languages; do
    p=$(rate "$language" pipelined)
    s=$(rate "$language" sequential)
    r=$(rate "$language" raw_pipelined)
    [ -n "$p" ] || { echo "| $language | failed | | | | |"; continue; }
    ratio_raw=$(awk -v p="$p" -v r="$r" 'BEGIN { if (r > 0) printf "%.2f", p / r; else printf "-" }')
    ratio_c=$(awk -v p="$p" -v c="${c_rate:-0}" 'BEGIN { if (c > 0) printf "%.2f", p / c; else printf "-" }')
    echo "| $language | $p | $s | ${r:--} | $ratio_raw | $ratio_c |"
  done
  echo
  echo "Reproduce: \`BENCH_SECONDS=$seconds BENCH_ROUNDS=$rounds bench/clients.sh BUILD_DIR\` (BUILD_DIR a Release build)."
  busy_warning "rerun on a quiet machine for figures to keep."
} >"$result"
cat "$result"
