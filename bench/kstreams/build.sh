#!/usr/bin/env bash
# build.sh - build the Kafka Streams benchmark peer into one runnable fat jar:
#   bench/kstreams/target/sluice-bench-kstreams.jar
# Works from any directory. Needs java 17+ and mvn (dependencies come from Maven Central).
set -euo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mvn -B -q -f "$DIR/pom.xml" package -DskipTests
test -f "$DIR/target/sluice-bench-kstreams.jar"
