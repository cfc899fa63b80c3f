"""Cachet's Messages API (`POST /v1/messages`) through the official `anthropic` Python client,
and OpenAI's Responses API (`POST /v1/responses`) through the official `openai` client.

Run by gateway/tests/serve/api_fields.rs with BASE_URL and KEY. Prints one line per check;
exits non-zero on the first failure.
"""
import os
import sys

import anthropic
import openai

base = os.environ["BASE_URL"]
key = os.environ["KEY"]
a = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
o = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
M = "smollm2"
Q = [{"role": "user", "content": "What is the capital of France?"}]


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


# The same prompt through OpenAI's chat completions, for comparison.
ref = o.chat.completions.create(model=M, messages=[{"role": "system", "content": "Be brief."}] + Q,
                                temperature=0, max_tokens=24)
ref_text = ref.choices[0].message.content

# Current SDKs have no sampling arguments: they go through extra_body (greedy here).
G = {"temperature": 0}
m = a.messages.create(model=M, max_tokens=24, system="Be brief.", messages=Q, extra_body=G)
check("messages.create: a message", m.type == "message" and m.role == "assistant" and m.content[0].type == "text")
check("the same text as chat completions", m.content[0].text == ref_text, f"{m.content[0].text!r} vs {ref_text!r}")
check("stop_reason", m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason)
check("usage", m.usage.output_tokens == ref.usage.completion_tokens
      and m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == ref.usage.prompt_tokens, str(m.usage))
check("cache_read_input_tokens on a repeated prefix", (m.usage.cache_read_input_tokens or 0) >= 16, str(m.usage))

s = a.messages.create(model=M, max_tokens=24, system=[{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
                      extra_body=G, cache_control={"type": "ephemeral"},
                      messages=[{"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
                      stop_sequences=[" Paris"])
check("stop_sequences: stop_reason and stop_sequence", s.stop_reason == "stop_sequence" and s.stop_sequence == " Paris"
      and "Paris" not in s.content[0].text, f"{s.stop_reason} {s.stop_sequence!r} {s.content[0].text!r}")

with a.messages.stream(model=M, max_tokens=24, system="Be brief.", messages=Q, extra_body=G) as st:
    pieces = [t for t in st.text_stream]
    final = st.get_final_message()
check("streamed: the same text", "".join(pieces) == ref_text and final.content[0].text == ref_text, repr("".join(pieces)))
check("streamed: the final message's stop_reason and usage", final.stop_reason == m.stop_reason
      and final.usage.output_tokens == m.usage.output_tokens, str(final.usage))
raw = [e.type for e in a.messages.create(model=M, max_tokens=4, messages=Q, stream=True)]
check("streamed: Anthropic's event order", raw[:2] == ["message_start", "content_block_start"]
      and raw[-3:] == ["content_block_stop", "message_delta", "message_stop"], str(raw))

mt = a.messages.create(model=M, max_tokens=3, messages=Q, extra_body=G)
check("max_tokens ends as max_tokens", mt.stop_reason == "max_tokens" and mt.usage.output_tokens == 3)

for name, kw, param in [
    ("tools", {"tools": [{"name": "f", "input_schema": {"type": "object"}}]}, "tools"),
    ("thinking", {"thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking"),
    ("an image block", {"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "http://x"}}]}]}, "messages[0].content[0]"),
    ("temperature over 1", {"extra_body": {"temperature": 1.5}}, "temperature"),
    ("effort", {"output_config": {"effort": "low"}}, "output_config"),
]:
    args = {"model": M, "max_tokens": 4, "messages": Q}
    args.update(kw)
    try:
        a.messages.create(**args)
        check(f"{name} refused", False)
    except anthropic.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        check(f"{name} refused in Anthropic's error shape", body.get("type") == "error"
              and body["error"]["type"] == "invalid_request_error" and param in body["error"]["message"], str(body))
import json

import jsonschema

SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "maxLength": 40}, "confidence": {"type": "number"}},
          "required": ["answer", "confidence"], "additionalProperties": False}
j = a.messages.create(model=M, max_tokens=80, messages=Q, extra_body=G,
                      output_config={"format": {"type": "json_schema", "schema": SCHEMA}})
jsonschema.validate(json.loads(j.content[0].text), SCHEMA)
check("messages: output_config.format json_schema validates", j.stop_reason == "end_turn", j.content[0].text)
try:
    anthropic.Anthropic(base_url=base, api_key="sk-wrong", max_retries=0).messages.create(model=M, max_tokens=4, messages=Q)
    check("401 for a bad key", False)
except anthropic.AuthenticationError as e:
    check("401 for a bad key, as authentication_error", e.body["error"]["type"] == "authentication_error", str(e.body))

# The Responses API.
r = o.responses.create(model=M, instructions="Be brief.", input="What is the capital of France?", temperature=0,
                       max_output_tokens=24)
check("responses.create: output_text", r.output_text == ref_text, f"{r.output_text!r} vs {ref_text!r}")
check("responses: status and usage", r.status in ("completed", "incomplete") and r.usage.output_tokens == ref.usage.completion_tokens
      and r.usage.input_tokens == ref.usage.prompt_tokens and r.usage.input_tokens_details.cached_tokens >= 16, str(r.usage))
r2 = o.responses.create(model=M, input=[{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": [{"type": "input_text", "text": "What is the capital of France?"}]}],
                        temperature=0, max_output_tokens=24)
check("responses: message items", r2.output_text == ref_text, repr(r2.output_text))
events = list(o.responses.create(model=M, instructions="Be brief.", input="What is the capital of France?",
                                  temperature=0, max_output_tokens=24, stream=True))
kinds = [e.type for e in events]
check("responses streamed: the event order", kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
      and "response.output_text.delta" in kinds and "response.output_text.done" in kinds, str(kinds))
text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
check("responses streamed: the same text", text == ref_text and events[-1].response.output_text == ref_text, repr(text))
check("responses streamed: sequence numbers", [e.sequence_number for e in events] == list(range(len(events))))
rj = o.responses.create(model=M, input="What is the capital of France? Answer as JSON.", temperature=0, max_output_tokens=80,
                        text={"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}})
jsonschema.validate(json.loads(rj.output_text), SCHEMA)
check("responses: text.format json_schema validates", rj.status == "completed", rj.output_text)
check("responses: text.format echoed as sent", rj.text.format.type == "json_schema" and rj.text.format.name == "answer"
      and rj.text.format.schema_ == SCHEMA and rj.text.format.strict is True, str(rj.text))
check("responses: plain text echoed without a format", r.text.format.type == "text", str(r.text))
ri = o.responses.create(model=M, input="Count to fifty.", max_output_tokens=3, temperature=0)
check("responses: max_output_tokens ends incomplete", ri.status == "incomplete" and ri.incomplete_details.reason == "max_output_tokens")
for name, kw in [("store", {"store": True}), ("previous_response_id", {"previous_response_id": "resp_1"}),
                 ("tools", {"tools": [{"type": "function", "name": "f", "parameters": {}}]})]:
    try:
        o.responses.create(model=M, input="Hi", max_output_tokens=2, **kw)
        check(f"responses: {name} refused", False)
    except openai.BadRequestError as e:
        check(f"responses: {name} refused by name", e.body.get("param") == name, str(e.body))
# count_tokens: the prompt the Messages request took, in the client's own call.
c = a.messages.count_tokens(model=M, system="Be brief.", messages=Q)
check("messages.count_tokens: the request's input tokens",
      c.input_tokens == ref.usage.prompt_tokens, f"{c.input_tokens} vs {ref.usage.prompt_tokens}")
try:
    a.messages.count_tokens(model=M, messages=Q, extra_body={"max_tokens": 5})
    check("count_tokens: max_tokens refused", False)
except anthropic.BadRequestError as e:
    check("count_tokens: a field that shapes no prompt is refused in Anthropic's shape",
          e.body["type"] == "error" and "max_tokens" in e.body["error"]["message"], str(e.body))
# Errors on every Messages path come in Anthropic's shape; a bad key names x-api-key.
bad = anthropic.Anthropic(base_url=base, api_key="sk-wrong", max_retries=0)
for name, call in [("messages", lambda: bad.messages.create(model=M, max_tokens=4, messages=Q)),
                   ("count_tokens", lambda: bad.messages.count_tokens(model=M, messages=Q))]:
    try:
        call()
        check(f"{name}: a bad key refused", False)
    except anthropic.AuthenticationError as e:
        check(f"{name}: a bad key is an authentication_error naming x-api-key",
              e.body["error"]["type"] == "authentication_error" and "x-api-key" in e.body["error"]["message"], str(e.body))
try:
    a.messages.batches.list()
    check("messages.batches: refused", False)
except anthropic.NotFoundError as e:
    check("messages.batches: a not_found_error in Anthropic's shape", e.body["error"]["type"] == "not_found_error", str(e.body))
print("all checks passed")
