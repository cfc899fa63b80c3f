"""Thinking split out of the answer on every chat API, through the official clients: Qwen2.5-Coder-0.5B
served with examples/chat-templates/chatml-thinking.jinja. Chat completions (`openai`):
`reasoning_content` whole and streamed, `chat_template_kwargs`; Messages (`anthropic`): `thinking`
blocks whole and streamed, a thinking block sent back, the `thinking` switch; Responses (`openai`):
a `reasoning` item whole and streamed; the thinking's tokens in each usage.

Run by gateway/tests/serve/openai_client.rs with BASE_URL and KEY. The model does not think on its
own: a guided_regex, or a system prompt asking for it, makes it write a think block (the split is
the gateway's work, not the model's). Prints one line per check.
"""
import json
import os
import re
import sys
import urllib.error
import urllib.request

import anthropic
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
# The same thinking on every API: a system prompt the model follows greedily.
SYS = ("You always think first. Your reply starts with <think>, then one short sentence of thinking, "
       "then </think>, then the answer.")
Q = [{"role": "user", "content": "Say hello."}]
c = client.chat.completions.create(model=MODEL, messages=[{"role": "system", "content": SYS}] + Q, temperature=0,
                                   max_tokens=40)
thought, answer = c.choices[0].message.reasoning_content, c.choices[0].message.content
check("asked to, the model thinks", isinstance(thought, str) and len(thought) > 0, repr(c.choices[0].message))
details = c.usage.completion_tokens_details
check("chat usage counts the thinking's tokens", details is not None
      and 0 < details.reasoning_tokens <= c.usage.completion_tokens, str(c.usage))

a = anthropic.Anthropic(base_url=base, api_key=os.environ["KEY"], max_retries=0)
G = {"temperature": 0}  # this client's create() takes no temperature; the API does
m = a.messages.create(model=MODEL, system=SYS, messages=Q, max_tokens=40, extra_body=G)
check("messages: a thinking block first, the chat's thinking", m.content[0].type == "thinking"
      and m.content[0].thinking == thought and m.content[0].signature == "", str(m.content))
check("messages: then the answer's text", m.content[1].type == "text" and m.content[1].text == answer
      and len(m.content) == 2, str(m.content))
with a.messages.stream(model=MODEL, system=SYS, messages=Q, max_tokens=40, extra_body=G) as st:
    events = list(st)
    final = st.get_final_message()
deltas = [e.delta for e in events if e.type == "content_block_delta"]
check("messages streamed: thinking_delta events carry the thinking",
      "".join(d.thinking for d in deltas if d.type == "thinking_delta") == thought, str(deltas[:3]))
check("messages streamed: the final message equals the whole one",
      [b.model_dump() for b in final.content] == [b.model_dump() for b in m.content], str(final.content))
turn = [{"role": "assistant", "content": [m.content[0].model_dump(), {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": "Again."}]
back = a.messages.create(model=MODEL, system=SYS, messages=Q + turn, max_tokens=2, extra_body=G)
same = a.messages.create(model=MODEL, system=SYS, max_tokens=2, extra_body=G,
                         messages=Q + [{"role": "assistant", "content": "Hello."}, turn[1]])


def prompt_tokens(u):  # Anthropic counts cache reads apart from input_tokens
    return u.input_tokens + u.cache_read_input_tokens


check("messages: a thinking block sent back is taken; this template leaves it out of the prompt",
      prompt_tokens(back.usage) == prompt_tokens(same.usage), f"{back.usage} vs {same.usage}")
plain = a.messages.create(model=MODEL, messages=Q, max_tokens=2, extra_body=G)
on = a.messages.create(model=MODEL, messages=Q, max_tokens=2, extra_body=G, thinking={"type": "adaptive"})
off = a.messages.create(model=MODEL, messages=Q, max_tokens=2, extra_body=G, thinking={"type": "disabled"})
sizes = [prompt_tokens(x.usage) for x in (plain, on, off)]
check("messages: thinking adaptive / disabled switch the template's thinking",
      sizes[1] == sizes[0] and sizes[2] > sizes[0], str(sizes))
try:
    a.messages.create(model=MODEL, messages=Q, max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1024})
    check("messages: a thinking budget is refused", False)
except anthropic.BadRequestError as e:
    check("messages: a thinking budget is refused, naming the field", "thinking" in str(e.body), str(e.body))

r = client.responses.create(model=MODEL, instructions=SYS, input="Say hello.", max_output_tokens=40, temperature=0)
check("responses: a reasoning item first, the chat's thinking", r.output[0].type == "reasoning"
      and r.output[0].content[0].type == "reasoning_text" and r.output[0].content[0].text == thought, str(r.output))
check("responses: then the message", r.output[1].type == "message" and r.output_text == answer, str(r.output))
check("responses: usage counts the reasoning tokens",
      r.usage.output_tokens_details.reasoning_tokens == details.reasoning_tokens, str(r.usage))
with client.responses.stream(model=MODEL, instructions=SYS, input="Say hello.", max_output_tokens=40,
                             temperature=0) as st:
    evs = list(st)
    fin = st.get_final_response()
check("responses streamed: reasoning_text deltas carry the thinking",
      "".join(e.delta for e in evs if e.type == "response.reasoning_text.delta") == thought,
      str([e.type for e in evs][:8]))


def items(resp):  # (type, status, each content part's type and text); ids differ per response
    return [(o.type, o.status, [(c.type, c.text) for c in o.content]) for o in resp.output]


check("responses streamed: the final response's items equal the whole one's", items(fin) == items(r),
      str(fin.output))
# An earlier response's output sent back as input, its reasoning item included (as the Agents
# SDK replays it): taken as the assistant turn's thinking, which this template leaves out.
again = [{"role": "user", "content": "Again."}]
first = [{"role": "user", "content": "Say hello."}]
dumped = [o.model_dump(exclude_none=True) for o in r.output]
back = client.responses.create(model=MODEL, instructions=SYS, input=first + dumped + again,
                               max_output_tokens=2, temperature=0)
plain = client.responses.create(model=MODEL, instructions=SYS, max_output_tokens=2, temperature=0,
                                input=first + [{"role": "assistant", "content": answer}] + again)
check("responses: a reasoning item sent back is taken; this template leaves it out of the prompt",
      back.usage.input_tokens == plain.usage.input_tokens, f"{back.usage} vs {plain.usage}")
print("all checks passed")
