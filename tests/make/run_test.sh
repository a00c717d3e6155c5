#!/bin/sh
# run_test.sh SOURCE_DIR: `make run` builds only what running needs.
#
# `make run` is the first command a newcomer types; building the whole test
# tree before the daemon starts doubles the wait. From make's dry run (-n:
# nothing is installed, built or started), every `cmake --build` of the run
# names its targets, and those are sluiced and sluicectl only; then the
# recipe starts build/daemon/sluiced on conf/sluice.toml.
set -eu

src=$1
tmp=$(mktemp -d /tmp/sl-make-run.XXXXXX)
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "make_run: $*" >&2
  echo "make -n run printed:" >&2
  cat "$tmp/plan" >&2
  exit 1
}

# Under `make test` this runs inside make's recipe: the outer make's flags are
# not the dry run's.
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
  make --no-print-directory -n -C "$src" run RUN_DIR="$tmp/run" >"$tmp/plan"

grep -q 'cmake --build build ' "$tmp/plan" || fail "make run does not build build/"
grep 'cmake --build ' "$tmp/plan" >"$tmp/builds"
while read -r line; do
  case $line in
    *--target*) ;;
    *) fail "make run builds every target: $line" ;;
  esac
  targets=${line#*--target}
  for t in $targets; do
    case $t in
      sluiced | sluicectl) ;;
      *) fail "make run builds $t, which running does not need" ;;
    esac
  done
done <"$tmp/builds"

tail -n 1 "$tmp/plan" | grep -q "^\./build/daemon/sluiced --config conf/sluice.toml --socket $tmp/run/sluice.sock\$" ||
  fail "make run does not end by starting build/daemon/sluiced on conf/sluice.toml"
