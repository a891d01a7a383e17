#!/usr/bin/env bash
# Runs every test of the project, installing what the tests need first.
#
#   scripts/test.sh                 # the whole suite
#   scripts/test.sh -- NAME         # extra arguments go to `cargo test`
#
# What it sets up (each step is a no-op when already done):
# - the wasm32-wasip2 Rust target: the tests build the guest components
#   from source with it;
# - the guest toolchains of Python, JavaScript, Go and C (scripts/toolchains/:
#   from PyPI, npm, crates.io, the Go module proxy and Debian's packages,
#   cached under ~/.cache/sluice/toolchains), for the conformance test that
#   builds running-count in every language;
# - schemathesis, the API fuzzer the `api_fuzz` test runs against a live
#   `sluice serve` (scripts/toolchains/schemathesis.sh: from PyPI, pinned,
#   cached under ~/.cache/sluice/toolchains);
# - PyYAML (scripts/toolchains/pyyaml.sh, the same way), for the check of
#   the Kubernetes example (deploy/kubernetes/check.py);
# - Debian's Chromium and playwright-core (scripts/toolchains/browser.sh:
#   apt-get and npm, pinned, cached under ~/.cache/sluice/toolchains), for
#   the dashboard's test in a headless browser (screenshots go to
#   target/dashboard-screenshots/);
# - openssl and curl (Debian's packages), with which the `tls` test makes
#   its certificates and checks the API over TLS with a client not ours;
# - a real Apache Kafka broker on 127.0.0.1:19092 (scripts/kafka.sh: jars
#   from Maven Central, cached under .kafka/), for the end-to-end tests. It is
#   left running afterwards; `scripts/kafka.sh stop --port 19092` stops it.
#
# Besides `cargo test`, it runs the Python, JavaScript, Go and C SDKs' own
# tests (against their simulated hosts; the examples built with each SDK
# run under `sluice exec` in cargo's runtime tests).
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "test.sh: $*" >&2; }

say "installing the wasm32-wasip2 target"
rustup target add wasm32-wasip2 >/dev/null

for lang in python javascript go c; do
    say "installing the $lang guest toolchain"
    "scripts/toolchains/$lang.sh" >/dev/null
done
say "installing schemathesis"
scripts/toolchains/schemathesis.sh >/dev/null
say "installing openssl and curl"
scripts/toolchains/apt.sh openssl curl
say "installing headless Chromium and playwright-core"
scripts/toolchains/browser.sh >/dev/null

say "running the Python, JavaScript, Go and C SDK tests"
sdks/python/test.sh
sdks/javascript/test/run.sh
sdks/go/test.sh
sdks/c/test.sh

say "checking the Kubernetes example"
"$(scripts/toolchains/pyyaml.sh --print)" -B deploy/kubernetes/check.py

port=${SLUICE_TEST_KAFKA_PORT:-19092}
say "starting the test Kafka broker on 127.0.0.1:$port"
scripts/kafka.sh start --port "$port"
export SLUICE_TEST_BROKERS="127.0.0.1:$port"

[[ "${1:-}" == "--" ]] && shift
say "running cargo test --release"
cargo test --release "$@"
