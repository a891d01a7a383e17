#!/usr/bin/env bash
# Installs weval, the WebAssembly partial evaluator behind componentize-js's
# `--aot`, from crates.io into $SLUICE_TOOLCHAINS (default
# ~/.cache/sluice/toolchains, shared by every clone):
#
#   $SLUICE_TOOLCHAINS/cargo/bin/weval   weval 0.5.0
#
#   scripts/toolchains/weval.sh           # install if missing
#   scripts/toolchains/weval.sh --print   # then print the binary's path
#
# With `--aot`, componentize-js has weval specialize StarlingMonkey's
# interpreter to the transform's own JavaScript ahead of time, with the
# inline-cache stubs componentize-js ships (lib/starlingmonkey_ics.wevalcache).
# componentize-js fetches weval through the @bytecodealliance/weval npm
# package, which downloads the binary from GitHub releases at build time; a
# machine that reaches only the package registries cannot, so
# sdks/javascript/build.sh passes this one with `--weval-bin`. The version
# is the one that npm package pins (its TAG), which the shipped cache
# matches: change it only with COMPONENTIZE_JS_VERSION in javascript.sh.
#
# Idempotent: when weval is there it only runs `weval --version`. A cold
# install compiles weval and the wasmtime it embeds: about 10 minutes with
# two jobs, 20 with one. Cargo runs with `-j 1` because the machines have 2
# cores and the host may be building at the same time; set CARGO_BUILD_JOBS
# to override. Concurrent runs wait on a lock.
set -euo pipefail

WEVAL_VERSION=0.5.0

root=$(cd "$(dirname "$0")/../.." && pwd)
tc="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}"
weval="$tc/cargo/bin/weval"
say() { echo "weval.sh: $*" >&2; }

installed() {
    [[ -x "$weval" ]] && [[ "$("$weval" --version 2>/dev/null)" == "weval $WEVAL_VERSION" ]]
}

install() {
    mkdir -p "$tc"
    exec 9>"$tc/.weval.lock"
    flock 9
    installed && return 0
    command -v cargo >/dev/null || {
        say "cargo not found (install Rust with rustup, or build with SLUICE_JS_AOT=0)"
        exit 1
    }
    local jobs=${CARGO_BUILD_JOBS:-1} build="$tc/cargo-build-weval" t0=$SECONDS
    say "installing weval $WEVAL_VERSION (cargo, -j $jobs; once per machine)"
    # From the repository, so cargo uses the pinned toolchain (rust-toolchain.toml).
    cd "$root"
    CARGO_TARGET_DIR="$build" cargo install --quiet --locked -j "$jobs" --root "$tc/cargo" \
        weval --version "=$WEVAL_VERSION"
    rm -rf "$build"
    installed || { say "install finished but weval does not check out"; exit 1; }
    say "done in $((SECONDS - t0)) s"
}

installed || install
[[ "${1:-}" == "--print" ]] && echo "$weval"
exit 0
