#!/usr/bin/env bash
# instructions.sh - instructions per record of the Wasm stage, counted by callgrind: a figure
# that does not move with this machine's noise (its times vary by 1.5x from hour to hour, and
# it has no hardware counters for `perf stat`), to judge a change to the host, the guest SDK or
# the boundary by. One command:
#
#   bench/instructions.sh [--records N]        # default 100000
#
# It builds sluice and the Rust example guests, writes N input records (10,000 keys, 100-byte
# values; for the windowed count, 100 records per ms of event time up to 150 ms out of order,
# as in bench/peers.sh), and counts the instructions (callgrind's Ir, whole process) of
# `sluice exec` running each guest over them: uppercase (stateless: the cost of reading the
# input file, crossing the boundary and printing), running-count (a keyed ValueState) and
# windowed-count (1 s tumbling windows, timers). Each guest's module is compiled once before
# it is counted, so Cranelift's work is not in the figure. Output: one line per guest with
# instructions per record; for running-count also what it adds to uppercase, which emits as
# many records (windowed-count emits one per key and window, about one per 15 inputs).
#
# Then the transform bench's stage (host/benches/transform.rs, running-count at batch 64, the
# figure issue 15's goal 2 is about), each way counted alone with callgrind's --toggle-collect over
# the same 50,000 records: the Wasm stage with its state written back after every batch
# (`wasm_written_back`: packing the batch, the guest, its state calls, reading its outputs) and
# holding it as in a job, taken back every 20,000 records (`wasm_held`), against the native code
# (`native_direct`, a get and a set per record on the same host state; `native_held`, the same
# cache as the guest's held natively), and the ratios. Needs valgrind (apt-get install valgrind);
# takes about 6 minutes for 100k records.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RECORDS=100000
while [[ $# -gt 0 ]]; do
    case $1 in
        --records) RECORDS=$2; shift 2 ;;
        *) echo "instructions.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
command -v valgrind >/dev/null || { echo "instructions.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
cd "$ROOT"
cargo build --release -q -p sluice
cargo build -q --profile guest --target wasm32-wasip2 --target-dir target/guests \
    -p uppercase -p running-count -p windowed-count
GUESTS=$ROOT/target/guests/wasm32-wasip2/guest
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SLUICE_CACHE_DIR=$WORK/cache
export SLUICE_CACHE_DIR
python3 - "$RECORDS" "$WORK/input.jsonl" <<'EOF'
import json, sys
records, path = int(sys.argv[1]), sys.argv[2]
t0 = 1_796_160_000_000
value = "v" * 100
with open(path, "w") as out:
    for i in range(records):
        at = t0 + i // 100 - (i * 37) % 151
        out.write(json.dumps({"key": f"user-{(i * 7919) % 10000:05}", "value": value, "timestamp": at}) + "\n")
EOF

# count NAME CONFIG...: callgrind's instruction total for the guest NAME over the input.
count() {
    local name=$1; shift
    local module=$GUESTS/$name.wasm
    # Compile (and cache) the module first, outside the count, under valgrind too: its
    # emulated CPU has other features than the real one, which changes the cache key.
    head -1 "$WORK/input.jsonl" | valgrind --tool=none --smc-check=all-non-file -q \
        target/release/sluice exec "$module" "$@" >/dev/null
    valgrind --tool=callgrind --cache-sim=no --smc-check=all-non-file \
        --callgrind-out-file="$WORK/$name.out" \
        target/release/sluice exec "$module" -i "$WORK/input.jsonl" "$@" >"$WORK/$name.stdout" 2>"$WORK/$name.err" \
        || { cat "$WORK/$name.err" >&2; exit 1; }
    awk '/^(summary|totals):/ { print $2; exit }' "$WORK/$name.out"
}

base=$(count uppercase)
counted=$(count running_count)
windowed=$(count windowed_count -c window=1s --max-out-of-orderness 200ms)
echo "instructions per record over $RECORDS records (callgrind Ir of sluice exec, $(git rev-parse --short HEAD)):"
awk -v n="$RECORDS" -v b="$base" -v c="$counted" -v w="$windowed" 'BEGIN {
    printf "  uppercase       %8.0f   (stateless, one output per record)\n", b / n
    printf "  running-count   %8.0f   (%+.0f against uppercase: the keyed state, less printing a count instead of 100 bytes)\n", c / n, (c - b) / n
    printf "  windowed-count  %8.0f   (windows and timers, one output per key and window)\n", w / n
}'

# The transform bench's binary, built; its guest is built (and compiled into the cache, under
# valgrind) by a first short run.
TRANSFORM=$(cargo bench -q -p sluice --bench transform --no-run --message-format=json \
    | python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "transform" and m.get("executable"):
        print(m["executable"])')
STAGE_RECORDS=50000
valgrind --tool=none --smc-check=all-non-file -q "$TRANSFORM" --records 64 --batch 64 --rounds 1 >/dev/null
# stage FUNCTION: callgrind's instructions inside FUNCTION (and what it calls) over the records.
stage() {
    valgrind --tool=callgrind --cache-sim=no --smc-check=all-non-file --toggle-collect="$1" \
        --callgrind-out-file="$WORK/stage.out" "$TRANSFORM" --records "$STAGE_RECORDS" --batch 64 --rounds 1 \
        >/dev/null 2>"$WORK/stage.err" || { cat "$WORK/stage.err" >&2; exit 1; }
    awk '/^(summary|totals):/ { print $2; exit }' "$WORK/stage.out"
}
wasm=$(stage 'transform::wasm_written_back')
held=$(stage 'transform::wasm_held')
native=$(stage 'transform::native_direct')
native_held=$(stage 'transform::native_held')
echo "the transform stage at batch 64, instructions per record over $STAGE_RECORDS records:"
awk -v n="$STAGE_RECORDS" -v w="$wasm" -v h="$held" -v c="$native" -v ch="$native_held" 'BEGIN {
    fastest = c < ch ? c : ch
    printf "  native (get+set)      %8.0f\n", c / n
    printf "  native (held cache)   %8.0f\n", ch / n
    printf "  wasm, written back    %8.0f   (%.2fx native get+set)\n", w / n, w / c
    printf "  wasm, held            %8.0f   (%.2fx the fewer of the two native)\n", h / n, h / fastest
}'
