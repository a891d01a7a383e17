#!/usr/bin/env bash
# Installs the component tools that the Go and C guest toolchains share, into
# $SLUICE_TOOLCHAINS (default ~/.cache/sluice/toolchains, shared by every clone), all from crates.io:
#
#   $SLUICE_TOOLCHAINS/cargo/bin/wit-bindgen   wit-bindgen-cli 0.63.0 (C and Go generators)
#   $SLUICE_TOOLCHAINS/cargo/bin/wasm-tools    wasm-tools 1.262.0 (`component` subcommands only)
#   $SLUICE_TOOLCHAINS/adapters/wasi_snapshot_preview1.reactor.wasm
#                                       the WASI preview1 -> p2 reactor adapter, from
#                                       wasi-preview1-component-adapter-provider 50.0.1
#
#   scripts/toolchains/wasm-tools.sh          # install what is missing
#   scripts/toolchains/wasm-tools.sh --env    # then print `export PATH=...` etc.
#
# Idempotent: when everything is there it only runs the two `--version` checks.
# A cold install compiles both tools (one shared target dir, deleted after):
# about 10 minutes with one job. Cargo runs with `-j 1` because the machines
# have 2 cores and the host may be building at the same time; set
# CARGO_BUILD_JOBS to override. Concurrent runs wait on a lock.
set -euo pipefail

WIT_BINDGEN_VERSION=0.63.0
WASM_TOOLS_VERSION=1.262.0
ADAPTER_VERSION=50.0.1

root=$(cd "$(dirname "$0")/../.." && pwd)
tc="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}"
bin="$tc/cargo/bin"
adapter="$tc/adapters/wasi_snapshot_preview1.reactor.wasm"
say() { echo "wasm-tools.sh: $*" >&2; }

has() { # has BIN VERSION: BIN --version mentions VERSION
    [[ -x "$bin/$1" ]] && [[ "$("$bin/$1" --version 2>/dev/null)" == *" $2"* ]]
}

installed() {
    has wit-bindgen "$WIT_BINDGEN_VERSION" && has wasm-tools "$WASM_TOOLS_VERSION" \
        && [[ -s "$adapter" && "$(cat "$adapter.version" 2>/dev/null)" == "$ADAPTER_VERSION" ]]
}

install() {
    mkdir -p "$tc"
    exec 9>"$tc/.wasm-tools.lock"
    flock 9
    installed && return 0
    command -v cargo >/dev/null || { say "cargo not found (install Rust with rustup)"; exit 1; }
    local jobs=${CARGO_BUILD_JOBS:-1} build="$tc/cargo-build" t0=$SECONDS
    # Run cargo from the repository so it uses the pinned toolchain
    # (rust-toolchain.toml).
    cd "$root"
    if ! has wit-bindgen "$WIT_BINDGEN_VERSION"; then
        say "installing wit-bindgen-cli $WIT_BINDGEN_VERSION (cargo, -j $jobs)"
        CARGO_TARGET_DIR="$build" cargo install --quiet --locked -j "$jobs" --root "$tc/cargo" \
            wit-bindgen-cli --version "=$WIT_BINDGEN_VERSION" --no-default-features --features c,go
    fi
    if ! has wasm-tools "$WASM_TOOLS_VERSION"; then
        say "installing wasm-tools $WASM_TOOLS_VERSION (cargo, -j $jobs)"
        CARGO_TARGET_DIR="$build" cargo install --quiet --locked -j "$jobs" --root "$tc/cargo" \
            wasm-tools --version "=$WASM_TOOLS_VERSION" --no-default-features --features component
    fi
    rm -rf "$build"
    if [[ ! -s "$adapter" || "$(cat "$adapter.version" 2>/dev/null)" != "$ADAPTER_VERSION" ]]; then
        say "fetching the preview1 reactor adapter $ADAPTER_VERSION (crates.io)"
        # A throwaway package that depends on the adapter crate: `cargo
        # metadata` downloads the crate and tells where its files are.
        local fetch="$tc/adapters/fetch"
        mkdir -p "$fetch/src"
        : >"$fetch/src/lib.rs"
        cat >"$fetch/Cargo.toml" <<TOML
[package]
name = "fetch-adapter"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
wasi-preview1-component-adapter-provider = "=$ADAPTER_VERSION"

[workspace]
TOML
        local manifest
        manifest=$(cargo metadata --quiet --format-version 1 --manifest-path "$fetch/Cargo.toml" \
            | python3 -c 'import json,sys
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "wasi-preview1-component-adapter-provider": print(p["manifest_path"])')
        cp "$(dirname "$manifest")/artefacts/wasi_snapshot_preview1.reactor.wasm" "$adapter"
        echo "$ADAPTER_VERSION" >"$adapter.version"
        rm -rf "$fetch"
    fi
    installed || { say "install finished but the tools do not check out"; exit 1; }
    say "done in $((SECONDS - t0)) s"
}

installed || install
if [[ "${1:-}" == "--env" ]]; then
    echo "export PATH=\"$bin:\$PATH\""
    echo "export WASI_ADAPTER_REACTOR=\"$adapter\""
fi
