"""A Qwen2.5-Coder Instruct model served by `cachet serve`, through the official `openai` client.

Run by gateway/tests/serve/openai_client.rs with BASE_URL, KEY, MODEL (the served name),
REFERENCE (the model's transformers fixture, tests/fixtures/<model>_reference.json) and
MAX_TOKENS (at most the fixture's 32). The greedy answer must be transformers' (the fixture's
`greedy_chat`: its first MAX_TOKENS tokens); prints one line per check.
"""
import json
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["KEY"], max_retries=0)
MODEL = os.environ["MODEL"]
ref = json.load(open(os.environ["REFERENCE"]))["greedy_chat"]
n = int(os.environ.get("MAX_TOKENS", "32"))
assert 0 < n <= len(ref["output_ids"])
MSG = ref["messages"]


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


models = [m.id for m in client.models.list().data]
check("models.list", models == [MODEL], str(models))
r = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=n)
text = r.choices[0].message.content
if n == len(ref["output_ids"]):
    check("the greedy answer is transformers'", text == ref["text"], repr(text))
else:
    check(f"the greedy answer is transformers' first {n} tokens", len(text) > 0 and ref["text"].startswith(text),
          repr(text))
check("usage", r.usage.prompt_tokens == len(ref["prompt_ids"]) and r.usage.completion_tokens == n, str(r.usage))
chunks = list(client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=n, stream=True))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("streamed text equals the non-streamed one", streamed == text, repr(streamed))
r2 = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=2)
cached = r2.usage.prompt_tokens_details.cached_tokens
check("a repeated prompt hits the prefix cache", cached >= 32, f"{cached} of {r2.usage.prompt_tokens}")
print("all checks passed")
