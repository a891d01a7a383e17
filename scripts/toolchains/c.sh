#!/usr/bin/env bash
# Installs what sdks/c/build.sh needs to build C transforms:
#
# - Debian packages (apt-get, needs root): clang-19, lld-19, wasi-libc (the
#   wasm32-wasi sysroot) and libclang-rt-19-dev-wasm32 (compiler-rt builtins
#   for wasm32);
# - the shared component tools (scripts/toolchains/wasm-tools.sh): wit-bindgen,
#   wasm-tools and the preview1 reactor adapter, under $SLUICE_TOOLCHAINS.
#
#   scripts/toolchains/c.sh          # install what is missing
#   scripts/toolchains/c.sh --env    # then print `export PATH=...` etc.
#   scripts/toolchains/c.sh --compiler  # only the Debian packages (the
#                                       # Python SDK's C core needs no more)
#
# Idempotent and quiet when everything is installed (a dpkg query and two
# `--version` checks).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)

"$here/apt.sh" clang-19 lld-19 wasi-libc libclang-rt-19-dev-wasm32

if [[ "${1:-}" == "--compiler" ]]; then
    exit 0
elif [[ "${1:-}" == "--env" ]]; then
    "$here/wasm-tools.sh" --env
    echo "export CC=/usr/bin/clang-19"
else
    "$here/wasm-tools.sh"
fi
