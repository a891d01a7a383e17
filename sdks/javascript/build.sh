#!/usr/bin/env bash
# Builds a JavaScript sluice transform into a WebAssembly component.
#
#   sdks/javascript/build.sh PROJECT_DIR OUT_WASM
#
# PROJECT_DIR holds `app.js`, an ES module that exports the world `timed`'s
# functions (`export const { init, process, migrate, onTimers } =
# exportTransform(MyTransform);`), and any other modules it imports by
# relative path. It imports the SDK by its package name, "sluice-guest"
# (the project's package.json depends on it); this script copies the
# project's files (without testdata/ and node_modules/) into a temporary
# folder, stages this folder's SDK there as node_modules/sluice-guest (no
# network, no npm), and points every `from "sluice-guest"` at it, since
# componentize-js resolves relative specifiers only. Projects written for
# the first SDK, which import "./sluice.js" and export only `init` and
# `process`, build unchanged: the SDK is also staged as ./sluice.js, and a
# generated entry module supplies a no-op `migrate` and an `onTimers` that
# fails if a timer ever fires. The WIT comes from wit/ at the repository root;
# the world is `packed-out` (`timed`, plus `process-packed-out`, which takes
# a batch and returns its outputs as one byte string each: componentize-js's
# glue, which runs interpreted, converts a byte string whole where it spent
# tens of microseconds on every record object). The toolchain (componentize-js, pinned) is installed
# first by scripts/toolchains/javascript.sh if it is missing.
#
# The component is compiled ahead of time (componentize-js `--aot`): weval
# specializes StarlingMonkey's interpreter to the transform's JavaScript,
# which moves running-count's records about 1.7x as fast as the interpreter
# alone, for a component about 45% larger. weval comes from crates.io
# (scripts/toolchains/weval.sh; componentize-js's own route downloads it
# from GitHub). Set SLUICE_JS_AOT=0 to build for the interpreter alone
# (no weval, no cargo needed).
#
# WASI is disabled (-d stdio random clocks http fetch-event): the component
# imports nothing but sluice's own interfaces. console.* output goes to the
# host's log through the SDK; Math.random is deterministic; JavaScript's
# timers (setTimeout) do not work: use the SDK's `Timer`. Set SLUICE_JS_WASI=1 to keep
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
entry=sluice-entry.js
[[ -e "$project/$entry" ]] && { echo "$0: $project/$entry is the build's generated entry; rename it" >&2; exit 1; }

bin="$("$root/scripts/toolchains/javascript.sh" --print)"
aot=()
case "${SLUICE_JS_AOT:-1}" in
    1) aot=(--aot --weval-bin "$("$root/scripts/toolchains/weval.sh" --print)") ;;
    0) ;;
    *) echo "$0: SLUICE_JS_AOT must be 1 (the default) or 0, not '$SLUICE_JS_AOT'" >&2; exit 2 ;;
esac

disable=(http fetch-event)
[[ "${SLUICE_JS_WASI:-0}" == 1 ]] || disable+=(stdio random clocks)

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
tar -C "$project" --exclude=./testdata --exclude=./node_modules -cf - . | tar -C "$stage" -xf -
# The SDK as the package the project depends on ...
pkg="$stage/node_modules/sluice-guest"
mkdir -p "$pkg"
cp "$sdk/sluice.js" "$sdk/package.json" "$pkg/"
# ... and where projects of the first SDK import it from.
cp "$sdk/sluice.js" "$stage/sluice.js"
# componentize-js (StarlingMonkey) resolves relative specifiers only: point
# every `"sluice-guest"` import of the project's modules at the staged
# package, relative to the importing file.
find "$stage" -path "$stage/node_modules" -prune -o \( -name '*.js' -o -name '*.mjs' \) -print | while read -r f; do
    rel="$(dirname "${f#"$stage"/}")"
    up="./"
    if [[ "$rel" != "." ]]; then up="$(echo "$rel" | sed -E 's#[^/]+#..#g')/"; fi
    sed -i -E "s#(from|import)([[:space:]]*)(['\"])sluice-guest(['\"])#\1\2\3${up}node_modules/sluice-guest/sluice.js\4#g" "$f"
done
# The entry: app.js's exports, with defaults for the ones the world `timed`
# adds that a project of the first SDK does not export, and the exports of
# world `packed-out` (batches and outputs as one byte string each) over
# app.js's `process`.
cat >"$stage/$entry" <<'JS'
import * as app from "./app.js";
import { packedExports } from "./node_modules/sluice-guest/sluice.js";
export const init = app.init;
export const process = app.process;
export const { processPacked, processPackedOut, holdState, flushState } = packedExports(app.process);
export const migrate = app.migrate ?? (() => {});
export const onTimers =
  app.onTimers ??
  ((fired) => {
    if (fired.length === 0) return [];
    throw "a timer fired, but app.js exports no onTimers (export it from exportTransform)";
  });
JS
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
"$bin/componentize-js" "${aot[@]}" --wit "$root/wit" -n packed-out -d "${disable[@]}" -o "$out" "$stage/$entry" >&2
echo "built $out ($(stat -c %s "$out") bytes)" >&2
