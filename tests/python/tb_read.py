"""Reads every run folder under a TensorBoard log dir with TensorBoard's own
reader and prints {run: {tag: [[step, value], ...]}} as JSON: the independent
check of `orchestrate export tensorboard` (tests/it/export.rs)."""
import json
import os
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

root = sys.argv[1]
out = {}
for run in sorted(os.listdir(root)):
    acc = EventAccumulator(os.path.join(root, run), size_guidance={"scalars": 0})
    acc.Reload()
    out[run] = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
json.dump(out, sys.stdout)
