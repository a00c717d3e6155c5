#!/usr/bin/env bash
# tests/memcheck.sh: the integration tests against sluiced under valgrind
# memcheck, and what memcheck found in every daemon they ran.
#
#   tests/memcheck.sh [BUILD_DIR [TEST ...]]
#
# BUILD_DIR (default build) holds daemon/sluiced; each TEST is a file of
# tests/integration/ (default: the hostile-client, protocol, access, metrics
# and shaping tests, which run local daemons through every request path and
# every way a connection ends). Every daemon a test starts runs as
#   valgrind --tool=memcheck --leak-check=full sluiced ...
# with its own log, MEMCHECK_LOGS/sluiced.<pid>.log (default a new dir under
# /tmp), and is stopped with SIGTERM (SLUICE_TEST_STOP=term) so that it exits
# normally and memcheck reports its leaks.
#
# The tests themselves run 20 to 50 times slower than usual, so those that
# bound a time may fail; their results are printed but decide nothing. The
# verdict is memcheck's: exit 0 when no daemon run had an error (invalid
# reads or writes, uninitialised values, bad frees or syscall arguments) or
# lost a block (definitely or indirectly lost; leaks are counted in bytes,
# not as errors). Runs that a test ended with SIGKILL on purpose have no
# leak summary; their errors still count.
set -uo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR=${1:-build}
shift || true
TESTS=("$@")
if [ ${#TESTS[@]} -eq 0 ]; then
  TESTS=(exhaustion_test.py protocol_test.py access_test.py metrics_test.py shaping_test.py)
fi
SLUICED_REAL=$(realpath "$BUILD_DIR/daemon/sluiced")
LOGS=${MEMCHECK_LOGS:-$(mktemp -d /tmp/sluice-memcheck.XXXXXX)}
mkdir -p "$LOGS"

# The wrapper the tests run as SLUICED: valgrind replaces it (exec), so the
# daemon keeps the wrapper's pid and its signals.
WRAPPER="$LOGS/sluiced"
cat >"$WRAPPER" <<EOF
#!/bin/sh
exec valgrind --tool=memcheck --leak-check=full --show-leak-kinds=definite,indirect \\
  --errors-for-leak-kinds=none --num-callers=30 \\
  --log-file="$LOGS/sluiced.%p.log" "$SLUICED_REAL" "\$@"
EOF
chmod +x "$WRAPPER"

echo "memcheck: $SLUICED_REAL, logs in $LOGS"
failed_tests=()
for test in "${TESTS[@]}"; do
  echo "== $test"
  if ! SLUICED="$WRAPPER" SLUICE_TEST_STOP=term /usr/bin/python3 "tests/integration/$test" \
      >"$LOGS/${test%.py}.out" 2>&1; then
    failed_tests+=("$test")
  fi
  tail -n 3 "$LOGS/${test%.py}.out"
done

# --check-config and --version runs exit at once; they are daemon runs too.
runs=0 summarised=0 errors=0 definitely=0 indirectly=0
dirty=()
for log in "$LOGS"/sluiced.*.log; do
  [ -e "$log" ] || continue
  runs=$((runs + 1))
  run_errors=$(sed -n 's/.*ERROR SUMMARY: \([0-9,]*\) errors.*/\1/p' "$log" | tr -d , | tail -n 1)
  if [ -n "$run_errors" ]; then
    summarised=$((summarised + 1))
  else
    # No summary (the run was SIGKILLed): count the errors reported so far.
    run_errors=$(grep -cE '^==[0-9]+== (Invalid|Conditional|Use of uninit|Syscall param|Mismatched|Source and destination|Argument)' "$log")
  fi
  lost=$(sed -n 's/.*definitely lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tr -d , | tail -n 1)
  ind=$(sed -n 's/.*indirectly lost: \([0-9,]*\) bytes.*/\1/p' "$log" | tr -d , | tail -n 1)
  errors=$((errors + run_errors))
  definitely=$((definitely + ${lost:-0}))
  indirectly=$((indirectly + ${ind:-0}))
  if [ "$run_errors" -gt 0 ] || [ "${lost:-0}" -gt 0 ] || [ "${ind:-0}" -gt 0 ]; then
    dirty+=("$log")
  fi
done

echo
echo "memcheck: $runs daemon runs ($summarised exited with a summary, $((runs - summarised)) killed)," \
     "$errors errors, $definitely bytes definitely lost, $indirectly bytes indirectly lost"
if [ ${#failed_tests[@]} -gt 0 ]; then
  echo "tests that failed under valgrind (timing; see $LOGS/<test>.out): ${failed_tests[*]}"
fi
if [ "$runs" -eq 0 ]; then
  echo "memcheck: no daemon ran"
  exit 1
fi
if [ ${#dirty[@]} -gt 0 ]; then
  echo "memcheck found errors or leaks in:"
  printf '  %s\n' "${dirty[@]}"
  exit 1
fi
echo "memcheck: clean"
