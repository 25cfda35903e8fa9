"""Independent reference for the model parity tests: builds a random tiny
model of one family with Hugging Face transformers (eager attention, FP32),
saves it, and writes its logits and greedy generations.

- qwen2: GQA, q/k/v biases, tied embeddings.
- qwen3: q/k RMSNorm, no biases, head_dim (32) other than hidden/heads (16),
  untied head (as Qwen3-8B; Qwen3-4B ties it).
- llama: attention and MLP biases on, Llama 3's scaled rotary frequencies
  (rope_type llama3), untied head.

usage: hf_reference.py OUT_DIR [FAMILY[,FAMILY...] [VOCAB_SIZE]]
  FAMILY is qwen2 (the default), qwen3 or llama. With one, it is written to
  OUT_DIR; with several (e.g. qwen2,qwen3,llama), each to OUT_DIR/FAMILY, the
  same files as a run of its own would write (the seed is set again for each),
  for one start of Python, torch and transformers (about 4 s) instead of one each.
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config


def reference(out, family, vocab):
    torch.manual_seed(1234)
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        attn_implementation="eager",
    )
    if family == "qwen2":
        config = Qwen2Config(**common, rope_theta=10000.0, tie_word_embeddings=True)
    elif family == "qwen3":
        config = Qwen3Config(**common, head_dim=32, rope_theta=10000.0, tie_word_embeddings=False)
    elif family == "llama":
        # A short original context so that all three bands of the scaling occur.
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
        config = LlamaConfig(**common, attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                             rope_parameters=rope)
    else:
        raise SystemExit(f"unknown family {family}")
    model = AutoModelForCausalLM.from_config(config).float().eval()
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
        json.dump({"cases": cases, "greedy": greedy, "eos": eos, "family": config.model_type,
                   "parameters": sum(p.numel() for p in model.parameters()),
                   "transformers": __import__("transformers").__version__}, f)


out = sys.argv[1]
families = (sys.argv[2] if len(sys.argv) > 2 else "qwen2").split(",")
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 320
if len(families) == 1:
    reference(out, families[0], vocab)
else:
    for family in families:
        os.makedirs(f"{out}/{family}", exist_ok=True)
        reference(f"{out}/{family}", family, vocab)
