#!/usr/bin/env bash
# Runs every test of the project, installing what the tests need first.
#
#   scripts/test.sh                 # the whole suite
#   scripts/test.sh -- NAME         # extra arguments go to `cargo test`
#
# What it sets up (each step is a no-op when already done):
# - the wasm32-wasip2 Rust target: the tests build the guest components
#   from source with it;
# - a real Apache Kafka broker on 127.0.0.1:19092 (scripts/kafka.sh: jars
#   from Maven Central, cached under .kafka/), for the end-to-end tests. It is
#   left running afterwards; `scripts/kafka.sh stop --port 19092` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "test.sh: $*" >&2; }

say "installing the wasm32-wasip2 target"
rustup target add wasm32-wasip2 >/dev/null

port=${SLUICE_TEST_KAFKA_PORT:-19092}
say "starting the test Kafka broker on 127.0.0.1:$port"
scripts/kafka.sh start --port "$port"
export SLUICE_TEST_BROKERS="127.0.0.1:$port"

[[ "${1:-}" == "--" ]] && shift
say "running cargo test --release"
cargo test --release "$@"
