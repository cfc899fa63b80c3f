"""Qwen2.5-Coder-0.5B-Instruct served by `cachet serve`, through the official `openai` client.

Run by gateway/tests/serve/openai_client.rs with BASE_URL and KEY. The greedy answer is the one
transformers gives (tests/fixtures/qwen2.5-coder-0.5b_reference.json); prints one line per check.
"""
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["KEY"], max_retries=0)
MSG = [{"role": "user", "content": "Write a Python function that returns the square of x."}]


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


models = [m.id for m in client.models.list().data]
check("models.list", models == ["qwen2.5-coder-0.5b"], str(models))
r = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=MSG, temperature=0, max_tokens=32)
text = r.choices[0].message.content
check("the greedy answer is transformers'", text.startswith(
    "Here's a simple Python function that returns the square of a given number:\n\n```python\ndef square(x):\n    return x * x\n```"),
    repr(text))
check("usage", r.usage.prompt_tokens == 40 and r.usage.completion_tokens == 32, str(r.usage))
chunks = list(client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=MSG, temperature=0,
                                             max_tokens=32, stream=True))
streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("streamed text equals the non-streamed one", streamed == text, repr(streamed))
r2 = client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=MSG, temperature=0, max_tokens=4)
cached = r2.usage.prompt_tokens_details.cached_tokens
check("a repeated prompt hits the prefix cache", cached >= 32, f"{cached} of {r2.usage.prompt_tokens}")
print("all checks passed")
