#!/usr/bin/env bash
# Builds a Go sluice transform into a WebAssembly component.
#
#   sdks/go/build.sh PROJECT_DIR OUT.wasm
#
# PROJECT_DIR is a Go module whose root package is `package main`, laid out
# like examples/go/running-count: it imports "sluice" (this SDK) and calls
# sluice.Export from an init function. Its go.mod needs no `require` for
# sluice: the build puts both modules in one Go workspace.
#
# Steps (a scratch directory, removed afterwards, holds everything between):
# 1. scripts/toolchains/go.sh: installs what is missing (quick when nothing is);
# 2. copies the SDK and generates its bindings with `wit-bindgen go` from
#    wit/ into the copy's internal/wit (bindings are generated at every
#    build, never committed);
# 3. a go.work joins the SDK copy and PROJECT_DIR, and replaces
#    go.bytecodealliance.org/pkg v0.4.0 (which the Go module proxy does not
#    serve) with the copy that go.sh vendored;
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

toolchain_env=$("$root/scripts/toolchains/go.sh" --env)
eval "$toolchain_env"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

mkdir -p "$work/sluice"
cp -r "$sdk/go.mod" "$sdk"/*.go "$sdk/internal" "$work/sluice/"
wit-bindgen go --world transform --pkg-name sluice/internal/wit --quiet \
    --out-dir "$work/sluice/internal/wit" "$root/wit" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

cat >"$work/go.work" <<EOF
go 1.25

use (
	$work/sluice
	$project
)

replace go.bytecodealliance.org/pkg v0.4.0 => $SLUICE_GO_PKG
EOF

(cd "$project" && GOWORK="$work/go.work" GOOS=wasip1 GOARCH=wasm GOFLAGS='' \
    go build -buildmode=c-shared -trimpath -ldflags="-s -w -checklinkname=0" -o "$work/core.wasm" .)

mkdir -p "$(dirname "$out")"
wasm-tools component embed "$root/wit" --world transform "$work/core.wasm" -o "$work/embedded.wasm"
wasm-tools component new "$work/embedded.wasm" --adapt "wasi_snapshot_preview1=$WASI_ADAPTER_REACTOR" -o "$out"
echo "build.sh: wrote $out ($(stat -c %s "$out") bytes)" >&2
