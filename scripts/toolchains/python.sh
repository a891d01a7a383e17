#!/usr/bin/env bash
# Installs the Python guest toolchain: componentize-py, pinned, in a venv
# under $SLUICE_TOOLCHAINS/python/ (default ~/.cache/sluice/toolchains).
#
#   scripts/toolchains/python.sh          # install (a quick no-op when done)
#   scripts/toolchains/python.sh --print  # install, then print the bin dir
#
# Needs python3 (>= 3.9) with the venv module; fetches from PyPI with pip.
# componentize-py bundles its own CPython for wasm, so the host Python's
# version does not matter for the guest. Idempotent: the venv records the
# version it was built for in .installed and is rebuilt only when it differs.
set -euo pipefail

COMPONENTIZE_PY_VERSION=0.25.1

root="$(cd "$(dirname "$0")/../.." && pwd)"
dir="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}/python"
venv="$dir/venv"
stamp="$dir/.installed"
want="componentize-py==$COMPONENTIZE_PY_VERSION"

say() { echo "toolchains/python.sh: $*" >&2; }

if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" || ! -x "$venv/bin/componentize-py" ]]; then
    python=${PYTHON:-python3}
    command -v "$python" >/dev/null || { say "$python not found; install Python 3 first"; exit 1; }
    say "installing $want into $venv"
    rm -rf "$venv" "$stamp"
    mkdir -p "$dir"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$want"
    "$venv/bin/componentize-py" --version >/dev/null
    echo "$want" >"$stamp"
fi

[[ "${1:-}" == "--print" ]] && echo "$venv/bin"
exit 0
