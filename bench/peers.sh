#!/usr/bin/env bash
# peers.sh - sluice beside Flink and Kafka Streams, through the same exactly-once keyed running
# count (or, with --workload windowed-count, a 1 s tumbling event-time window count per key)
# on the same broker and machine, in one run (issues 6 and 12). One command reruns everything:
#
#   bench/peers.sh [--workload count|windowed-count] [--records N]
#                  [--systems native,sluice-rust,sluice-python,flink,kafka-streams]
#                  [--intervals 1000,100] [--latency-rate R] [--latency-seconds S]
#                  [--changelog on|off]
#
# It builds the Flink and Kafka Streams jobs (bench/flink, bench/kstreams; Maven, jars from
# Maven Central), then runs `cargo bench -p sluice --bench peers`, which builds sluice and the
# guests (the Python one with `sluice build`, installing componentize-py on the first run),
# starts the benchmark broker (scripts/kafka.sh, port 19292) unless SLUICE_BENCH_BROKERS names
# one, and writes docs/peers.md, docs/peers.svg and docs/peers.json (docs/peers-windows.* for
# the windowed count).
# Defaults: 2,000,000 records, all five systems, 1 s and 100 ms checkpoints; about 15 minutes
# on 2 cores. Needs what the tests need (README.md) plus Java 17 and Maven.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
echo "peers.sh: building the Java peers" >&2
"$ROOT/bench/flink/build.sh"
"$ROOT/bench/kstreams/build.sh"
cd "$ROOT"
exec cargo bench -p sluice --bench peers -- "$@"
