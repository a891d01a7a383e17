#!/usr/bin/env bash
# Builds a Python sluice transform into a WebAssembly component.
#
#   sdks/python/build.sh PROJECT_DIR OUT_WASM
#
# PROJECT_DIR holds `app.py`, the module that assigns
# `WitWorld = sluice.export(MyTransform)`, and any other pure-Python modules
# or packages it imports (these may also come from an active venv). The SDK
# (`sluice`) is taken from this folder (sdks/python/sluice), not kept in the
# project (the build copies both into a temporary folder); the WIT from wit/
# at the repository root. The toolchain
# (componentize-py, pinned) is installed first by scripts/toolchains/python.sh
# if it is missing.
#
# The component targets world `packed-out` (wit/sluice.wit: `timed`, that is
# `transform` plus the `time` import and the `migrate` and `on-timers`
# exports, so timers, windows and state time-to-live work; plus
# `process-packed-out`, through which a batch comes in and its outputs go
# out as one byte string each, and `hold-state`/`flush-state`), all of which
# the SDK's `export()` provides.
#
# The component imports WASI p2 (cli, io, clocks, random), which the host
# provides restricted; `print` output becomes host log lines. componentize-py
# can stub WASI out (-s), but such a component instantiates more than 32
# core instances and does not load in the host, so this script does not use
# it. Set SLUICE_PY_STUB_WASI=1 to build that way anyway.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 PROJECT_DIR OUT_WASM" >&2
    exit 2
fi
sdk="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$sdk/../.." && pwd)"
project="$(cd "$1" && pwd)"
out="$2"
[[ -f "$project/app.py" ]] || { echo "$0: $project/app.py not found" >&2; exit 1; }

bin="$("$root/scripts/toolchains/python.sh" --print)"

stub=()
[[ "${SLUICE_PY_STUB_WASI:-0}" == 1 ]] && stub=(-s)

# componentize-py imports the app at build time and leaves __pycache__
# folders behind, so build from copies: the project (without testdata/ and
# caches) and the SDK package.
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/app" "$stage/sdk"
tar -C "$project" --exclude=./testdata --exclude=__pycache__ --exclude=.venv -cf - . | tar -C "$stage/app" -xf -
tar -C "$sdk" --exclude=__pycache__ --exclude='*.so' -cf - sluice | tar -C "$stage/sdk" -xf -
# The SDK's per-record path in C (native/_speedups.c), linked into the
# component by componentize-py (it finds the .so in the package).
"$sdk/native/build.sh" wasm "$stage/sdk/sluice"

mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
# Only modules that app.py imports end up in the component. Besides the
# project and the SDK, componentize-py searches the site-packages of an
# active venv ($VIRTUAL_ENV), so pure-Python dependencies can come from there.
(cd "$stage" && "$bin/componentize-py" -q -d "$root/wit" -w packed-out \
    componentize "${stub[@]}" -p "$stage/app" -p "$stage/sdk" app -o "$out")
echo "built $out ($(stat -c %s "$out") bytes)" >&2
