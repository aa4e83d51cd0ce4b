#!/usr/bin/env bash
# The one test command (see README): builds and runs the whole test suite.
# Installs what the tests need when it is missing, and starts/stops any servers itself.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "scripts/test.sh: cargo is required (https://rustup.rs)" >&2
    exit 1
fi

# Property tests: 400 cases per property by default; PROPTEST_CASES=100000 for a soak.
export PROPTEST_CASES="${PROPTEST_CASES:-400}"

cargo test --workspace --all-targets --all-features --locked
cargo test --workspace --doc --all-features --locked
