#!/usr/bin/env bash
# Native unit tests of the C SDK: sluice.c compiled with gcc (with
# AddressSanitizer, LeakSanitizer and UBSan where they work) against a
# simulated host (tests/fake_host.c implements the imported state, log and
# time functions in memory), driven through the SDK's exports.
#
#   sdks/c/test.sh
#
# The bindings are generated from wit/ with wit-bindgen (scripts/toolchains/
# c.sh installs it); only their type declarations (packed_out.h) and free
# functions are used: the canonical-ABI glue is wasm-only.
set -euo pipefail

sdk=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$sdk/../.." && pwd)
eval "$("$root/scripts/toolchains/c.sh" --env)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wit-bindgen c --world packed-out --out-dir "$work/gen" "$root/wit" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
# The generated free functions and string helpers, without the imports'
# and exports' wasm glue.
{
    echo '#include "packed_out.h"'
    echo '#include <stdlib.h>'
    echo '#include <string.h>'
    echo 'void *cabi_realloc(void *ptr, size_t old_size, size_t align, size_t new_size);'
    sed -n '/^\/\/ Helper Functions/,/^\/\/ Component Adapters/p' "$work/gen/packed_out.c"
} >"$work/packed_free.c"

cc=${NATIVE_CC:-gcc}
flags=(-std=c11 -g -O1 -Wall -Wextra -Wno-missing-field-initializers -D_DEFAULT_SOURCE -DSLUICE_NATIVE_TESTS
    -I"$work/gen" -I"$sdk" -I"$sdk/tests")
sanitize=(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
echo 'int main(void){return 0;}' >"$work/probe.c"
if ! "$cc" "${sanitize[@]}" "$work/probe.c" -o "$work/probe" 2>/dev/null || ! "$work/probe"; then
    echo "test.sh: $cc has no working sanitizers here; testing without them" >&2
    sanitize=()
fi
common=("$sdk/sluice.c" "$sdk/tests/fake_host.c" "$work/packed_free.c")
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
for t in test_sluice test_default_hooks; do
    "$cc" "${flags[@]}" "${sanitize[@]}" "$sdk/tests/$t.c" "${common[@]}" -o "$work/$t"
    "$work/$t"
done
echo "test.sh: all C SDK tests passed${sanitize:+ (with ${sanitize[0]})}"
