"""Independent reference for the Qwen2 parity tests: builds a random tiny Qwen2
with Hugging Face transformers (GQA, q/k/v biases, tied embeddings, eager
attention, FP32), saves it, and writes its logits and greedy generations.

usage: hf_reference.py OUT_DIR
"""
import json
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

out = sys.argv[1]
torch.manual_seed(1234)
config = Qwen2Config(
    vocab_size=320,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    attn_implementation="eager",
)
model = Qwen2ForCausalLM(config).float().eval()
# Random everything, biases and norms included, so each of them matters.
with torch.no_grad():
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.1 * torch.randn_like(p))
        else:
            p.copy_(0.1 * torch.randn_like(p))
model.save_pretrained(out, safe_serialization=True)
# The same weights as a sharded checkpoint (model.safetensors.index.json + shards).
model.save_pretrained(f"{out}/sharded", safe_serialization=True, max_shard_size="100KB")

g = torch.Generator().manual_seed(7)
full = torch.randint(3, 320, (2, 12), generator=g)
short = torch.randint(3, 320, (7,), generator=g)
padded = torch.zeros(2, 12, dtype=torch.long)
padded[0] = full[0]
padded[1, 5:] = short
mask = torch.ones(2, 12, dtype=torch.long)
mask[1, :5] = 0


def logits(ids, attention_mask):
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attention_mask, position_ids=position_ids).logits


cases = []
for ids, m in [(full, torch.ones_like(full)), (padded, mask)]:
    cases.append({"ids": ids.tolist(), "mask": m.tolist(), "logits": logits(ids, m).tolist()})

eos = 2
greedy = []
for ids, m in [(full[:1], torch.ones(1, 12, dtype=torch.long)), (padded, mask)]:
    with torch.no_grad():
        gen = model.generate(
            input_ids=ids,
            attention_mask=m,
            max_new_tokens=16,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    greedy.append({"ids": ids.tolist(), "mask": m.tolist(), "generated": gen[:, ids.shape[1]:].tolist()})

with open(f"{out}/reference.json", "w") as f:
    json.dump({"cases": cases, "greedy": greedy, "eos": eos, "transformers": __import__("transformers").__version__}, f)
