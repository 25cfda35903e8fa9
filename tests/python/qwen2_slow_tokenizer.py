"""Encodes texts with transformers' slow (pure Python) Qwen2Tokenizer, built
from the vocabulary and merges of a tokenizer.json written by orchestrate: an
implementation of Qwen2's pre-tokenization (NFC, its regex, byte-level BPE)
independent of the Rust `tokenizers` crate.

usage: qwen2_slow_tokenizer.py TOKENIZER_JSON TEXTS_JSON
prints: {"ids": [[...], ...]}
"""
import json
import os
import sys
import tempfile

from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

tokenizer_json, texts_path = sys.argv[1], sys.argv[2]
spec = json.load(open(tokenizer_json, encoding="utf-8"))
model = spec["model"]
merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
with tempfile.TemporaryDirectory() as d:
    vocab_file, merges_file = os.path.join(d, "vocab.json"), os.path.join(d, "merges.txt")
    json.dump(model["vocab"], open(vocab_file, "w", encoding="utf-8"), ensure_ascii=False)
    with open(merges_file, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(merges) + "\n")
    tok = Qwen2Tokenizer(vocab_file, merges_file, errors="replace")
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    tok.add_special_tokens({"additional_special_tokens": list(specials)})
    texts = json.load(open(texts_path, encoding="utf-8"))
    ids = [tok.encode(t, add_special_tokens=False) for t in texts]
    # The special tokens must have the ids orchestrate gave them.
    for name, i in specials.items():
        assert tok.convert_tokens_to_ids(name) == i, (name, i)
print(json.dumps({"ids": ids}))
