#!/bin/sh
# install.sh SOURCE_DIR DEST_DIR: a copy of the sluice-client package (its
# sources, tests and bench) in DEST_DIR with its dependencies installed by
# `npm ci` from package-lock.json, so that nothing is written into the
# source tree. ctest runs it as the fixture of the client_node_* tests.
set -eu
src=$1
dest=$2
rm -rf "$dest"
mkdir -p "$dest"
cp -R "$src/package.json" "$src/package-lock.json" "$src/index.js" "$src/index.d.ts" \
      "$src/bench.js" "$src/src" "$src/test" "$dest/"
cd "$dest"
npm ci --prefer-offline --no-audit --no-fund --loglevel=error
