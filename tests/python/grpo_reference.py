"""An independent GRPO update (both inner steps) in PyTorch, for the parity test.

Written from the protocol (shared/seeds/003), not from our Rust: transformers'
Qwen2 forward, the one-shot full-vocabulary KL, the token -> response -> prompt
mean, torch's clip_grad_norm_ and torch.optim.AdamW (single-tensor).

usage: grpo_reference.py MODEL_DIR BATCH_JSON OUT.safetensors
"""
import json
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen2ForCausalLM

model_dir, batch_path, out = sys.argv[1], sys.argv[2], sys.argv[3]
batch = json.load(open(batch_path))
policy = Qwen2ForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
reference = Qwen2ForCausalLM.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).eval()
for p in reference.parameters():
    p.requires_grad_(False)
h = batch["hyper"]
params = [p for p in policy.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=batch["lrs"][0], weight_decay=batch["weight_decay"], foreach=False)


def response_logits(model, rows):
    out = []
    for prompt, response in rows:
        ids = torch.tensor([prompt + response])
        logits = model(input_ids=ids).logits[0]
        out.append(logits[len(prompt) - 1 : len(prompt) - 1 + len(response)])
    return out


rows = list(zip(batch["prompts"], batch["responses"]))
with torch.no_grad():
    ref_logits = response_logits(reference, rows)
for lr in batch["lrs"]:
    for group in opt.param_groups:
        group["lr"] = lr
    opt.zero_grad(set_to_none=True)
    cur_logits = response_logits(policy, rows)
    per_response = []
    for i, (logits, ref) in enumerate(zip(cur_logits, ref_logits)):
        logp_all = torch.log_softmax(logits, -1)
        ref_all = torch.log_softmax(ref, -1)
        targets = torch.tensor(batch["responses"][i])
        logp = logp_all.gather(1, targets[:, None])[:, 0]
        old = torch.tensor(batch["old_logprobs"][i])
        a = batch["advantages"][i]
        ratio = torch.exp(logp - old)
        surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - h["clip_eps"], 1 + h["clip_eps"]) * a)
        kl = (logp_all.exp() * (logp_all - ref_all)).sum(-1)
        per_response.append((-surrogate + h["beta"] * kl).mean())
    g = batch["group_size"]
    per_group = [torch.stack(per_response[k : k + g]).mean() for k in range(0, len(per_response), g)]
    loss = torch.stack(per_group).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, h["max_grad_norm"])
    opt.step()
save_file({name: p.detach().contiguous() for name, p in policy.named_parameters()}, out)
print(json.dumps({"loss_last": float(loss)}))
