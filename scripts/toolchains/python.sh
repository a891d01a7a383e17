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

# shellcheck source=scripts/toolchains/pip-venv.sh
. "$(dirname "$0")/pip-venv.sh"
pip_venv python "componentize-py==$COMPONENTIZE_PY_VERSION" componentize-py

[[ "${1:-}" == "--print" ]] && echo "$venv/bin"
exit 0
