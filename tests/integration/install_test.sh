#!/bin/sh
# install_test.sh BUILD_DIR CC [LINK_OPTION...]: installs the build into a
# staging prefix and builds a program (install_consumer.c) against the
# installed header and library as a user would, with
# `pkg-config --cflags --libs sluice`; then links it statically with
# libsluice.a, and runs both.
#
# The LINK_OPTIONs are the build's own (tests/CMakeLists.txt passes them): a
# sanitizer build installs an instrumented libsluice, which links only into a
# program linked with the same sanitizer. CMAKE names the cmake to install with.
set -eu

build=$1
cc=$2
shift 2
here=$(dirname "$0")

stage=$(mktemp -d /tmp/sl-install.XXXXXX)
trap 'rm -rf "$stage"' EXIT
prefix=$stage/prefix

fail() {
  echo "install_test: $*" >&2
  exit 1
}

rm -f "$build/install_manifest.txt"
"${CMAKE:-cmake}" --install "$build" --prefix "$prefix" >"$stage/install.log" 2>&1 ||
  { cat "$stage/install.log" >&2; fail "cmake --install failed"; }

# Nothing may land outside the prefix: the config's directory is worked out
# from the prefix when installing (/etc only for the prefix /usr).
outside=$(grep -v "^$prefix/" "$build/install_manifest.txt" || true)
[ -z "$outside" ] || fail "installed outside $prefix: $outside"

for f in sbin/sluiced bin/sluicectl include/sluice.h etc/sluice/sluice.toml \
         lib/systemd/system/sluiced.service lib/systemd/system/sluiced.socket \
         lib/sysusers.d/sluice.conf share/man/man8/sluiced.8.gz share/man/man1/sluicectl.1.gz; do
  [ -f "$prefix/$f" ] || fail "$f is not installed"
done
cmp -s "$prefix/etc/sluice/sluice.toml" "$here/../../conf/sluice.toml" ||
  fail "etc/sluice/sluice.toml is not conf/sluice.toml"

# Installing writes sluice.pc for the prefix it installs under; the build
# tree's own sluice.pc must not be that file, or it names this staging
# prefix, deleted when the test ends, to whoever builds against the tree.
stale=$(find "$build" -name sluice.pc -exec grep -l "$stage" {} + || true)
[ -z "$stale" ] || fail "the build tree's $stale names the staging prefix $prefix"

pc=$(find "$prefix" -name sluice.pc)
[ -n "$pc" ] || fail "sluice.pc is not installed"
export PKG_CONFIG_PATH="${pc%/sluice.pc}"
libdir=$(pkg-config --variable=libdir sluice)
[ "$(pkg-config --variable=prefix sluice)" = "$prefix" ] ||
  fail "sluice.pc names the prefix $(pkg-config --variable=prefix sluice), not $prefix"
for f in libsluice.so libsluice.a; do
  [ -e "$libdir/$f" ] || fail "$libdir/$f is not installed"
done

# shellcheck disable=SC2046 # pkg-config's output is meant to be split
"$cc" -std=c99 -Wall -Wextra -Werror "$@" -o "$stage/consumer" "$here/install_consumer.c" \
  $(pkg-config --cflags --libs sluice) || fail "cannot build against the installed library"
loaded=$(LD_LIBRARY_PATH=$libdir ldd "$stage/consumer" | grep libsluice || true)
case $loaded in
  *"$libdir/libsluice.so."*) ;;
  *) fail "the program does not load the staged libsluice: $loaded" ;;
esac
LD_LIBRARY_PATH=$libdir "$stage/consumer" || fail "the program linked with libsluice.so failed"

# shellcheck disable=SC2046
"$cc" -std=c99 -Wall -Wextra -Werror "$@" -o "$stage/consumer-static" "$here/install_consumer.c" \
  $(pkg-config --cflags sluice) "$libdir/libsluice.a" || fail "cannot link libsluice.a"
if ldd "$stage/consumer-static" | grep -q libsluice; then
  fail "the program linked with libsluice.a still loads libsluice.so"
fi
"$stage/consumer-static" || fail "the program linked with libsluice.a failed"
