#!/bin/sh
# package_test.sh SOURCE_DIR WORK_DIR: `make package` from a clean copy of the
# tree, and the .deb it makes checked as a user would meet it.
#
#  1. Copies the tree (git's files, committed or not; no build directory)
#     into a temporary directory under WORK_DIR and runs `make package` there
#     (Release, build-release/ of the copy).
#  2. The package's files: everything `make install` installs, under /usr and
#     /etc only; the licence's copyright file; sluice.pc naming /usr.
#  3. Its control data: fields, conffiles, maintainer scripts (sh -n), the
#     ldconfig trigger, shlibs.
#  4. lintian on it: no errors (warnings are printed).
#  5. dpkg -x into a throwaway root: the binaries run and check the packaged
#     config; the sysusers entry makes the sluice user and group in that
#     root; the maintainer scripts, with systemd-sysusers and systemctl
#     replaced by stubs and systemd "running" in a directory of the test's,
#     create the user, never enable or start a unit on a fresh install,
#     restart a running daemon on upgrade and stop the units on removal.
#  6. A program built against the unpacked root with `pkg-config sluice`
#     (the prefix redirected into the root) loads the packaged libsluice.
#
# WORK_DIR is where the copy is built: under the project's build tree, ccache
# finds the objects of earlier runs (paths relative to CCACHE_BASEDIR).
set -eu

src=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
tmp=$(mktemp -d "$work/package.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "package_test: $*" >&2
  exit 1
}
step() { echo "package_test: $*"; }

# --- 1. make package in a clean copy -------------------------------------------
step "copying $src into $tmp/src"
mkdir "$tmp/src"
if git -C "$src" rev-parse --show-toplevel >/dev/null 2>&1; then
  # Tracked and untracked files, as in the work tree; ignored ones (build
  # directories) and deleted ones left out.
  git -C "$src" ls-files -z --cached --others --exclude-standard |
    (cd "$src" && xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh) |
    tar -C "$src" --null -T - -cf - | tar -C "$tmp/src" -xf -
else
  (cd "$src" && tar --exclude='./build*' -cf - .) | tar -C "$tmp/src" -xf -
fi
[ ! -e "$tmp/src/build-release" ] || fail "the copy is not clean: it has build-release/"

step "make package (Release) in the copy"
# Under `make test` this runs inside make's recipe: the outer make's flags
# (its jobserver) are not the inner one's.
unset MAKEFLAGS MFLAGS MAKELEVEL
make -C "$tmp/src" package JOBS="${JOBS:-2}" >"$tmp/make.log" 2>&1 ||
  { tail -n 60 "$tmp/make.log" >&2; fail "make package failed (log above)"; }
version=$(sed -n 's/^#define SLUICE_VERSION_\(MAJOR\|MINOR\|PATCH\) \+\([0-9]\+\).*/\2/p' \
  "$tmp/src/client/include/sluice.h" | paste -sd.)
arch=$(dpkg --print-architecture)
deb=$tmp/src/build-release/sluice_${version}_${arch}.deb
[ -f "$deb" ] || fail "make package did not write build-release/sluice_${version}_${arch}.deb"
step "built $(basename "$deb") ($(wc -c <"$deb") bytes)"

# --- 2. contents -------------------------------------------------------------------
dpkg-deb -c "$deb" | awk '{print $6}' | sed 's|^\./|/|; s|/$||' | grep -v '^$' >"$tmp/files"
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH)
libdir=/usr/lib/$multiarch
for f in /usr/sbin/sluiced /usr/bin/sluicectl /usr/include/sluice.h \
         "$libdir/libsluice.so" "$libdir/libsluice.so.0" "$libdir/libsluice.a" \
         "$libdir/pkgconfig/sluice.pc" /etc/sluice/sluice.toml \
         /usr/lib/systemd/system/sluiced.service /usr/lib/systemd/system/sluiced.socket \
         /usr/lib/sysusers.d/sluice.conf /usr/share/man/man8/sluiced.8.gz \
         /usr/share/man/man1/sluicectl.1.gz /usr/share/doc/sluice/copyright; do
  grep -qx "$f" "$tmp/files" || fail "the package lacks $f"
done
outside=$(grep -v -e '^/usr\(/\|$\)' -e '^/etc\(/\|$\)' -e '^/$' "$tmp/files" || true)
[ -z "$outside" ] || fail "the package installs outside /usr and /etc: $outside"
if dpkg-deb -c "$deb" | grep -q "$tmp"; then fail "the package names the build directory"; fi

# --- 3. control data ----------------------------------------------------------------
dpkg-deb -e "$deb" "$tmp/control"
field() { dpkg-deb -f "$deb" "$1"; }
[ "$(field Package)" = sluice ] || fail "Package is $(field Package)"
[ "$(field Version)" = "$version" ] || fail "Version is $(field Version), not $version"
[ "$(field Architecture)" = "$arch" ] || fail "Architecture is $(field Architecture)"
case $(field Depends) in
  *libuv1*libc6* | *libc6*libuv1* | *libuv1*) ;;
  *) fail "Depends does not name the shared libraries sluiced loads: $(field Depends)" ;;
esac
[ -n "$(field Maintainer)" ] || fail "no Maintainer"
grep -qx /etc/sluice/sluice.toml "$tmp/control/conffiles" ||
  fail "/etc/sluice/sluice.toml is not a conffile"
for s in postinst prerm postrm; do
  [ -x "$tmp/control/$s" ] || fail "$s is missing or not executable"
  sh -n "$tmp/control/$s" || fail "$s is not valid sh"
done
grep -qx 'activate-noawait ldconfig' "$tmp/control/triggers" || fail "no ldconfig trigger"
grep -q '^libsluice 0 sluice' "$tmp/control/shlibs" || fail "shlibs does not name libsluice 0"

# --- 4. lintian ----------------------------------------------------------------------
step "lintian"
lintian --fail-on error --tag-display-limit 0 "$deb" >"$tmp/lintian.log" 2>&1 ||
  { cat "$tmp/lintian.log" >&2; fail "lintian reports errors (above)"; }
cat "$tmp/lintian.log"

# --- 5. unpacked into a throwaway root ---------------------------------------------------
root=$tmp/root
dpkg -x "$deb" "$root"
cmp -s "$root/etc/sluice/sluice.toml" "$tmp/src/conf/sluice.toml" ||
  fail "/etc/sluice/sluice.toml is not conf/sluice.toml"
grep -q '^License: Apache-2.0' "$root/usr/share/doc/sluice/copyright" &&
  grep -q '/usr/share/common-licenses/Apache-2.0' "$root/usr/share/doc/sluice/copyright" ||
  fail "the copyright file does not give the licence"
export LD_LIBRARY_PATH="$root$libdir"
"$root/usr/sbin/sluiced" --version >/dev/null || fail "the packaged sluiced does not run"
"$root/usr/sbin/sluiced" --check-config "$root/etc/sluice/sluice.toml" >/dev/null ||
  fail "the packaged sluiced refuses the packaged config"
"$root/usr/bin/sluicectl" --version >/dev/null || fail "the packaged sluicectl does not run"

# The sysusers entry, applied to the root (as systemd-sysusers does at boot).
touch "$root/etc/passwd" "$root/etc/group" "$root/etc/shadow" "$root/etc/gshadow"
systemd-sysusers --root="$root" >"$tmp/sysusers.log" 2>&1 ||
  { cat "$tmp/sysusers.log" >&2; fail "systemd-sysusers cannot apply sluice.conf"; }
grep -q '^sluice:' "$root/etc/passwd" || fail "sluice.conf creates no sluice user"
grep -q '^sluice:' "$root/etc/group" || fail "sluice.conf creates no sluice group"

# The maintainer scripts, with systemd's commands stubbed: each stub logs its
# arguments. /run/systemd/system (where a running systemd is told apart) is
# a directory of the test's, present or absent.
mkdir -p "$tmp/stubs" "$tmp/systemd-running/system"
for cmd in systemctl systemd-sysusers; do
  printf '#!/bin/sh\necho "%s $*" >>"%s"\n' "$cmd" "$tmp/calls" >"$tmp/stubs/$cmd"
  chmod +x "$tmp/stubs/$cmd"
done
# maint SCRIPT RUNNING ARGS...: runs a maintainer script; prints its calls.
maint() {
  script=$1 running=$2
  shift 2
  if [ "$running" = yes ]; then sysdir=$tmp/systemd-running/system; else sysdir=$tmp/none; fi
  sed "s|/run/systemd/system|$sysdir|g" "$tmp/control/$script" >"$tmp/script"
  : >"$tmp/calls"
  PATH="$tmp/stubs:$PATH" sh "$tmp/script" "$@" || fail "$script $* failed"
  cat "$tmp/calls"
}
expect() {  # expect WHAT ACTUAL EXPECTED
  [ "$2" = "$3" ] || fail "$1: called
$2
expected
$3"
}
nl='
'
expect "postinst configure, fresh, systemd running" "$(maint postinst yes configure '')" \
  "systemd-sysusers sluice.conf${nl}systemctl daemon-reload"
expect "postinst configure, fresh, no systemd" "$(maint postinst no configure '')" \
  "systemd-sysusers sluice.conf"
expect "postinst configure, upgrade from 0.0.9" "$(maint postinst yes configure 0.0.9)" \
  "systemd-sysusers sluice.conf${nl}systemctl daemon-reload${nl}systemctl try-restart sluiced.service"
expect "prerm remove" "$(maint prerm yes remove)" "systemctl stop sluiced.socket sluiced.service"
expect "prerm upgrade" "$(maint prerm yes upgrade "$version")" ""
expect "postrm remove" "$(maint postrm yes remove)" "systemctl daemon-reload"
expect "postrm purge, no systemd" "$(maint postrm no purge)" ""
if grep -nE 'systemctl[^#]*(enable|start)( |$)' "$tmp/control/postinst" | grep -v try-restart; then
  fail "postinst enables or starts a unit"
fi

# --- 6. a program built against the unpacked package with pkg-config -----------------------
export PKG_CONFIG_PATH="$root$libdir/pkgconfig"
export PKG_CONFIG_LIBDIR="$PKG_CONFIG_PATH"
[ "$(pkg-config --variable=prefix sluice)" = /usr ] ||
  fail "the packaged sluice.pc names the prefix $(pkg-config --variable=prefix sluice), not /usr"
redirect="--define-variable=prefix=$root/usr"
# shellcheck disable=SC2046 # pkg-config's output is meant to be split
"${CC:-cc}" -std=c99 -Wall -Wextra -Werror -o "$tmp/consumer" "$here/../integration/install_consumer.c" \
  $(pkg-config "$redirect" --cflags --libs sluice) ||
  fail "cannot build against the package with pkg-config sluice"
loaded=$(ldd "$tmp/consumer" | grep libsluice || true)
case $loaded in
  *"$root$libdir/libsluice.so.0"*) ;;
  *) fail "the program does not load the packaged libsluice: $loaded" ;;
esac
"$tmp/consumer" || fail "the program built against the package failed"
step "ok: $(basename "$deb")"
