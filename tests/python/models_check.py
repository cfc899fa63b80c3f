"""Two models in one gateway, through the official `openai` Python client.

Run by gateway/tests/serve/models.rs with BASE_URL, KEY (a tenant allowed every model) and
SMOL_KEY (a tenant allowed `smollm2` only). The gateway serves SmolLM2 on its own engine and
Qwen2.5-Coder-0.5B (served as `qwen`) by a `cachet worker`. Prints one line per check.
"""
import os
import sys

import openai

base = os.environ["BASE_URL"] + "/v1"
client = openai.OpenAI(base_url=base, api_key=os.environ["KEY"], max_retries=0)
smol_only = openai.OpenAI(base_url=base, api_key=os.environ["SMOL_KEY"], max_retries=0)
MSG = [{"role": "user", "content": "What is the capital of France?"}]


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


models = {m.id: m for m in client.models.list().data}
check("both models listed", sorted(models) == ["qwen", "smollm2"], str(sorted(models)))
lens = {k: m.model_extra.get("max_model_len") for k, m in models.items()}
check("each with its own length", lens["qwen"] == 1024 and lens["smollm2"] == 8192, str(lens))
only = [m.id for m in smol_only.models.list().data]
check("a tenant sees the models it may use", only == ["smollm2"], str(only))

for name in ["smollm2", "qwen"]:
    r = client.chat.completions.create(model=name, messages=MSG, temperature=0, max_tokens=24)
    text = r.choices[0].message.content
    check(f"{name} answers", "Paris" in text and r.model == name, f"{r.model}: {text!r}")
    parts = client.chat.completions.create(model=name, messages=MSG, temperature=0, max_tokens=24,
                                           stream=True)
    streamed = "".join(c.choices[0].delta.content or "" for c in parts if c.choices)
    check(f"{name} streams the same answer", streamed == text, repr(streamed))

# Each model's own tokenizer: the same text is different ids.
import json
import urllib.request


def tokenize(model):
    req = urllib.request.Request(os.environ["BASE_URL"] + "/tokenize", method="POST",
                                 data=json.dumps({"model": model, "prompt": "Bonjour, le monde"}).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["KEY"],
                                          "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req))


a, b = tokenize("smollm2"), tokenize("qwen")
check("each model tokenizes with its own tokenizer", a["tokens"] != b["tokens"]
      and a["max_model_len"] == 8192 and b["max_model_len"] == 1024, f"{a} {b}")

try:
    client.chat.completions.create(model="llama", messages=MSG, max_tokens=4)
    check("an unknown model is refused", False)
except openai.NotFoundError as e:
    check("an unknown model is refused", "does not exist" in str(e), str(e))
try:
    smol_only.chat.completions.create(model="qwen", messages=MSG, max_tokens=4)
    check("a model the tenant may not use is refused", False)
except openai.PermissionDeniedError as e:
    check("a model the tenant may not use is refused", True, str(e))
print("all checks passed")
