#!/usr/bin/env bash
# Installs what sdks/go/build.sh needs to build Go transforms:
#
# - Go >= 1.25 (go:wasmexport, GOOS=wasip1 c-shared). The machines have Go
#   1.26 in /usr/local/go; an older Go (>= 1.21) is upgraded the Go way,
#   GOTOOLCHAIN=go1.26.0 (the toolchain module, from the Go module proxy).
# - the shared component tools (scripts/toolchains/wasm-tools.sh): wit-bindgen,
#   wasm-tools and the preview1 reactor adapter, under $SLUICE_TOOLCHAINS;
# - $SLUICE_TOOLCHAINS/go/pkg: go.bytecodealliance.org/pkg v0.4.0, the runtime
#   package that `wit-bindgen go` 0.63 output imports. The Go module proxy
#   does not serve v0.4.0 (404), so it is vendored from the copy that the
#   wit-bindgen-go 0.63.0 crate carries (crates.io), with its `go 1.27.1`
#   line lowered to `go 1.25`. build.sh points a go.work `replace` at it.
#
#   scripts/toolchains/go.sh          # install what is missing
#   scripts/toolchains/go.sh --env    # then print `export PATH=...` etc.
#
# Idempotent and quick when everything is installed (`go version`, two
# `--version` checks, a file test).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tc="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}"
pkg="$tc/go/pkg"
WIT_BINDGEN_GO_VERSION=0.63.0 # must match wasm-tools.sh's wit-bindgen
say() { echo "go.sh: $*" >&2; }

go_toolchain=
command -v go >/dev/null || { say "go not found: install Go >= 1.25 (the machines have it in /usr/local/go/bin)"; exit 1; }
minor=$(go env GOVERSION | sed -E 's/^go1\.([0-9]+).*/\1/')
if ((minor < 25)); then
    go_toolchain=go1.26.0
    say "go $(go env GOVERSION) is too old; using GOTOOLCHAIN=$go_toolchain"
    GOTOOLCHAIN=$go_toolchain go version >/dev/null
fi

"$here/wasm-tools.sh"

if [[ "$(cat "$pkg/.version" 2>/dev/null)" != "$WIT_BINDGEN_GO_VERSION" ]]; then
    say "vendoring go.bytecodealliance.org/pkg from wit-bindgen-go $WIT_BINDGEN_GO_VERSION (crates.io)"
    mkdir -p "$tc/go"
    exec 9>"$tc/go/.lock"
    flock 9
    fetch="$tc/go/fetch"
    mkdir -p "$fetch/src"
    : >"$fetch/src/lib.rs"
    cat >"$fetch/Cargo.toml" <<TOML
[package]
name = "fetch-go-pkg"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
wit-bindgen-go = { version = "=$WIT_BINDGEN_GO_VERSION", default-features = false }

[workspace]
TOML
    manifest=$(cd "$root" && cargo metadata --quiet --format-version 1 --manifest-path "$fetch/Cargo.toml" \
        | python3 -c 'import json,sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "wit-bindgen-go": print(p["manifest_path"])')
    rm -rf "$pkg" "$fetch"
    cp -r "$(dirname "$manifest")/src/pkg" "$pkg"
    chmod -R u+w "$pkg"
    sed -i -E 's/^go 1\.[0-9.]+$/go 1.25/' "$pkg/go.mod"
    echo "$WIT_BINDGEN_GO_VERSION" >"$pkg/.version"
fi

if [[ "${1:-}" == "--env" ]]; then
    "$here/wasm-tools.sh" --env
    echo "export SLUICE_GO_PKG=\"$pkg\""
    [[ -z "$go_toolchain" ]] || echo "export GOTOOLCHAIN=$go_toolchain"
fi
