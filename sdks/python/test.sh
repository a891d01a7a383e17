#!/usr/bin/env bash
# Runs the Python SDK's tests twice: on the pure-Python path
# (SLUICE_PY_SPEEDUPS=0), and on the C core (native/_speedups.c) built for
# this machine's python3 into a copy of the package. Components always run
# the C core (build.sh builds it for wasm); plain CPython runs whichever is
# there, so both must behave alike.
set -euo pipefail
cd "$(dirname "$0")"

echo "python sdk: pure Python" >&2
SLUICE_PY_SPEEDUPS=0 python3 -B -m unittest discover -s tests -q

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
tar --exclude=__pycache__ -cf - sluice | tar -C "$tmp" -xf -
native/build.sh host "$tmp/sluice"
echo "python sdk: C core" >&2
SLUICE_PY_SDK="$tmp" SLUICE_PY_SPEEDUPS=1 python3 -B -m unittest discover -s tests -q
