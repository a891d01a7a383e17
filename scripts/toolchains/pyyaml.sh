#!/usr/bin/env bash
# Installs PyYAML (pinned) into its own venv, for the check of the
# Kubernetes example (deploy/kubernetes/check.py). With --print, prints the
# venv's python.
set -euo pipefail

PYYAML_VERSION=6.0.3

. "$(dirname "$0")/pip-venv.sh"
pip_venv pyyaml "PyYAML==$PYYAML_VERSION" python

[[ "${1:-}" == "--print" ]] && echo "$venv/bin/python"
exit 0
