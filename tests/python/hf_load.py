"""Loads a model folder written by orchestrate with transformers and prints
its logits for the ids in ids.json, plus the tokenizer's encoding of a text.

usage: hf_load.py MODEL_DIR IDS_JSON TEXT
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

model_dir, ids_path, text = sys.argv[1], sys.argv[2], sys.argv[3]
model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
tokenizer = PreTrainedTokenizerFast(tokenizer_file=f"{model_dir}/tokenizer.json")
ids = torch.tensor(json.load(open(ids_path)))
with torch.no_grad():
    logits = model(input_ids=ids).logits
print(json.dumps({"logits": logits.tolist(), "encoded": tokenizer.encode(text)}))
