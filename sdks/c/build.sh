#!/usr/bin/env bash
# Builds a C sluice transform into a WebAssembly component.
#
#   sdks/c/build.sh PROJECT_DIR OUT.wasm
#
# PROJECT_DIR holds the transform's .c (and .h) files, laid out like
# examples/c/running-count: every *.c directly in it is compiled and linked
# against the SDK by name and version, through pkg-config. Extra compiler
# flags: $CFLAGS.
#
# Steps:
# 1. scripts/toolchains/c.sh: installs what is missing (quick when nothing is);
# 2. the SDK (`make -C sdks/c install`: libsluice.a, include/sluice/*.h,
#    lib/pkgconfig/sluice.pc) is installed, if it is not yet, under
#    $SLUICE_C_SDK_PREFIX (default $SLUICE_TOOLCHAINS/c-sdk-<version>, i.e.
#    ~/.cache/sluice/toolchains/c-sdk-0.1.0). The install records a hash of
#    the SDK's sources and the WIT; a different hash reinstalls it, so a
#    changed checkout never links a stale SDK. A lock serializes builds;
# 3. clang-19 compiles and links a wasm32-wasi reactor module:
#    `$CC --target=wasm32-wasi ... $(pkg-config --cflags --libs sluice)`;
# 4. `wasm-tools component new` wraps it in a component, adapting WASI
#    preview1 to the p2 imports the host offers with the reactor adapter.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 PROJECT_DIR OUT.wasm" >&2
    exit 2
fi
sdk=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$sdk/../.." && pwd)
project=$(cd "$1" && pwd)
out=$(realpath -m "$2")

toolchain_env=$("$root/scripts/toolchains/c.sh" --env)
eval "$toolchain_env"

shopt -s nullglob
sources=("$project"/*.c)
if ((${#sources[@]} == 0)); then
    echo "build.sh: no .c files in $project" >&2
    exit 1
fi

version=$(sed -n 's/^VERSION := *//p' "$sdk/Makefile")
toolchains=${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}
prefix=${SLUICE_C_SDK_PREFIX:-$toolchains/c-sdk-$version}
mkdir -p "$(dirname "$prefix")"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# One build at a time touches the install (tests build in parallel).
exec 9>"$prefix.lock"
flock 9
stamp=$(cat "$sdk/sluice.c" "$sdk/sluice.h" "$sdk/Makefile" "$sdk/sluice.pc.in" "$root/wit/sluice.wit" | sha256sum | cut -d' ' -f1)
if [[ "$(cat "$prefix/.sources-sha256" 2>/dev/null)" != "$stamp" ]]; then
    echo "build.sh: installing the C SDK $version into $prefix" >&2
    rm -rf "$prefix"
    make -s -C "$sdk" install PREFIX="$prefix" O="$work/sdk" CC="$CC" >&2
    echo "$stamp" >"$prefix/.sources-sha256"
fi

export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pkg-config --exists "sluice = $version" || { echo "build.sh: pkg-config finds no sluice $version" >&2; exit 1; }
read -r -a sdk_cflags <<<"$(pkg-config --cflags sluice)"
read -r -a sdk_libs <<<"$(pkg-config --libs sluice)"

# --strip-debug keeps the component small.
# shellcheck disable=SC2086 # CFLAGS is a list of flags
"$CC" --target=wasm32-wasi -fuse-ld=lld -O2 -Wall -Wextra ${CFLAGS:-} \
    -I"$project" "${sdk_cflags[@]}" \
    "${sources[@]}" "${sdk_libs[@]}" \
    -Wl,--strip-debug -o "$work/core.wasm"
exec 9>&-

mkdir -p "$(dirname "$out")"
wasm-tools component new "$work/core.wasm" --adapt "wasi_snapshot_preview1=$WASI_ADAPTER_REACTOR" -o "$out"
echo "build.sh: wrote $out ($(stat -c %s "$out") bytes)" >&2
