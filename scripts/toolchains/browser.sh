#!/usr/bin/env bash
# Installs what the dashboard's browser test needs: Debian's Chromium (run
# headless) and playwright-core, pinned, the npm client that drives it over
# the DevTools protocol, in a local node_modules under
# $SLUICE_TOOLCHAINS/browser/ (default ~/.cache/sluice/toolchains).
#
#   scripts/toolchains/browser.sh          # install (a quick no-op when done)
#   scripts/toolchains/browser.sh --print  # install, then print the node_modules dir
#
# Needs apt-get (as root, or sudo) for Chromium, and node (>= 18) with npm.
# playwright-core downloads no browser of its own; the test points it at
# /usr/bin/chromium (or $SLUICE_CHROMIUM). Idempotent: the install records
# the version it was made for in .installed and is redone only when it
# differs.
set -euo pipefail

PLAYWRIGHT_CORE_VERSION=1.57.0


chromium="${SLUICE_CHROMIUM:-/usr/bin/chromium}"
if [[ ! -x "$chromium" ]]; then
    "$(dirname "$0")/apt.sh" chromium
    "$chromium" --version >&2
fi

# playwright-core fetches no browser of its own; this says so to any
# install step that would.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1
# shellcheck source=scripts/toolchains/npm-prefix.sh
. "$(dirname "$0")/npm-prefix.sh"
npm_prefix browser "playwright-core@$PLAYWRIGHT_CORE_VERSION" playwright-core

[[ "${1:-}" == "--print" ]] && echo "$dir/node_modules"
exit 0
