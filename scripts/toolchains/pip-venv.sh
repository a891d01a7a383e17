# Sourced by the toolchain scripts that install a tool from PyPI into its own
# venv under $SLUICE_TOOLCHAINS/<name>/ (default ~/.cache/sluice/toolchains).
#
#   pip_venv NAME REQUIREMENT EXECUTABLE
#
# installs REQUIREMENT (pinned, e.g. schemathesis==4.32.5) unless the venv
# already has it: the venv records the requirement it was built for in
# .installed and is rebuilt only when that differs or EXECUTABLE is missing.
# Sets `venv` to the venv's directory. Needs python3 (>= 3.9) with venv.
# Concurrent runs (tests that build guests in parallel on a fresh machine)
# wait on a lock: each one removed and rebuilt the other's half-made venv.
pip_venv() {
    local name=$1 want=$2 executable=$3
    local dir="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}/$name"
    local stamp="$dir/.installed"
    venv="$dir/venv"
    mkdir -p "$dir"
    exec 8>"$dir/.lock"
    flock 8
    if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" || ! -x "$venv/bin/$executable" ]]; then
        local python=${PYTHON:-python3}
        command -v "$python" >/dev/null || { echo "toolchains/$name.sh: $python not found; install Python 3 first" >&2; return 1; }
        echo "toolchains/$name.sh: installing $want into $venv" >&2
        rm -rf "$venv" "$stamp"
        mkdir -p "$dir"
        "$python" -m venv "$venv"
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$want"
        "$venv/bin/$executable" --version >/dev/null
        echo "$want" >"$stamp"
    fi
    exec 8>&-
}
