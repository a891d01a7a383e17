#!/usr/bin/env bash
# Installs schemathesis, the schema-driven API fuzzer the tests run against a
# live `sluice serve`, pinned, in a venv under $SLUICE_TOOLCHAINS/schemathesis/
# (default ~/.cache/sluice/toolchains).
#
#   scripts/toolchains/schemathesis.sh          # install (a quick no-op when done)
#   scripts/toolchains/schemathesis.sh --print  # install, then print the bin dir
#
# Needs python3 (>= 3.9) with the venv module; fetches from PyPI with pip.
# Idempotent: the venv records the version it was built for in .installed and
# is rebuilt only when it differs.
set -euo pipefail

SCHEMATHESIS_VERSION=4.32.5

dir="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}/schemathesis"
venv="$dir/venv"
stamp="$dir/.installed"
want="schemathesis==$SCHEMATHESIS_VERSION"

say() { echo "toolchains/schemathesis.sh: $*" >&2; }

if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" || ! -x "$venv/bin/st" ]]; then
    python=${PYTHON:-python3}
    command -v "$python" >/dev/null || { say "$python not found; install Python 3 first"; exit 1; }
    say "installing $want into $venv"
    rm -rf "$venv" "$stamp"
    mkdir -p "$dir"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$want"
    "$venv/bin/st" --version >/dev/null
    echo "$want" >"$stamp"
fi

[[ "${1:-}" == "--print" ]] && echo "$venv/bin"
exit 0
