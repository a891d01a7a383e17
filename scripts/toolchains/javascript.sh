#!/usr/bin/env bash
# Installs the JavaScript guest toolchain: @bytecodealliance/componentize-js,
# pinned, in a local node_modules under $SLUICE_TOOLCHAINS/javascript/ (default ~/.cache/sluice/toolchains) at the
# repository root (ignored by git).
#
#   scripts/toolchains/javascript.sh          # install (a quick no-op when done)
#   scripts/toolchains/javascript.sh --print  # install, then print the bin dir
#
# Needs node (>= 18) and npm; fetches from the npm registry. componentize-js
# ships StarlingMonkey (SpiderMonkey compiled to wasm) inside the package, so
# nothing else is downloaded but weval, which scripts/toolchains/weval.sh
# builds from crates.io for the ahead-of-time compile (skipped with
# SLUICE_JS_AOT=0). Idempotent: the install records the version it
# was made for in .installed and is redone only when it differs.
set -euo pipefail

COMPONENTIZE_JS_VERSION=0.23.0

# shellcheck source=scripts/toolchains/npm-prefix.sh
. "$(dirname "$0")/npm-prefix.sh"
npm_prefix javascript "@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION" .bin/componentize-js \
    .bin/componentize-js --help

# weval, for build.sh's ahead-of-time compile (unless SLUICE_JS_AOT=0).
[[ "${SLUICE_JS_AOT:-1}" == 0 ]] || "$(dirname "$0")/weval.sh"

[[ "${1:-}" == "--print" ]] && echo "$dir/node_modules/.bin"
exit 0
