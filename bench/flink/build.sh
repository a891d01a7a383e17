#!/usr/bin/env bash
# build.sh - build the Flink peer of sluice's benchmark into one runnable fat jar:
#   bench/flink/target/sluice-bench-flink.jar
# Needs: java 17+, mvn (dependencies from Maven Central). Works from any directory.
set -euo pipefail
DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
exec mvn -B -q -f "$DIR/pom.xml" package -DskipTests "$@"
