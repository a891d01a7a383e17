#!/usr/bin/env bash
# Builds a Go sluice transform into a WebAssembly component (world `packed-out`).
#
#   sdks/go/build.sh PROJECT_DIR OUT.wasm
#
# PROJECT_DIR is a Go module whose root package is `package main`, laid out
# like examples/go/running-count: its go.mod says
# `require sluice.dev/sdk/go v0.1.0`, it imports "sluice.dev/sdk/go"
# (package sluice, this directory) and calls sluice.Export from an init
# function. Nothing is downloaded (GOPROXY=off): the go.work below replaces
# the required version with the SDK copy. (A go.work `use` of the SDK would
# not do: a workspace module only adds a root to the module graph, and the
# go command still looks up the required sluice.dev/sdk/go@v0.1.0.)
#
# The WIT is the sluice tree's one copy, wit/ two levels above this script
# (set SLUICE_WIT to a directory holding sluice.wit to use another).
#
# Steps (a scratch directory, removed afterwards unless SLUICE_KEEP_WORK is
# set, holds everything between):
# 1. scripts/toolchains/go.sh: installs what is missing (quick when nothing is);
# 2. copies the SDK and generates its bindings for world `packed-out` with
#    `wit-bindgen go` into the copy's internal/wit (bindings are generated
#    at every build, never committed);
# 3. a go.work uses PROJECT_DIR and replaces sluice.dev/sdk/go v0.1.0 with
#    the SDK copy and go.bytecodealliance.org/pkg v0.4.0 (which the Go
#    module proxy does not serve) with the copy that go.sh vendored;
# 4. GOOS=wasip1 GOARCH=wasm `go build -buildmode=c-shared` makes a reactor
#    core module (-checklinkname=0: the pkg links runtime.sbrk);
# 5. `wasm-tools component embed` + `component new` make the component,
#    adapting WASI preview1 to p2 with the reactor adapter.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 PROJECT_DIR OUT.wasm" >&2
    exit 2
fi
sdk=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$sdk/../.." && pwd)
project=$(cd "$1" && pwd)
out=$(realpath -m "$2")
wit=${SLUICE_WIT:-$root/wit}
[[ -f "$wit/sluice.wit" ]] || { echo "$0: no sluice.wit in $wit (set SLUICE_WIT)" >&2; exit 1; }

toolchain_env=$("$root/scripts/toolchains/go.sh" --env)
eval "$toolchain_env"

work=$(mktemp -d)
trap '[[ -n "${SLUICE_KEEP_WORK:-}" ]] || rm -rf "$work"' EXIT

# A copy of the SDK (without its tests) with generated bindings.
mkdir -p "$work/sdk"
cp -r "$sdk/go.mod" "$sdk"/*.go "$sdk/internal" "$sdk/sluicetest" "$work/sdk/"
rm -f "$work/sdk"/*_test.go
wit-bindgen go --world packed-out --pkg-name sluice.dev/sdk/go/internal/wit --quiet \
    --out-dir "$work/sdk/internal/wit" "$wit" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

cat >"$work/go.work" <<WORK
go 1.25

use $project

replace (
	sluice.dev/sdk/go v0.1.0 => $work/sdk
	go.bytecodealliance.org/pkg v0.4.0 => $SLUICE_GO_PKG
)
WORK

(cd "$project" && GOWORK="$work/go.work" GOOS=wasip1 GOARCH=wasm GOFLAGS='' GOPROXY=off \
    go build -buildmode=c-shared -trimpath -ldflags="-s -w -checklinkname=0" -o "$work/core.wasm" .)

mkdir -p "$(dirname "$out")"
wasm-tools component embed "$wit" --world packed-out "$work/core.wasm" -o "$work/embedded.wasm"
wasm-tools component new "$work/embedded.wasm" --adapt "wasi_snapshot_preview1=$WASI_ADAPTER_REACTOR" -o "$out"
echo "build.sh: wrote $out ($(stat -c %s "$out") bytes)" >&2
