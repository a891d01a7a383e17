#!/usr/bin/env bash
# Installs those of the Debian packages named that are missing (apt-get, as
# root or through sudo), updating the package lists only if the first
# attempt cannot find them. Quiet when all are installed (a dpkg query each).
#
#   scripts/toolchains/apt.sh PACKAGE...
set -euo pipefail

missing=()
for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing+=("$p")
done
((${#missing[@]})) || exit 0
if ! command -v apt-get >/dev/null; then
    echo "toolchains/apt.sh: ${missing[*]} missing, and there is no apt-get to install them" >&2
    exit 1
fi
echo "toolchains/apt.sh: installing ${missing[*]} (apt-get)" >&2
sudo=()
[[ $(id -u) == 0 ]] || sudo=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
    "${sudo[@]}" apt-get update -q >/dev/null
    "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}
