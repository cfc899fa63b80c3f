"""The request surface through the official `openai` Python client: n choices, logprobs
(chat and completions, streamed and not), seeds, the processors (penalties, logit_bias, and
vLLM's top_k / min_p / repetition_penalty / min_tokens through extra_body) and the refusals.

Run by gateway/tests/serve/api_fields.rs with BASE_URL and KEY. Prints one line per check;
exits non-zero on the first failure.
"""
import math
import os
import sys

import openai

client = openai.OpenAI(base_url=os.environ["BASE_URL"] + "/v1", api_key=os.environ["KEY"], max_retries=0)
M = "smollm2"
MSG = [{"role": "user", "content": "Write one sentence about the sea."}]


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


def chat(**kw):
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(model=M, messages=kw.pop("messages", MSG), **kw)


# n choices: one prompt counted once, every choice's output counted, choice 0 = the n=1 request.
one = chat(temperature=1.0, seed=5)
three = chat(temperature=1.0, seed=5, n=3, logprobs=True)
check("n=3 gives three choices in order", [c.index for c in three.choices] == [0, 1, 2])
check("choice 0 is the n=1 request (same seed)", three.choices[0].message.content == one.choices[0].message.content,
      f"{three.choices[0].message.content!r} vs {one.choices[0].message.content!r}")
check("the other choices draw their own", len({c.message.content for c in three.choices}) > 1,
      str([c.message.content for c in three.choices]))
check("usage: the prompt once, every choice's output",
      three.usage.prompt_tokens == one.usage.prompt_tokens
      and three.usage.completion_tokens == sum(len(c.logprobs.content) for c in three.choices), str(three.usage))
again = chat(temperature=1.0, seed=5)
check("a seed reproduces", again.choices[0].message.content == one.choices[0].message.content)

streamed = list(chat(temperature=1.0, seed=5, n=2, stream=True, stream_options={"include_usage": True}))
texts = ["", ""]
finishes = [None, None]
for c in streamed:
    for ch in c.choices:
        texts[ch.index] += ch.delta.content or ""
        finishes[ch.index] = ch.finish_reason or finishes[ch.index]
check("streamed n=2: each choice's text, choice 0 as above", texts[0] == one.choices[0].message.content, str(texts))
check("streamed n=2: a finish per choice", all(f in ("stop", "length") for f in finishes), str(finishes))
check("streamed n=2: usage last", streamed[-1].usage is not None and streamed[-1].usage.prompt_tokens == one.usage.prompt_tokens)

# logprobs: greedy, three alternatives; the chosen is the most likely; bytes rebuild the text.
r = chat(temperature=0, logprobs=True, top_logprobs=3, max_tokens=8)
lp = r.choices[0].logprobs.content
check("logprobs: one entry per token", len(lp) == r.usage.completion_tokens, f"{len(lp)} vs {r.usage.completion_tokens}")
check("logprobs: three alternatives each", all(len(e.top_logprobs) == 3 for e in lp))
check("logprobs: greedy picks the most likely", all(e.token == e.top_logprobs[0].token and
                                                    math.isclose(e.logprob, e.top_logprobs[0].logprob, abs_tol=1e-6) for e in lp))
check("logprobs: log-probabilities", all(e.logprob <= 0 and e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob for e in lp))
check("logprobs: bytes rebuild the text", bytes(b for e in lp for b in e.bytes).decode() == r.choices[0].message.content,
      repr(bytes(b for e in lp for b in e.bytes)))
s = list(chat(temperature=0, logprobs=True, top_logprobs=3, max_tokens=8, stream=True))
slp = [e for c in s for ch in c.choices if ch.logprobs for e in ch.logprobs.content]
check("logprobs streamed: the same entries", [(e.token, round(e.logprob, 4)) for e in slp] == [(e.token, round(e.logprob, 4)) for e in lp])

c = client.completions.create(model=M, prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2)
clp = c.choices[0].logprobs
check("completions logprobs: parallel lists", len(clp.tokens) == len(clp.token_logprobs) == len(clp.top_logprobs) == len(clp.text_offset) == 5)
check("completions logprobs: the text is the tokens", "".join(clp.tokens) == c.choices[0].text, repr(c.choices[0].text))
check("completions logprobs: offsets grow", clp.text_offset == sorted(clp.text_offset) and clp.text_offset[0] == 0)
check("completions logprobs: two alternatives with the chosen first",
      all(len(t) == 2 and max(t.values()) == l for t, l in zip(clp.top_logprobs, clp.token_logprobs)))

# Processors.
base = chat(temperature=0, max_tokens=16)
check("no logprobs unless asked", base.choices[0].logprobs is None)
pen = chat(temperature=0, max_tokens=16, frequency_penalty=2.0, presence_penalty=2.0)
check("penalties change the output", pen.choices[0].message.content != base.choices[0].message.content,
      pen.choices[0].message.content)
rep = chat(temperature=0, max_tokens=16, extra_body={"repetition_penalty": 1.8})
check("repetition_penalty changes the output", rep.choices[0].message.content != base.choices[0].message.content)
k1 = chat(temperature=1.5, seed=3, max_tokens=16, extra_body={"top_k": 1})
check("top_k = 1 is greedy", k1.choices[0].message.content == base.choices[0].message.content)
mp = chat(temperature=1.5, seed=3, max_tokens=16, extra_body={"min_p": 1.0})
check("min_p = 1 keeps only the most likely", mp.choices[0].message.content == base.choices[0].message.content)
BRIEF = [{"role": "system", "content": "You are a concise assistant. Answer in one short sentence."},
         {"role": "user", "content": "What is the capital of France?"}]
short = chat(messages=BRIEF, temperature=0, max_tokens=64)
want = short.usage.completion_tokens + 8
longer = chat(messages=BRIEF, temperature=0, max_tokens=64, extra_body={"min_tokens": want})
check("the model ends early on its own", short.choices[0].finish_reason == "stop", str(short.usage))
check("min_tokens holds the end back", longer.usage.completion_tokens >= want,
      f"{short.usage.completion_tokens} then {longer.usage.completion_tokens} (min_tokens {want})")
# logit_bias +100 makes a token certain (log-probabilities are after the bias), whatever it is.
forced = []
for tid in ("1000", "2000"):
    f = client.completions.create(model=M, prompt="The capital of France is", max_tokens=1, temperature=0,
                                  logit_bias={tid: 100}, logprobs=1)
    forced.append(f.choices[0].logprobs)
check("logit_bias +100 forces its token", all(abs(x.token_logprobs[0]) < 1e-3 for x in forced), str([x.token_logprobs for x in forced]))
check("logit_bias names the token by id", forced[0].tokens[0] != forced[1].tokens[0], str([x.tokens for x in forced]))

# Structured outputs, validated by the reference `jsonschema` validator.
import json
import re

import jsonschema

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                           "population": {"type": "integer", "minimum": 0},
                                           "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
          "required": ["city", "population", "tags"], "additionalProperties": False}
for t in (0, 1.0):
    r = chat(messages=[{"role": "user", "content": "Tell me about Paris as JSON."}], temperature=t, seed=2, max_tokens=120,
             response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}})
    doc = json.loads(r.choices[0].message.content)
    jsonschema.validate(doc, SCHEMA)
    check(f"response_format json_schema (temperature {t}) validates", r.choices[0].finish_reason == "stop", r.choices[0].message.content)
s = list(chat(messages=[{"role": "user", "content": "Tell me about Rome as JSON."}], temperature=0, max_tokens=120, stream=True,
              response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}))
doc = json.loads("".join(c.choices[0].delta.content or "" for c in s if c.choices))
jsonschema.validate(doc, SCHEMA)
check("response_format json_schema streamed validates", True, json.dumps(doc))
r = chat(messages=[{"role": "user", "content": "Reply in JSON."}], temperature=0, max_tokens=60, response_format={"type": "json_object"})
check("response_format json_object", r.choices[0].finish_reason == "length" or isinstance(json.loads(r.choices[0].message.content), dict),
      r.choices[0].message.content)
r = chat(messages=[{"role": "user", "content": "A US zip code?"}], temperature=1.0, max_tokens=20, extra_body={"guided_regex": "[0-9]{5}"})
check("guided_regex", re.fullmatch("[0-9]{5}", r.choices[0].message.content) is not None, r.choices[0].message.content)
r = chat(messages=[{"role": "user", "content": "Is water wet?"}], temperature=1.0, max_tokens=5,
         extra_body={"structured_outputs": {"choice": ["yes", "no", "maybe"]}})
check("structured_outputs choice", r.choices[0].message.content in ("yes", "no", "maybe"), r.choices[0].message.content)
c = client.completions.create(model=M, prompt="Three primary colours, as JSON:", max_tokens=60, temperature=0,
                              extra_body={"guided_json": {"type": "array", "items": {"enum": ["red", "green", "blue", "yellow"]}, "maxItems": 3}})
check("guided_json on completions", isinstance(json.loads(c.choices[0].text), list), c.choices[0].text)
for name, kw, param in [("a schema that does not compile", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"a": {"pattern": "("}}}}}}, None),
                        ("two structured-output fields", {"response_format": {"type": "json_object"}, "extra_body": {"guided_regex": "a"}}, "guided_regex")]:
    try:
        chat(max_tokens=4, **kw)
        check(f"{name} refused", False)
    except openai.BadRequestError as e:
        check(f"{name} refused", param is None or e.body.get("param") == param, str(e.body))

# Refusals, by name.
for name, kw in [("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
                 ("audio", {"audio": {"voice": "alloy", "format": "wav"}})]:
    try:
        chat(**kw)
        check(f"{name} refused", False)
    except openai.BadRequestError as e:
        check(f"{name} refused by name", e.body.get("param") == name and name in e.body.get("message", ""), str(e.body))
try:
    chat(extra_body={"frobnicate": 1})
    check("unknown field refused", False)
except openai.BadRequestError as e:
    check("unknown field refused by name", e.body.get("param") == "frobnicate", str(e.body))
try:
    chat(n=17)
    check("n over the limit refused", False)
except openai.BadRequestError as e:
    check("n over the limit refused", e.body.get("param") == "n")
try:
    chat(top_logprobs=3)
    check("top_logprobs without logprobs refused", False)
except openai.BadRequestError as e:
    check("top_logprobs without logprobs refused", e.body.get("param") == "top_logprobs")
print("all checks passed")
