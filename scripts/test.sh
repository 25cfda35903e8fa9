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
cargo test --locked
