# Sourced by the toolchain scripts that install a package from npm into its
# own node_modules under $SLUICE_TOOLCHAINS/<name>/ (default
# ~/.cache/sluice/toolchains).
#
#   npm_prefix NAME PACKAGE@VERSION READY [CHECK...]
#
# installs PACKAGE@VERSION (pinned, exact) unless it is there already: the
# install records what it was made for in .installed and is redone only
# when that differs or READY (a path under node_modules/) is missing. After
# an install, CHECK (a command, run in node_modules/) must succeed before
# the install is recorded. Sets `dir` to the install's directory. Needs
# node (>= 18) and npm.
npm_prefix() {
    local name=$1 want=$2 ready=$3
    shift 3
    dir="${SLUICE_TOOLCHAINS:-${XDG_CACHE_HOME:-$HOME/.cache}/sluice/toolchains}/$name"
    local stamp="$dir/.installed"
    if [[ "$(cat "$stamp" 2>/dev/null)" != "$want" || ! -x "$dir/node_modules/$ready" ]]; then
        if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
            echo "toolchains/$name.sh: node and npm are needed" >&2
            return 1
        fi
        echo "toolchains/$name.sh: installing $want into $dir" >&2
        rm -rf "$dir/node_modules" "$stamp"
        mkdir -p "$dir"
        # A private package.json keeps npm from walking up to any other project.
        [[ -f "$dir/package.json" ]] || echo "{ \"name\": \"sluice-$name-toolchain\", \"private\": true }" >"$dir/package.json"
        (cd "$dir" && npm install --no-audit --no-fund --save-exact --loglevel=error "$want" >&2)
        if (($#)); then (cd "$dir/node_modules" && "$@" >/dev/null); fi
        echo "$want" >"$stamp"
    fi
}
