#!/usr/bin/env bash
# Tests the Go SDK:
#
#   sdks/go/test.sh                 # unit tests + the component build of the SDK
#   SLUICE=path/to/sluice sdks/go/test.sh   # ... + every examples/go/* through `sluice exec`
#
# 1. `go vet` and `go test` natively: the SDK runs against the simulated
#    host of internal/simhost (package sluicetest), so no bindings are needed;
# 2. like build.sh, a scratch copy of the SDK with `wit-bindgen go` bindings
#    for world `packed`, compiled for GOOS=wasip1 (host_wasm.go and the
#    export glue, which step 1 does not compile);
# 3. with $SLUICE set: builds each examples/go/<name> with build.sh and
#    checks that `sluice exec` (with testdata/args) prints exactly
#    testdata/expected.jsonl.
set -euo pipefail

sdk=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$sdk/../.." && pwd)
wit=${SLUICE_WIT:-$root/wit}
eval "$("$root/scripts/toolchains/go.sh" --env)"
export GOFLAGS='' GOPROXY=off

echo "test.sh: go vet + go test (native, simulated host)" >&2
(cd "$sdk" && go vet ./... && go test -count=1 ./...)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "test.sh: the SDK with generated bindings, for GOOS=wasip1" >&2
mkdir -p "$work/sdk"
cp -r "$sdk/go.mod" "$sdk"/*.go "$sdk/internal" "$sdk/sluicetest" "$work/sdk/"
wit-bindgen go --world packed --pkg-name sluice.dev/sdk/go/internal/wit --quiet \
    --out-dir "$work/sdk/internal/wit" "$wit" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
cat >"$work/go.work" <<WORK
go 1.25

use $work/sdk

replace go.bytecodealliance.org/pkg v0.4.0 => $SLUICE_GO_PKG
WORK
(cd "$work/sdk" && GOWORK="$work/go.work" GOOS=wasip1 GOARCH=wasm go build -ldflags=-checklinkname=0 . ./internal/...)

if [[ -n "${SLUICE:-}" ]]; then
    for project in "$root"/examples/go/*/; do
        name=$(basename "$project")
        echo "test.sh: examples/go/$name through sluice exec" >&2
        "$sdk/build.sh" "$project" "$work/$name.wasm"
        args=()
        [[ ! -f "$project/testdata/args" ]] || mapfile -t args <"$project/testdata/args"
        "$SLUICE" exec "$work/$name.wasm" --input "$project/testdata/input.jsonl" "${args[@]}" >"$work/$name.out"
        diff "$work/$name.out" "$project/testdata/expected.jsonl"
    done
fi
echo "test.sh: ok" >&2
