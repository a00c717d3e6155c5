#!/bin/sh
# man_test.sh SLUICED SLUICECTL MAN_DIR: the man pages (man/*.in) document
# every option that `sluiced --help` and `sluicectl --help` list, and every
# sluicectl command, so that a new flag cannot ship undocumented.
set -eu

sluiced=$1
sluicectl=$2
man=$3
"$sluiced" --help >/dev/null
"$sluicectl" --help >/dev/null

checked=0
missing=0
# $1: the roff source; $2: an extended regular expression that the tag of one
# of its items (the line after a .TP) must match.
expect() {
  checked=$((checked + 1))
  if ! grep -A1 '^\.TP' "$1" | grep -qE -- "$2"; then
    echo "man_test: no item of $(basename "$1") matches $2" >&2
    missing=$((missing + 1))
  fi
}

# Options are written --name in --help and \-\-name in roff.
options() {
  "$1" --help | grep -oE -- '--[a-z][a-z-]*' | sort -u | sed 's/-/\\\\-/g'
}
for option in $(options "$sluiced"); do
  expect "$man/sluiced.8.in" "^\..* $option( |\$)"
done
for option in $(options "$sluicectl"); do
  expect "$man/sluicectl.1.in" "^\..* $option( |\$)"
done
# sluicectl's commands are the first word of each line under "commands:".
for command in $("$sluicectl" --help | sed -n '/^commands:/,/^$/s/^  \([a-z]*\).*/\1/p'); do
  expect "$man/sluicectl.1.in" "^\.BI? $command( |\$)"
done

# Guards against --help output this script no longer understands.
[ "$checked" -ge 12 ] || { echo "man_test: found only $checked options and commands" >&2; exit 1; }
[ "$missing" -eq 0 ] || exit 1
echo "man_test: all $checked options and commands are documented"
