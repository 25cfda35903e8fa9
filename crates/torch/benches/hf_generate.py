"""The transformers side of benches/model.rs: the same config, random weights,
the same batch and budgets, timed the same way. Prints JSON.

usage: hf_generate.py PRESET BATCH PROMPT_LEN NEW_TOKENS NO_CACHE(0|1)
"""
import json
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from presets import PRESETS  # noqa: E402

preset, batch, prompt_len, new_tokens, no_cache = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
config = Qwen2Config(**PRESETS[preset], tie_word_embeddings=True, attn_implementation="eager")
torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = Qwen2ForCausalLM(config).float().eval().to(device)
v = config.vocab_size
ids = torch.tensor([[(i * 31 + b * 7) % (v - 1) + 1 for i in range(prompt_len)] for b in range(batch)], device=device)
mask = torch.ones_like(ids)


def timed(use_cache):
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, use_cache=use_cache, eos_token_id=None, pad_token_id=0)
    if device == "cuda":
        torch.cuda.synchronize()
    assert out.shape[1] == prompt_len + new_tokens
    return time.perf_counter() - start


timed(True)  # warm-up
cached = timed(True)
full = timed(False) if no_cache else None
responses = ids.flip(1)[:, :new_tokens]
seq = torch.cat([ids, responses], 1)
with torch.no_grad():
    model(input_ids=seq).logits.log_softmax(-1)
    start = time.perf_counter()
    logits = model(input_ids=seq).logits[:, prompt_len - 1:-1].float().log_softmax(-1)
    logits.gather(-1, responses.unsqueeze(-1))
    scoring = time.perf_counter() - start
tokens = batch * new_tokens
print(json.dumps({"impl": "transformers " + __import__("transformers").__version__, "device": device,
                  "threads": torch.get_num_threads(), "kv_cache_tokens_per_s": tokens / cached,
                  "no_cache_tokens_per_s": tokens / full if full else None, "scoring_s": scoring}))
