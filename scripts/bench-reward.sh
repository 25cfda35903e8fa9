#!/usr/bin/env bash
# What a reward computed by programs speaking JSON lines costs in a GRPO
# iteration, at the tiny scale: runs the tiny profiles of experiments/gsm8k.yaml
# (a verifier + a Python format program) and experiments/countdown.yaml (two
# Python programs) with the release binary in a fresh workspace, and prints
# each run's reward seconds (every term, programs' replies included, as
# train.grpo measures them in costs.reward_seconds) against its loop seconds.
#
#   bash scripts/bench-reward.sh [WORKSPACE]
set -euo pipefail
cd "$(dirname "$0")/.."
. .setup/env.sh
cargo build --release --locked --bins >/dev/null
bin=target/release/orchestrate
ws=${1:-$(mktemp -d)/ws}
for spec in gsm8k countdown; do
  "$bin" --workspace "$ws" run "experiments/$spec.yaml" --profile tiny >/dev/null
  metrics=$("$bin" --workspace "$ws" path "experiments/$spec.yaml" grpo:metrics --profile tiny)
  python3 - "$spec" "$metrics" <<'PY'
import json, sys
spec, path = sys.argv[1], sys.argv[2]
h = json.load(open(path))["history"]
reward = sum(i["costs"]["reward_seconds"] for i in h)
loop = sum(i["costs"]["loop_seconds"] for i in h)
rollouts = sum(len(i["rewards"]) for i in h)
terms = ", ".join(sorted(h[-1]["reward_terms"]))
print(f"{spec}: {len(h)} iterations, {rollouts} rollouts, terms [{terms}]: reward {reward:.4f} s of {loop:.3f} s "
      f"loop = {100 * reward / loop:.2f} % ({1000 * reward / rollouts:.3f} ms per rollout, every term)")
PY
done
