#!/bin/sh
# bench/run.sh [OUT_DIR]: builds the Java client and its bench program
# (build.sh, without the tests) into OUT_DIR (default: a temp dir, removed
# after) and runs it against the daemon at $SLUICE_SOCKET, whose rule `bench`
# must be a token bucket with a huge limit; BENCH_SECONDS per mode (default 3).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -ge 1 ]; then
  out=$1
else
  out=$(mktemp -d /tmp/sluice-java-bench.XXXXXX)
  trap 'rm -rf "$out"' EXIT
fi
SKIP_TESTS=1 sh "$here/build.sh" "$out"
java -cp "$out/bench-classes:$out/sluice-client.jar:/usr/share/java/msgpack-core.jar" Bench
