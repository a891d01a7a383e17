#!/usr/bin/env bash
# Builds a JavaScript sluice transform into a WebAssembly component.
#
#   sdks/javascript/build.sh PROJECT_DIR OUT_WASM
#
# PROJECT_DIR holds `app.js`, an ES module that exports `init` and `process`
# (`export const { init, process } = exportTransform(MyTransform);`), and any
# other modules it imports by relative path. It imports the SDK as
# "./sluice.js": the project does not contain it; this script copies the
# project's files (without testdata/ and node_modules/) and
# sdks/javascript/sluice.js into a temporary folder and builds from there.
# The WIT comes from wit/ at the repository root. The toolchain
# (componentize-js, pinned) is installed first by
# scripts/toolchains/javascript.sh if it is missing.
#
# WASI is disabled (-d stdio random clocks http fetch-event): the component
# imports nothing but sluice's own interfaces. console.* output goes to the
# host's log through the SDK; Math.random is deterministic; timers do not
# work (a stream transform has no use for them). Set SLUICE_JS_WASI=1 to keep
# stdio, random and clocks (the host provides them restricted); http and
# fetch-event are always disabled, as the host offers no wasi:http.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 PROJECT_DIR OUT_WASM" >&2
    exit 2
fi
sdk="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$sdk/../.." && pwd)"
project="$(cd "$1" && pwd)"
out="$2"
[[ -f "$project/app.js" ]] || { echo "$0: $project/app.js not found" >&2; exit 1; }
[[ -e "$project/sluice.js" ]] && { echo "$0: $project/sluice.js would shadow the SDK; remove it" >&2; exit 1; }

bin="$("$root/scripts/toolchains/javascript.sh" --print)"

disable=(http fetch-event)
[[ "${SLUICE_JS_WASI:-0}" == 1 ]] || disable+=(stdio random clocks)

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
tar -C "$project" --exclude=./testdata --exclude=./node_modules -cf - . | tar -C "$stage" -xf -
cp "$sdk/sluice.js" "$stage/sluice.js"
# Import specifiers must name the WIT package's exact version
# ("sluice:transform/state@0.1.1"); point every staged module at the version
# in wit/, so neither the SDK nor the project hard-codes it.
version="$(sed -n 's/^package sluice:transform@\([0-9][0-9.]*\);.*/\1/p' "$root/wit/sluice.wit")"
[[ -n "$version" ]] || { echo "$0: no 'package sluice:transform@VERSION;' in $root/wit/sluice.wit" >&2; exit 1; }
find "$stage" -name '*.js' -o -name '*.mjs' | while read -r f; do
    sed -i -E "s#(['\"]sluice:transform/[a-z-]+)(@[0-9][0-9.]*)?(['\"])#\1@$version\3#g" "$f"
done

mkdir -p "$(dirname "$out")"
out="$(cd "$(dirname "$out")" && pwd)/$(basename "$out")"
"$bin/componentize-js" --wit "$root/wit" -n transform -d "${disable[@]}" -o "$out" "$stage/app.js" >&2
echo "built $out ($(stat -c %s "$out") bytes)" >&2
