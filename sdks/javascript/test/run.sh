#!/usr/bin/env bash
# Runs the JavaScript SDK's tests with node (>= 20.6), outside any component.
set -euo pipefail
cd "$(dirname "$0")"
exec node --import ./register.mjs --test sluice.test.mjs
