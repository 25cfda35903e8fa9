#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job.
# Until the trainer lands this is the shipped example pipeline; it becomes the
# tiny GRPO profile of experiments/grpo-main.yaml when that exists.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck source=/dev/null
. .setup/env.sh
cargo build --release --locked
spec=experiments/examples/shell-pipeline/pipeline.yaml
./target/release/orchestrate run "$spec" "$@"
./target/release/orchestrate status
