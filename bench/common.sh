# bench/common.sh: what bench/run.sh and bench/global.sh share (sourced).

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
