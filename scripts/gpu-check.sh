#!/usr/bin/env bash
# The GPU check (docs/model.md, "The GPU check"): on a machine with an NVIDIA GPU,
# its own PyTorch 2.11 and no Rust toolchain, run release binaries built elsewhere
# against that machine's torch/lib, and print:
#   1. whether the worker sees CUDA;
#   2. logits of a Qwen2.5-0.5B-shape model (random weights) on CUDA vs the CPU,
#      and greedy generation on both;
#   3. one GRPO iteration at protocol shapes (4 prompts x G=4, 64 tokens, 2 updates,
#      exact KL) with its cost split and peak GPU memory;
#   4. the same iteration in PyTorch eager (transformers' Qwen2) on the same GPU;
#   5. SFT and GRPO interrupted and resumed on the device (GRPO at iteration 2 of
#      4), each bit-exact against its continuous run (experiments/gpu-check.yaml).
#
# usage: scripts/gpu-check.sh            # the binaries in target/release
#        ORCHESTRATE_BIN_DIR=DIR scripts/gpu-check.sh
# ORCHESTRATE_DEVICE=cpu runs the CPU fallback: the same steps on the tiny shapes
# and fewer iterations (tests/it/gpu_check.rs runs it, so the script cannot rot).
# ORCHESTRATE_PYTHON picks the python that has torch (default: python3).
# Exit code 0 only if every check holds.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

BIN=${ORCHESTRATE_BIN_DIR:-target/release}
PY=${ORCHESTRATE_PYTHON:-python3}
DEVICE=${ORCHESTRATE_DEVICE:-cuda}
export ORCHESTRATE_DEVICE=$DEVICE
for b in orchestrate orchestrate-torch; do
    [[ -x "$BIN/$b" ]] || { echo "gpu-check: no $BIN/$b (build with cargo build --release, or set ORCHESTRATE_BIN_DIR)" >&2; exit 2; }
done
TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))') || {
    echo "gpu-check: $PY cannot import torch (set ORCHESTRATE_PYTHON)" >&2; exit 2; }
export LD_LIBRARY_PATH="$TORCH_LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

if [[ $DEVICE == cpu ]]; then
    PRESET=tiny; ITERATIONS=2; PROFILE=(--profile cpu); THREADS=${ORCHESTRATE_THREADS:-1}
else
    PRESET=qwen2.5-0.5b; ITERATIONS=3; PROFILE=(); THREADS=${ORCHESTRATE_THREADS:-$(nproc)}
fi
export ORCHESTRATE_THREADS=$THREADS
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=1; }
field() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); [d:=d[int(k)] if isinstance(d,list) else d[k] for k in sys.argv[2].split(".")]; print(d)' "$1" "$2"; }

echo "== 1. the worker's device (ORCHESTRATE_DEVICE=$DEVICE, torch/lib $TORCH_LIB)"
if ! "$BIN/orchestrate-torch" env --json > "$WORK/env.json" 2> "$WORK/env.err"; then
    cat "$WORK/env.err"
    echo "FAIL: CUDA was asked for, and the worker cannot use it (above); nothing else can run"
    exit 1
fi
"$BIN/orchestrate-torch" env
seen=$(field "$WORK/env.json" device)
if [[ $DEVICE != cpu && $seen != cuda* ]]; then
    echo "FAIL: CUDA was asked for, the worker sees '$seen'"
    exit 1
fi
if command -v nvidia-smi > /dev/null; then nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; fi

echo "== 2. logits and greedy generation, $PRESET shapes: $DEVICE vs cpu"
"$BIN/orchestrate-torch" device-parity --preset "$PRESET" > "$WORK/parity.json"
"$PY" - "$WORK/parity.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
print(f"device {d['device']}, {d['parameters']:,} parameters")
print(f"logits max |difference| {d['logits_max_abs_difference']:.3e} (max |logit| {d['logits_max_abs']:.3e})")
print(f"greedy: {d['greedy_equal_rows']} of {d['greedy_rows']} rows equal over {d['greedy_tokens_per_row']} tokens")
for x in d["divergences"]:
    kind = "a numerical tie" if x["numerical_tie"] else "NOT a tie"
    print(f"  row {x['row']} parts at step {x['step']}: CPU top-2 margin {x['cpu_top2_margin']:.3e} ({kind})")
EOF
ok=$("$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(int(d["logits_max_abs_difference"] <= 1e-2 and all(x["numerical_tie"] for x in d["divergences"])))' "$WORK/parity.json")
[[ $ok == 1 ]] || fail "logits differ by more than 1e-2, or greedy generation parts where the CPU's choice is not a tie"

echo "== 3. one GRPO iteration (4 prompts x G=4, 64 tokens, 2 updates, exact KL), ours on $DEVICE"
peak_file="$WORK/gpu-mem.csv"
poll=""
if [[ $DEVICE != cpu ]] && command -v nvidia-smi > /dev/null; then
    # tch does not reach libtorch's allocator statistics: the GPU's used memory, polled.
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$peak_file" & poll=$!
fi
"$BIN/orchestrate-torch" bench-grpo --preset "$PRESET" --iterations "$ITERATIONS" > "$WORK/ours.json"
if [[ -n $poll ]]; then kill "$poll" 2> /dev/null || true; wait "$poll" 2> /dev/null || true; fi

echo "== 4. the same iteration in PyTorch eager on $DEVICE"
if "$PY" -c 'import transformers' 2> /dev/null; then
    "$PY" crates/torch/benches/grpo_iteration.py "$PRESET" 96 "$ITERATIONS" "$THREADS" "$DEVICE" | tail -n 1 > "$WORK/theirs.json"
else
    echo "transformers is not installed for $PY: the PyTorch eager iteration is skipped (pip install transformers)"
    echo '{"seconds_per_iteration": {}}' > "$WORK/theirs.json"
fi
"$PY" - "$WORK/ours.json" "$WORK/theirs.json" "$peak_file" <<'EOF'
import json, os, sys
ours, theirs = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
print(f"{'cost':<30} {'ours (s)':>10} {'pytorch (s)':>12} {'ratio':>7}")
for k in ["generation", "behavior_verification", "optimization_with_reference", "state_hashing", "loop"]:
    a, b = ours["seconds_per_iteration"].get(k), theirs["seconds_per_iteration"].get(k)
    ratio = f"{a / b:7.2f}" if a is not None and b else "      -"
    fa = f"{a:10.4f}" if a is not None else "         -"
    fb = f"{b:12.4f}" if b is not None else "           -"
    print(f"{k:<30} {fa} {fb} {ratio}")
peak = None
if os.path.exists(sys.argv[3]):
    values = [int(v) for v in open(sys.argv[3]).read().split() if v.strip().isdigit()]
    peak = max(values) if values else None
print("peak GPU memory, ours (nvidia-smi, whole GPU):", f"{peak} MiB" if peak is not None else "not measured (no GPU or no nvidia-smi)")
dev = theirs.get("peak_device_bytes")
print("peak GPU memory, PyTorch (max_memory_allocated):", f"{dev >> 20} MiB" if dev is not None else "not measured")
print(f"peak RSS ours {ours['peak_rss_bytes'] >> 20} MiB" + (f", PyTorch {theirs['peak_rss_bytes'] >> 20} MiB" if "peak_rss_bytes" in theirs else ""))
EOF

echo "== 5. interrupt/resume on $DEVICE (experiments/gpu-check.yaml ${PROFILE[*]:-}): SFT after epoch 1 of 2, GRPO at iteration 2 of 4"
start=$(date +%s)
if ! "$BIN/orchestrate" --workspace "$WORK/ws" run experiments/gpu-check.yaml "${PROFILE[@]}" --quiet > "$WORK/run.txt" 2>&1; then
    tail -n 20 "$WORK/run.txt"
    fail "the interrupt/resume run failed"
else
    for check in warmstart-check grpo-check; do
        report=$("$BIN/orchestrate" --workspace "$WORK/ws" path experiments/gpu-check.yaml "${PROFILE[@]}" "$check:report")
        same=$(field "$report" identical)
        echo "$check: identical = $same ($(field "$report" tensors) tensors compared)"
        [[ $same == True ]] || fail "$check: the resumed run differs from the continuous one: $(field "$report" first_difference)"
    done
    echo "($(($(date +%s) - start)) s)"
fi

if [[ $failed == 0 ]]; then echo "gpu-check: all checks passed on $DEVICE"; else echo "gpu-check: FAILED on $DEVICE"; fi
exit $failed
