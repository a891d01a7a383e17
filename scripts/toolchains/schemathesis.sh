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

# shellcheck source=scripts/toolchains/pip-venv.sh
. "$(dirname "$0")/pip-venv.sh"
pip_venv schemathesis "schemathesis==$SCHEMATHESIS_VERSION" st

[[ "${1:-}" == "--print" ]] && echo "$venv/bin"
exit 0
