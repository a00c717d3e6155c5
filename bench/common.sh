# bench/common.sh: what the bench scripts share (sourced).

# Checks the scripts' one argument, BUILD_DIR (a build with sluiced and
# bench/load built), and sets `build` to its absolute path and
# `load_before` to the load averages as the run starts.
bench_setup() {  # SCRIPT_NAME "$@"
  local name=$1
  shift
  if [ $# -ne 1 ] || [ ! -x "$1/daemon/sluiced" ] || [ ! -x "$1/bench/load" ]; then
    echo "usage: bench/$name BUILD_DIR (a build with sluiced and bench/load built)" >&2
    exit 2
  fi
  build=$(cd "$1" && pwd)
  load_before=$(cut -d' ' -f1-3 /proc/loadavg)
  bench_mode_defaults
}

# BENCH_MODE=quick (the smoke run of `make bench`, bench/fleet.py's quick mode
# too) shortens every measurement to BENCH_QUICK_SECONDS and measures one round,
# over fewer keys; a knob set in the environment still wins. BENCH_MODE=full
# (the default) leaves the scripts' own defaults.
BENCH_QUICK_SECONDS=0.5
BENCH_QUICK_KEYS=100000
bench_mode_defaults() {
  case ${BENCH_MODE:-full} in
    full) ;;
    quick)
      : "${BENCH_SECONDS:=$BENCH_QUICK_SECONDS}" "${BENCH_SYNC_SECONDS:=$BENCH_QUICK_SECONDS}"
      : "${BENCH_ROUNDS:=1}" "${BENCH_SYNC_ROUNDS:=1}" "${BENCH_KEYS:=$BENCH_QUICK_KEYS}"
      ;;
    *)
      echo "bench: BENCH_MODE is quick or full, not '$BENCH_MODE'" >&2
      exit 2
      ;;
  esac
}

# The file a script's table is saved in under bench/results/: NAME.md, or
# NAME-quick.md for a smoke run (ignored by git, so the full run's stay).
bench_result_name() {  # NAME
  if [ "${BENCH_MODE:-full}" = quick ]; then echo "$1-quick.md"; else echo "$1.md"; fi
}

# Starts a redis-server (no persistence, its files in DIR) on the first free
# loopback port of a few random tries; sets `port` and `redis_pid` (the
# caller stops it), or exits.
start_redis() {  # DIR
  local dir=$1 try
  port=
  redis_pid=
  for _ in $(seq 20); do
    try=$((20000 + RANDOM % 20000))
    redis-server --port "$try" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
      --logfile "$dir/redis.log" &
    redis_pid=$!
    for _ in $(seq 50); do
      if redis-cli -p "$try" ping >/dev/null 2>&1; then port=$try; break; fi
      kill -0 "$redis_pid" 2>/dev/null || break
      sleep 0.05
    done
    [ -z "$port" ] || return 0
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
    redis_pid=
  done
  echo "bench: could not start redis-server" >&2
  exit 1
}

# Prints the [daemon] and [limits] tables of a bench daemon: sluiced on
# SOCKET with WORKERS worker threads, warnings only, room for a deep
# pipeline's answers and no idle timeout, under a line naming the script
# that wrote it.
bench_daemon_tables() {  # SOCKET WORKERS
  cat <<EOF
# Written by bench/$(basename "$0").
[daemon]
socket = "$1"
workers = $2
log_level = "warn"

[limits]
max_output_bytes = 67108864
idle_timeout = "0"
EOF
}

# Writes FILE, the config of a benchmark that leases: the daemon tables
# (bench_daemon_tables SOCKET WORKERS), the Redis of start_redis (`port`)
# with the daemon's keys under KEY_PREFIX (none given: the default), and
# two token buckets too large to deny (1e9 per 1s, burst 1e9): `local`,
# decided on the node alone, and `global`, leased from Redis. A script
# appends rules of its own to FILE.
write_bench_config() {  # FILE SOCKET WORKERS [KEY_PREFIX]
  local file=$1 prefix=
  [ -z "${4:-}" ] || prefix="key_prefix = \"$4\""
  {
    bench_daemon_tables "$2" "$3"
    cat <<EOF

[redis]
url = "redis://127.0.0.1:$port"
$prefix

[[rule]]
name = "local"
algorithm = "token_bucket"
limit = 1000000000
period = "1s"
burst = 1000000000

[[rule]]
name = "global"
algorithm = "token_bucket"
limit = 1000000000
period = "1s"
burst = 1000000000
scope = "global"
EOF
  } >"$file"
}

# Waits until the sluiced on SOCKET leases from Redis (its breaker closed),
# asking SLUICECTL every 0.05 s, TRIES times at most; otherwise prints LOG
# (the daemon's stderr) and exits.
wait_for_leasing() {  # SLUICECTL SOCKET TRIES LOG
  local breaker=
  for _ in $(seq "$3"); do
    breaker=$("$1" --socket "$2" --json health 2>/dev/null |
              sed -n 's/.*"breaker":"\([a-z_]*\)".*/\1/p' || true)
    [ "$breaker" = closed ] && return 0
    sleep 0.05
  done
  echo "bench: the sluiced on $2 did not start leasing (breaker: ${breaker:-?})" >&2
  cat "$4" >&2
  exit 1
}

# Value of key=... on a line of load's output.
field() { sed -n "s/.*\\b$1=\\([^ ]*\\).*/\\1/p" <<<"$2"; }

# The report's warning when the machine was busy before the run (1-min load
# average above half the CPUs), ending with ADVICE; nothing otherwise.
busy_warning() {  # ADVICE
  if awk -v l="${load_before%% *}" -v n="$(nproc)" 'BEGIN { exit !(l > n / 2) }'; then
    echo
    echo "**Warning: the machine was busy before the run (1-min load average ${load_before%% *} on $(nproc) CPUs);" \
      "$1**"
  fi
}
