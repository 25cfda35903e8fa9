"""Countdown problems (seed 000's demo task, as TinyZero poses it): reach
`target` from `nums` with + - * /, each number used once. Each row has a
solution built with it, so every problem is solvable.

usage: python3 countdown/generate.py OUT_DIR SEED TRAIN VALIDATION TEST

Writes OUT_DIR/{train,validation,test}.jsonl, one problem per line:
{"id", "prompt", "nums", "target", "solution"}. Only the standard library;
the same arguments give the same bytes.
"""
import json
import os
import random
import sys

out, seed, counts = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3:6]]
rng = random.Random(seed)
OPS = ["+", "-", "*"]


def problem():
    """Three numbers and an expression over them whose value is the target
    (kept to a positive integer below 1000; division only when exact)."""
    while True:
        nums = [rng.randint(1, 20) for _ in range(3)]
        a, b, c = rng.sample(nums, 3)
        op1, op2 = rng.choice(OPS + ["/"]), rng.choice(OPS)
        if op1 == "/" and (b == 0 or a % b):
            continue
        inner = f"({a} {op1} {b})"
        expr = f"{inner} {op2} {c}"
        value = eval(expr.replace("/", "//"))  # our own expression, built above
        if 0 < value < 1000:
            return nums, value, expr


seen = set()
os.makedirs(out, exist_ok=True)
for split, n in zip(["train", "validation", "test"], counts):
    rows = []
    while len(rows) < n:
        nums, target, expr = problem()
        key = (tuple(sorted(nums)), target)
        if key in seen:
            continue
        seen.add(key)
        prompt = (
            f"Using the numbers {nums}, create an equation that equals {target}. "
            "Use + - * / and each number exactly once. "
            "Give the equation in <answer> </answer> tags, e.g. <answer>(1 + 2) * 3</answer>."
        )
        rows.append({"id": f"{split}-{len(rows)}", "prompt": prompt, "nums": nums, "target": target,
                     "solution": f"<answer>{expr}</answer>"})
    with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True) + "\n")
