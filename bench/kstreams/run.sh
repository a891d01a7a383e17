#!/usr/bin/env bash
# run.sh - run the Kafka Streams benchmark peer (build it first with build.sh).
#   bench/kstreams/run.sh --brokers HOST:PORT --input TOPIC --output TOPIC --id NAME \
#       --checkpoint-ms N --parallelism P --state-dir DIR
# exec, so this process becomes the JVM (the harness reads its CPU and RSS from /proc).
# Environment: BENCH_JVM_HEAP (max heap, default 1g), JAVA_OPTS_KSTREAMS (extra JVM options).
set -euo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2086 # JAVA_OPTS_KSTREAMS is a list of options
exec java ${JAVA_OPTS_KSTREAMS:-} -Xmx"${BENCH_JVM_HEAP:-1g}" -jar "$DIR/target/sluice-bench-kstreams.jar" "$@"
