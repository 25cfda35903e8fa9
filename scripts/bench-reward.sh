#!/usr/bin/env bash
# What a reward computed by programs speaking JSON lines costs in a GRPO
# iteration, at the tiny scale: runs the tiny profiles of experiments/gsm8k.yaml
# (a verifier + a Python format program) and experiments/countdown.yaml (two
# Python programs) with the release binary in a fresh workspace, and prints
# each run's reward seconds (every term, programs' replies included, as
# train.grpo measures them, in the node record's costs) against its loop seconds.
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
  # What each iteration cost is in the node's record: `status --json` of that run.
  status=$(mktemp)
  "$bin" --workspace "$ws" status --json >"$status"
  python3 - "$spec" "$metrics" "$status" <<'PY'
import json, sys
spec, path, status = sys.argv[1], sys.argv[2], sys.argv[3]
h = json.load(open(path))["history"]
node = next(n for n in json.load(open(status))["nodes"] if n["node_id"] == "grpo")
costs = node["costs"]["iterations"]
assert sorted(int(i) for i in costs) == [i["iteration"] for i in h], "every iteration's costs"
reward = sum(c["reward_seconds"] for c in costs.values())
loop = sum(c["loop_seconds"] for c in costs.values())
rollouts = sum(len(i["rewards"]) for i in h)
terms = ", ".join(sorted(h[-1]["reward_terms"]))
print(f"{spec}: {len(h)} iterations, {rollouts} rollouts, terms [{terms}]: reward {reward:.4f} s of {loop:.3f} s "
      f"loop = {100 * reward / loop:.2f} % ({1000 * reward / rollouts:.3f} ms per rollout, every term)")
PY
done
