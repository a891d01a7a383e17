#!/usr/bin/env bash
# run.sh - run the Flink peer of sluice's benchmark (build it first with build.sh):
#   bench/flink/run.sh --brokers HOST:PORT --input TOPIC --output TOPIC --id NAME \
#                      --checkpoint-ms N --parallelism P [--workload count|windowed-count] \
#                      [--window-ms N --out-of-orderness-ms N]
# --workload count (the default) is the keyed running count; windowed-count counts per key and
# tumbling event-time window of --window-ms, watermark bounded out-of-orderness
# --out-of-orderness-ms (both required with windowed-count, refused otherwise) and writes one
# {"start":S,"end":E,"count":N} per key and window once it closes (see WindowedCount.java).
# The JVM replaces this shell (exec), so this process id is the JVM's. Prints
# "flink job running" once the job is submitted; runs until SIGTERM.
# Environment: BENCH_JVM_HEAP (max heap, default 1g), JAVA_OPTS_FLINK (extra JVM options),
# JAVA (the java to use, default: java on PATH).
set -euo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
JAR="$DIR/target/sluice-bench-flink.jar"
[[ -f "$JAR" ]] || { echo "run.sh: $JAR missing; run $DIR/build.sh first" >&2; exit 1; }

# Java 17 module access that Flink 2.x documents as required: the java.base part of
# env.java.opts.all in the config.yaml of Flink's distribution (the jdk.compiler exports there
# serve only the Table/SQL code generator). Kryo (the fallback serializer for generic types)
# and parts of Flink's runtime reflect into these JDK internals. This job's types (String, Long,
# Tuple2) use Flink's own serializers and it also ran correctly without the flags; they are
# kept so that the peer runs as a Flink cluster JVM would.
FLINK_JAVA17_OPTS=(
  --add-exports=java.base/sun.net.util=ALL-UNNAMED
  --add-opens=java.base/java.lang=ALL-UNNAMED
  --add-opens=java.base/java.lang.reflect=ALL-UNNAMED
  --add-opens=java.base/java.io=ALL-UNNAMED
  --add-opens=java.base/java.net=ALL-UNNAMED
  --add-opens=java.base/java.nio=ALL-UNNAMED
  --add-opens=java.base/sun.nio.ch=ALL-UNNAMED
  --add-opens=java.base/java.text=ALL-UNNAMED
  --add-opens=java.base/java.time=ALL-UNNAMED
  --add-opens=java.base/java.util=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.atomic=ALL-UNNAMED
  --add-opens=java.base/java.util.concurrent.locks=ALL-UNNAMED
)

# shellcheck disable=SC2086 # JAVA_OPTS_FLINK is a list of options, split on purpose
exec "${JAVA:-java}" ${JAVA_OPTS_FLINK:-} "${FLINK_JAVA17_OPTS[@]}" -Xmx"${BENCH_JVM_HEAP:-1g}" \
  -jar "$JAR" "$@"
