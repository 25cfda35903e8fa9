"""A format reward for GSM8K-style answers, as a program speaking
orchestrate's JSON lines (docs/rewards.md): 1.0 when the response ends with
a line `#### N` (N an integer, commas allowed), the form GSM8K's answers
take, else 0.0. Correctness is the built-in `gsm8k_last_number` verifier's.
"""
import json
import re
import sys

FINAL = re.compile(r"(?:^|\n)#### -?[\d,]+\s*$")

for line in sys.stdin:
    req = json.loads(line)
    ok = bool(FINAL.search(req["response"]))
    print(json.dumps({"reward": 1.0 if ok else 0.0, "valid": True,
                      "reason": None if ok else "no final '#### N' line"}), flush=True)
