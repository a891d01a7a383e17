#!/usr/bin/env bash
# Builds a C sluice transform into a WebAssembly component.
#
#   sdks/c/build.sh PROJECT_DIR OUT.wasm
#
# PROJECT_DIR holds the transform's .c (and .h) files, laid out like
# examples/c/running-count: every *.c directly in it is compiled together
# with the SDK (sdks/c/sluice.c). Extra compiler flags: $CFLAGS.
#
# Steps (a scratch directory, removed afterwards, holds everything between):
# 1. scripts/toolchains/c.sh: installs what is missing (quick when nothing is);
# 2. `wit-bindgen c` generates transform.h/.c and the component-type object
#    from wit/ (bindings are generated at every build, never committed);
# 3. clang-19 compiles and links a wasm32-wasi reactor module with Debian's
#    wasi-libc (which clang finds under /usr/{include,lib}/wasm32-wasi);
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

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

wit-bindgen c --world transform --out-dir "$work/gen" "$root/wit" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }

# -mexec-model=reactor: no main; the host calls the exports after
# `_initialize`. --strip-debug keeps the component small.
# shellcheck disable=SC2086 # CFLAGS is a list of flags
"$CC" --target=wasm32-wasi -mexec-model=reactor -fuse-ld=lld \
    -O2 -Wall -Wextra ${CFLAGS:-} \
    -I"$work/gen" -I"$sdk" -I"$project" \
    "${sources[@]}" "$sdk/sluice.c" "$work/gen/transform.c" "$work/gen/transform_component_type.o" \
    -Wl,--strip-debug -o "$work/core.wasm"

mkdir -p "$(dirname "$out")"
wasm-tools component new "$work/core.wasm" --adapt "wasi_snapshot_preview1=$WASI_ADAPTER_REACTOR" -o "$out"
echo "build.sh: wrote $out ($(stat -c %s "$out") bytes)" >&2
