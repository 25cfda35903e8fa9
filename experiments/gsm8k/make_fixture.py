"""A GSM8K-shaped fixture the project generates itself (no download): rows
{"question", "answer"} where the answer is worked steps with GSM8K's
calculator annotations (`<<3+5=8>>8`) and a final line `#### N`, as in
openai/gsm8k. One- and two-step word problems over a few templates, small
enough for the embedded tiny model to learn some of them.

usage: python3 gsm8k/make_fixture.py OUT_DIR SEED TRAIN VALIDATION TEST

Writes OUT_DIR/{train,validation,test}.jsonl. Only the standard library; the
same arguments give the same bytes; no question appears twice.
"""
import json
import os
import random
import sys

out, seed, counts = sys.argv[1], int(sys.argv[2]), [int(n) for n in sys.argv[3:6]]
rng = random.Random(seed)
NAMES = ["Tom", "Ana", "Li", "Sam", "Maya", "Omar", "Eva", "Raj", "Zoe", "Ben"]
THINGS = ["apples", "pencils", "stickers", "marbles", "books", "shells"]


def one_step():
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    if rng.random() < 0.5:
        q = f"{name} has {a} {thing} and buys {b} more. How many {thing} does {name} have now?"
        return q, f"{name} has {a}+{b}=<<{a}+{b}={a + b}>>{a + b} {thing}.\n#### {a + b}"
    a, b = max(a, b), min(a, b)
    q = f"{name} has {a} {thing} and gives away {b}. How many {thing} are left?"
    return q, f"{name} has {a}-{b}=<<{a}-{b}={a - b}>>{a - b} {thing} left.\n#### {a - b}"


def two_step():
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    boxes, per, extra = rng.randint(2, 9), rng.randint(2, 9), rng.randint(1, 20)
    total = boxes * per
    q = (f"{name} buys {boxes} boxes of {thing} with {per} {thing} in each box, "
         f"then finds {extra} more. How many {thing} does {name} have?")
    a = (f"The boxes hold {boxes}*{per}=<<{boxes}*{per}={total}>>{total} {thing}.\n"
         f"With the ones found, {name} has {total}+{extra}=<<{total}+{extra}={total + extra}>>{total + extra} {thing}.\n"
         f"#### {total + extra}")
    return q, a


seen = set()
os.makedirs(out, exist_ok=True)
for split, n in zip(["train", "validation", "test"], counts):
    rows = []
    while len(rows) < n:
        q, a = one_step() if rng.random() < 0.6 else two_step()
        if q.lower() in seen:
            continue
        seen.add(q.lower())
        rows.append({"question": q, "answer": a})
    with open(os.path.join(out, f"{split}.jsonl"), "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
