"""Countdown's reward, as a program speaking orchestrate's JSON lines
(docs/rewards.md): one request per line on stdin, one reply per line on
stdout.

  correct (default): 1.0 when the <answer> equation uses each of the
      problem's numbers exactly once and equals its target, else 0.0.
  --format: 1.0 when the response is one <answer>...</answer> holding an
      equation that parses (right or wrong), else 0.0 (TinyZero's format reward).

The equation is parsed with `ast` (numbers, + - * /, parentheses) and
evaluated with exact fractions; nothing the model wrote is executed.
"""
import ast
import json
import re
import sys
from fractions import Fraction

FORMAT = "--format" in sys.argv[1:]
ANSWER = re.compile(r"^\s*<answer>(.*?)</answer>\s*$", re.S)
OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
       ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


def value(node, used):
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in OPS:
        left, right = value(node.left, used), value(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return OPS[type(node.op)](left, right)
    raise ValueError("not an equation of numbers and + - * /")


def score(req):
    m = ANSWER.match(req["response"])
    if not m:
        return 0.0, False, "no single <answer>...</answer>"
    try:
        used = []
        got = value(ast.parse(m.group(1).strip(), mode="eval").body, used)
    except (SyntaxError, ValueError) as e:
        return 0.0, False, f"unparsable equation: {e}"
    if FORMAT:
        return 1.0, True, None
    problem = req["label"]["problem"]
    if sorted(used) != sorted(problem["nums"]):
        return 0.0, True, "does not use each number exactly once"
    if got != problem["target"]:
        return 0.0, True, "wrong value"
    return 1.0, True, None


for line in sys.stdin:
    reward, valid, reason = score(json.loads(line))
    print(json.dumps({"reward": reward, "valid": valid, "reason": reason}, allow_nan=False), flush=True)
