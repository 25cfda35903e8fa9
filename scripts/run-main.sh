#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job: the whole GRPO
# protocol (experiments/grpo-main.yaml) on the embedded tiny model, on CPU
# (8½ to 16 minutes on 2 cores), ending with the results table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck source=/dev/null
. .setup/env.sh
cargo build --release --locked
./target/release/orchestrate run experiments/grpo-main.yaml --profile tiny "$@"
