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
# nothing else is downloaded. Idempotent: the install records the version it
# was made for in .installed and is redone only when it differs.
set -euo pipefail

COMPONENTIZE_JS_VERSION=0.23.0

root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}/javascript"
stamp="$dir/.installed"
want="@bytecodealliance/componentize-js@$COMPONENTIZE_JS_VERSION"

say() { echo "toolchains/javascript.sh: $*" >&2; }

if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" || ! -x "$dir/node_modules/.bin/componentize-js" ]]; then
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then say "node and npm are needed"; exit 1; fi
    say "installing $want into $dir"
    rm -rf "$dir/node_modules" "$stamp"
    mkdir -p "$dir"
    # A private package.json keeps npm from walking up to any other project.
    [[ -f "$dir/package.json" ]] || echo '{ "name": "sluice-js-toolchain", "private": true }' >"$dir/package.json"
    (cd "$dir" && npm install --no-audit --no-fund --save-exact --loglevel=error "$want" >&2)
    "$dir/node_modules/.bin/componentize-js" --help >/dev/null
    echo "$want" >"$stamp"
fi

[[ "${1:-}" == "--print" ]] && echo "$dir/node_modules/.bin"
exit 0
