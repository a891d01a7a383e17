#!/usr/bin/env bash
# run.sh - run the Kafka Streams benchmark peer (build it first with build.sh).
#   bench/kstreams/run.sh --brokers HOST:PORT --input TOPIC --output TOPIC --id NAME \
#       --checkpoint-ms N --parallelism P --state-dir DIR [--workload count|windowed-count] \
#       [--window-ms N --out-of-orderness-ms N]
# --workload count (the default) is the keyed running count; windowed-count counts per key and
# tumbling event-time window of --window-ms with grace --out-of-orderness-ms (both required with
# windowed-count, refused otherwise) and writes one {"start":S,"end":E,"count":N} per key and
# window once it closes (see KStreamsCount.windowedTopology).
# Prints "kafka streams running" once the instance is RUNNING; runs until SIGTERM.
# exec, so this process becomes the JVM (the harness reads its CPU and RSS from /proc).
# Environment: BENCH_JVM_HEAP (max heap, default 1g), JAVA_OPTS_KSTREAMS (extra JVM options).
set -euo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck disable=SC2086 # JAVA_OPTS_KSTREAMS is a list of options
exec java ${JAVA_OPTS_KSTREAMS:-} -Xmx"${BENCH_JVM_HEAP:-1g}" -jar "$DIR/target/sluice-bench-kstreams.jar" "$@"
