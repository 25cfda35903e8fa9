"""The independent reference for chat templates: transformers' apply_chat_template.

usage: chat_template_ids.py TOKENIZER_JSON TEMPLATE_FILE BOS EOS CASES_JSON
CASES_JSON: a list of [system, user]; an empty system means no system message.
Prints a JSON list of {"text": ..., "ids": [...]}: the rendered prompt (with the
generation prompt) and its ids, as transformers gives them.
"""
import json
import sys

from transformers import PreTrainedTokenizerFast

tokenizer_file, template_file, bos, eos, cases_file = sys.argv[1:6]
tok = PreTrainedTokenizerFast(tokenizer_file=tokenizer_file, bos_token=bos or None, eos_token=eos or None)
tok.chat_template = open(template_file, encoding="utf-8").read()
out = []
for system, user in json.load(open(cases_file, encoding="utf-8")):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": user}]
    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    assert ids == tok(text, add_special_tokens=False)["input_ids"], "apply_chat_template's ids are not its text's"
    out.append({"text": text, "ids": ids})
print(json.dumps(out))
