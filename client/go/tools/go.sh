#!/bin/sh
# go.sh: runs the go tool on the Go client offline, against Debian's
# packaged source of github.com/vmihailenco/msgpack/v5 (and its dependency
# tagparser/v2) under /usr/share/gocode, so no module proxy is ever asked.
#
# It stages a copy of the module into BUILD_DIR/module with a vendor
# directory made from the packaged source (and a vendor/modules.txt whose
# versions match go.mod), then runs the go tool there with
# GOFLAGS=-mod=vendor, GOPROXY=off, and GOPATH and GOCACHE inside BUILD_DIR.
# Nothing is written to the source tree or to $HOME.
#
# Usage: go.sh BUILD_DIR stage            copy, vendor, gofmt -l, vet, compile
#        go.sh BUILD_DIR test [ARGS...]   go test ARGS . (after staging)
#        go.sh BUILD_DIR bench            build and run bench/ (SLUICE_SOCKET,
#                                         BENCH_SECONDS as bench/main.go says)
set -eu

if [ $# -lt 2 ]; then
  echo "usage: $0 BUILD_DIR stage|test [go test args]|bench" >&2
  exit 2
fi
build=$(mkdir -p "$1" && cd "$1" && pwd)
what=$2
shift 2
src=$(cd "$(dirname "$0")/.." && pwd)
gocode=${SLUICE_GOCODE:-/usr/share/gocode/src}
module=$build/module

export GOPATH="$build/gopath" GOCACHE="$build/gocache" GOENV=off GOFLAGS=-mod=vendor \
  GOPROXY=off GOSUMDB=off GO111MODULE=on GOTOOLCHAIN=local GOTELEMETRY=off

# Copies the non-test Go files of one packaged package into the vendor dir.
vendor_package() {
  from=$gocode/$1
  if [ ! -d "$from" ]; then
    echo "$0: $from is missing: install golang-github-vmihailenco-msgpack.v5-dev" >&2
    exit 1
  fi
  mkdir -p "$module/vendor/$1"
  for f in "$from"/*.go; do
    case $f in *_test.go) ;; *) cp "$f" "$module/vendor/$1/" ;; esac
  done
}

stage() {
  rm -rf "$module"
  mkdir -p "$module"
  (cd "$src" && tar --exclude=./tools -cf - .) | (cd "$module" && tar -xf -)
  vendor_package github.com/vmihailenco/msgpack/v5
  vendor_package github.com/vmihailenco/msgpack/v5/msgpcode
  vendor_package github.com/vmihailenco/tagparser/v2
  vendor_package github.com/vmihailenco/tagparser/v2/internal
  vendor_package github.com/vmihailenco/tagparser/v2/internal/parser
  cat >"$module/vendor/modules.txt" <<'TXT'
# github.com/vmihailenco/msgpack/v5 v5.3.5
## explicit; go 1.11
github.com/vmihailenco/msgpack/v5
github.com/vmihailenco/msgpack/v5/msgpcode
# github.com/vmihailenco/tagparser/v2 v2.0.0
## explicit; go 1.15
github.com/vmihailenco/tagparser/v2
github.com/vmihailenco/tagparser/v2/internal
github.com/vmihailenco/tagparser/v2/internal/parser
TXT
}

case $what in
  stage)
    stage
    cd "$module"
    unformatted=$(gofmt -l $(find . -path ./vendor -prune -o -name '*.go' -print))
    if [ -n "$unformatted" ]; then
      echo "$0: not gofmt-formatted: $unformatted" >&2
      exit 1
    fi
    go vet ./...
    go test -count=1 -run '^$' .
    ;;
  test)
    [ -f "$module/go.mod" ] || stage
    cd "$module"
    exec go test -count=1 "$@" .
    ;;
  bench)
    stage
    cd "$module"
    go build -o "$build/sluice-bench-go" ./bench
    exec "$build/sluice-bench-go"
    ;;
  *)
    echo "$0: unknown step $what" >&2
    exit 2
    ;;
esac
