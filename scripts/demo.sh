#!/usr/bin/env bash
# The newcomer's first run, with no setup beyond Rust, Java 17 and Maven:
# starts a managed single-node Kafka broker (scripts/kafka.sh, jars from Maven
# Central), builds the host and the running-count transform from source,
# generates clicks and counts them per user exactly once, then prints what a
# read_committed consumer sees.
#
#   scripts/demo.sh                      # the managed broker on 127.0.0.1:9092
#   scripts/demo.sh --brokers HOST:PORT  # an existing Kafka cluster instead
#
# Extra arguments go to `sluice demo` (see `sluice demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "demo.sh: $*" >&2; }

brokers=""
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --brokers) brokers="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done

say "installing the wasm32-wasip2 target"
rustup target add wasm32-wasip2 >/dev/null
if [[ -z "$brokers" ]]; then
  say "starting the managed Kafka broker (first run downloads its jars)"
  scripts/kafka.sh start --port 9092
  brokers=127.0.0.1:9092
fi
say "building the host (the first build takes several minutes)"
cargo build --release -p sluice
say "building the running-count transform"
cargo build --profile guest --target wasm32-wasip2 --target-dir target/guests -p running-count
module=target/guests/wasm32-wasip2/guest/running_count.wasm

target/release/sluice demo --module "$module" --brokers "$brokers" "${args[@]}"
say "done; scripts/kafka.sh stop stops the broker"
