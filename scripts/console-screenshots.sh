#!/usr/bin/env bash
# Writes docs/console/*.png: the screenshots of the console's browser test
# (crates/tollgate-server/tests/console.rs), taken in chromium as it runs.
set -euo pipefail
cd "$(dirname "$0")/.."
TOLLGATE_CONSOLE_SCREENSHOTS="$PWD/docs/console" \
    cargo test -p tollgate-server --features external-servers --test console -- --nocapture
ls -l docs/console
