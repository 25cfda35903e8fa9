#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the whole test suite.
# (.ci/run runs exactly this.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck source=/dev/null
. .setup/env.sh
cargo fmt --check
cargo build --all-targets --locked
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
cargo test --locked --lib --bins --tests 2>&1 | tee "$log"
# Compile-fail examples (the guard's handle and the update path's types).
cargo test --locked --doc 2>&1 | tee -a "$log"
# One closing line over every test binary.
awk '/^test result:/ { p += $4; f += $6; i += $8 } END { printf "all tests: %d passed, %d failed, %d skipped\n", p, f, i }' "$log"
