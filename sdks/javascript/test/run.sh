#!/usr/bin/env bash
# Runs the JavaScript SDK's tests with node (>= 20.6), outside any component:
# ../testing/register.js maps the WIT imports to the simulated host.
set -euo pipefail
cd "$(dirname "$0")"
exec node --import ../testing/register.js --test sluice.test.mjs state.test.mjs time.test.mjs
