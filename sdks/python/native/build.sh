#!/usr/bin/env bash
# Builds the Python SDK's C core (native/_speedups.c, module sluice._speedups)
# into a copy of the `sluice` package.
#
#   native/build.sh wasm PACKAGE_DIR   # for componentize-py's CPython 3.14, wasm32-wasi
#   native/build.sh host PACKAGE_DIR   # for this machine's python3 (the SDK's tests)
#
# The module uses only the stable ABI of CPython 3.11 (Py_LIMITED_API), so
# the headers of any CPython from 3.11 on serve; this script takes the host
# python3's. The wasm build swaps in native/wasi/pyconfig.h (wasm32's sizes)
# for the host's, compiles with Debian's clang-19 and wasi-libc
# (scripts/toolchains/c.sh installs them) and links a wasm shared library
# that componentize-py links into the component with CPython itself:
# symbols of libpython stay undefined until then, and an unknown one fails
# the component's build, not a run.
set -euo pipefail

if [[ $# -ne 2 || ( "$1" != wasm && "$1" != host ) ]]; then
    echo "usage: $0 wasm|host PACKAGE_DIR" >&2
    exit 2
fi
here="$(cd "$(dirname "$0")" && pwd)"
target="$1"
out="$2"
[[ -d "$out" ]] || { echo "$0: $out is not a folder" >&2; exit 1; }

python="${PYTHON:-python3}"
include="$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
# Debian's own python3 keeps its headers in python3-dev: installed if missing.
if [[ ! -f "$include/Python.h" && "$(command -v "$python")" == /usr/bin/* ]] && command -v dpkg-query >/dev/null; then
    "$here/../../../scripts/toolchains/apt.sh" python3-dev
fi
[[ -f "$include/Python.h" ]] || {
    echo "$0: $include/Python.h not found: install the headers of $python (Debian: python3-dev)" >&2
    exit 1
}
warn=(-Wall -Wextra -Werror -Wno-unused-parameter -Wno-missing-field-initializers -Wno-cast-function-type)

if [[ "$target" == host ]]; then
    suffix="$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
    "${CC:-cc}" -O2 -fPIC -shared "${warn[@]}" ${SLUICE_PY_CFLAGS:-} -I"$include" \
        "$here/_speedups.c" -o "$out/_speedups$suffix"
    exit 0
fi

"$here/../../../scripts/toolchains/c.sh" --compiler
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# Python.h includes "pyconfig.h" from its own folder first: a copy it is.
cp -r "$include" "$tmp/include"
cp "$here/wasi/pyconfig.h" "$tmp/include/pyconfig.h"
resource="$(clang-19 -print-resource-dir)"
clang-19 --target=wasm32-wasi -nostdinc -isystem "$resource/include" -isystem /usr/include/wasm32-wasi \
    -I"$tmp/include" -O2 -fPIC "${warn[@]}" -c "$here/_speedups.c" -o "$tmp/_speedups.o"
# wasm-ld says shared libraries are "not yet stable"; that is all it says.
clang-19 --target=wasm32-wasi -fuse-ld=lld -shared -nostdlib -Wl,--no-entry -Wl,--allow-undefined \
    -o "$out/_speedups.cpython-314-wasm32-wasi.so" "$tmp/_speedups.o" 2> "$tmp/ld.log" || {
    cat "$tmp/ld.log" >&2
    exit 1
}
grep -v "creating shared libraries, with -shared, is not yet stable" "$tmp/ld.log" >&2 || true
