"""The same GRPO iteration directly in PyTorch eager (transformers' Qwen2), for
benches/grpo.rs: 4 prompts x 4 samples of 64 tokens at temperature 1 with the
KV cache, behavior log-probs from the sampling scores, a full re-scoring check,
then two updates (clipped surrogate + 0.02 x exact KL to a frozen reference,
token -> response -> prompt mean, clip 1.0, AdamW). Logits only at the response
positions (`logits_to_keep`, as TRL's GRPOTrainer asks for them). Prints JSON.

usage: grpo_iteration.py PRESET PROMPT_LEN ITERATIONS [THREADS] [DEVICE] [MICRO_GROUPS]
(THREADS may be empty: torch's default; DEVICE: cpu, the default, or cuda)
"""
import hashlib
import json
import resource
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from presets import PRESETS  # noqa: E402

preset, prompt_len, iterations = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
if len(sys.argv) > 4 and sys.argv[4]:
    torch.set_num_threads(int(sys.argv[4]))
device = torch.device(sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] else "cpu")
# Groups per forward/backward pass, gradients accumulated (0: the whole batch).
micro = int(sys.argv[6]) if len(sys.argv) > 6 else 0


def sync():
    """Timings on a GPU count the work, not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize()
config = Qwen2Config(**PRESETS[preset], tie_word_embeddings=True, attn_implementation="eager")
torch.manual_seed(0)
policy = Qwen2ForCausalLM(config).float().eval().to(device)
reference = Qwen2ForCausalLM(config).float().eval().to(device)
reference.load_state_dict(policy.state_dict())
for p in reference.parameters():
    p.requires_grad_(False)
params = [p for p in policy.parameters()]
opt = torch.optim.AdamW(params, lr=1e-6, weight_decay=0.01)
v = config.vocab_size
G, P, T = 4, 4, 64
totals = {}
for it in range(iterations):
    loop = time.perf_counter()
    prompts = torch.tensor([[(i * 31 + (r // G) * 7 + it) % (v - 1) + 1 for i in range(prompt_len)] for r in range(P * G)],
                           device=device)
    sync()
    t = time.perf_counter()
    with torch.no_grad():
        out = policy.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0,
                              top_k=0, top_p=1.0, max_new_tokens=T, min_new_tokens=T, eos_token_id=None, pad_token_id=0,
                              output_scores=True, return_dict_in_generate=True)
    responses = out.sequences[:, prompt_len:]
    behavior = torch.stack([torch.log_softmax(s.float(), -1).gather(1, responses[:, i:i + 1])[:, 0] for i, s in enumerate(out.scores)], 1)
    sync()
    generation = time.perf_counter() - t
    seq = out.sequences
    t = time.perf_counter()
    with torch.no_grad():
        logits = policy(input_ids=seq, logits_to_keep=T + 1).logits[:, :-1].float()
        rescored = torch.log_softmax(logits, -1).gather(2, responses[..., None])[..., 0]
    gap = (rescored - behavior).abs().max().item()
    sync()
    verification = time.perf_counter() - t
    rewards = torch.tensor([float((r * 7 + it) % 3 == 0) for r in range(P * G)], device=device).view(P, G)
    std = rewards.std(1, unbiased=False, keepdim=True)
    adv = torch.where(std > 0, (rewards - rewards.mean(1, keepdim=True)) / (std + 1e-8), torch.zeros_like(rewards)).view(-1)
    t = time.perf_counter()
    h = hashlib.blake2b()
    for p in params:
        h.update(p.detach().cpu().numpy().tobytes())
    hashing = time.perf_counter() - t
    t = time.perf_counter()
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        per_pass = P if micro <= 0 else min(micro, P)
        for g0 in range(0, P, per_pass):
            rows = slice(g0 * G, min(g0 + per_pass, P) * G)
            n = (rows.stop - rows.start) // G
            cur = policy(input_ids=seq[rows], logits_to_keep=T + 1).logits[:, :-1].float()
            with torch.no_grad():
                ref = reference(input_ids=seq[rows], logits_to_keep=T + 1).logits[:, :-1].float()
            logp_all = torch.log_softmax(cur, -1)
            logp = logp_all.gather(2, responses[rows][..., None])[..., 0]
            ratio = torch.exp(logp - behavior[rows])
            a = adv[rows][:, None]
            surrogate = torch.minimum(ratio * a, ratio.clamp(0.8, 1.2) * a)
            kl = (logp_all.exp() * (logp_all - torch.log_softmax(ref, -1))).sum(-1)
            loss = (-surrogate + 0.02 * kl).mean(1).view(n, G).mean(1).mean() * (n / P)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
    sync()
    optimization = time.perf_counter() - t
    whole = time.perf_counter() - loop
    if it > 0:
        for k, val in [("generation", generation), ("behavior_verification", verification), ("optimization_with_reference", optimization), ("state_hashing", hashing), ("loop", whole)]:
            totals[k] = totals.get(k, 0.0) + val
n = max(iterations - 1, 1)
print(json.dumps({"impl": "pytorch eager", "threads": torch.get_num_threads(), "seconds_per_iteration": {k: val / n for k, val in totals.items()},
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "device": str(device),
                  "peak_device_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None}))
