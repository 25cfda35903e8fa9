#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job.
# Until the trainer lands: build the embedded default (StockArithmetic-v1, a BPE
# tokenizer, a tiny Qwen2) and ask the untrained model one test question. This
# becomes the tiny GRPO profile of experiments/grpo-main.yaml when that exists.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck source=/dev/null
. .setup/env.sh
cargo build --release --locked
bin=./target/release/orchestrate
spec=experiments/tiny-model.yaml
"$bin" run "$spec" "$@"
model="$("$bin" path "$spec" model:model)"
question="$(head -n 1 "$("$bin" path "$spec" data:pages.test)" | python3 -c 'import json, sys; print(json.loads(sys.stdin.read())["statement"])')"
echo
echo "Q: $question"
echo -n "A (untrained tiny model, greedy): "
"$bin" generate --model "$model" --prompt "$question" --greedy --max-new-tokens 24
"$bin" status --limit 3
