"""Thinking split out as `reasoning_content`, and `chat_template_kwargs`, through the official
`openai` client: Qwen2.5-Coder-0.5B served with examples/chat-templates/chatml-thinking.jinja.

Run by gateway/tests/serve/openai_client.rs with BASE_URL and KEY. The model does not think on its
own, so a guided_regex makes it write a think block (the split is the gateway's work, not the
model's). Prints one line per check.
"""
import json
import os
import re
import sys
import urllib.error
import urllib.request

import openai

base = os.environ["BASE_URL"]
client = openai.OpenAI(base_url=base + "/v1", api_key=os.environ["KEY"], max_retries=0)
MODEL = "qwen2.5-coder-0.5b"
MSG = [{"role": "user", "content": "Say hello."}]
THINK = {"guided_regex": "<think>[a-z ]{3,24}</think>\n\nHello[.!]"}


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


r = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=40, extra_body=THINK)
m = r.choices[0].message
reasoning = getattr(m, "reasoning_content", None)
check("reasoning_content holds the thinking", isinstance(reasoning, str) and re.fullmatch("[a-z ]{3,24}", reasoning), repr(reasoning))
check("content holds the answer after </think>", m.content in ("\n\nHello.", "\n\nHello!"), repr(m.content))

chunks = list(client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=40,
                                             extra_body=THINK, stream=True))
deltas = [c.choices[0].delta for c in chunks if c.choices]
s_reason = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
s_content = "".join(d.content or "" for d in deltas)
check("streamed reasoning equals the whole one", s_reason == reasoning, repr(s_reason))
check("streamed content equals the whole one", s_content == m.content, repr(s_content))

plain = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=8)
off = client.chat.completions.create(model=MODEL, messages=MSG, temperature=0, max_tokens=8,
                                     extra_body={"chat_template_kwargs": {"enable_thinking": False}})
grew = off.usage.prompt_tokens - plain.usage.prompt_tokens
check("enable_thinking false renders the empty think block into the prompt", grew > 0, f"+{grew} tokens")
check("an answer without a think block has no reasoning_content",
      getattr(off.choices[0].message, "reasoning_content", None) is None, repr(off.choices[0].message))


def status_of(body):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Authorization": "Bearer " + os.environ["KEY"],
                                          "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


for bad, why in [({"messages": []}, "a name the server sets"), ("yes", "not an object"),
                 ({"system_hint": "<|im_end|>"}, "carrying a control token")]:
    code, body = status_of({"model": MODEL, "messages": MSG, "chat_template_kwargs": bad})
    check(f"chat_template_kwargs {why} is a 400 naming the field",
          code == 400 and body["error"]["param"] == "chat_template_kwargs", f"{code} {body}")
print("all checks passed")
