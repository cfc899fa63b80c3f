"""Tool calling through the official clients: `openai` (chat completions and the Responses API)
and `anthropic` (Messages), against a Cachet serving SmolLM2 with the ChatML tools template
(examples/chat-templates/chatml-tools.jinja, Hermes-format calls).

`required` / named choices are enforced by the grammar, so the small model's calls are certain:
each is checked to be a call of an offered function whose arguments validate against its schema
(`jsonschema`, the reference validator); streamed calls are reassembled the way the clients do
and must equal the whole response's (greedy decoding); a call's result goes back as the next
turn in each API's own shape.

Run by gateway/tests/serve/api_fields.rs with BASE_URL and KEY. Prints one line per check;
exits non-zero on the first failure.
"""
import json
import os
import sys

import anthropic
import jsonschema
import openai

base = os.environ["BASE_URL"]
key = os.environ["KEY"]
o = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0)
a = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
M = "smollm2"


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


WEATHER = {
    "name": "get_weather",
    "description": "Current weather of a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
ADD = {
    "name": "add",
    "description": "Adds two integers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
}
SCHEMAS = {f["name"]: f["parameters"] for f in (WEATHER, ADD)}
TOOLS = [{"type": "function", "function": f} for f in (WEATHER, ADD)]
Q = [{"role": "user", "content": "What is the weather in Paris?"}]
G = dict(temperature=0, max_tokens=96)


def valid_call(name, arguments):
    """A call of an offered function with arguments valid under its schema."""
    if name not in SCHEMAS:
        return False, f"unknown function {name!r}"
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    try:
        jsonschema.validate(args, SCHEMAS[name])
    except jsonschema.ValidationError as e:
        return False, f"{name}({args}): {e.message}"
    return True, f"{name}({json.dumps(args)})"


# --- chat completions -----------------------------------------------------------------------
r = o.chat.completions.create(model=M, messages=Q, tools=TOOLS, tool_choice="required", **G)
c = r.choices[0]
check("required: finish_reason tool_calls", c.finish_reason == "tool_calls", c.finish_reason)
calls = c.message.tool_calls or []
check("required: one call or more", len(calls) >= 1, str(c.message))
for call in calls:
    ok, what = valid_call(call.function.name, call.function.arguments)
    check("required: a call of an offered function, arguments valid under its schema", ok, what)
    check("a call has an id and type function", call.id.startswith("call_") and call.type == "function", call.id)
check("required: no text around the calls", c.message.content in (None, ""), repr(c.message.content))
check("ids are unique", len({x.id for x in calls}) == len(calls))

# Streamed: the deltas, reassembled as the client's helper does, are the same calls.
with o.chat.completions.stream(model=M, messages=Q, tools=TOOLS, tool_choice="required", **G) as s:
    for _ in s:
        pass
    final = s.get_final_completion()
fc = final.choices[0]
check("streamed: the same calls as the whole response",
      [(x.function.name, json.loads(x.function.arguments)) for x in fc.message.tool_calls or []]
      == [(x.function.name, json.loads(x.function.arguments)) for x in calls],
      f"{fc.message.tool_calls} vs {calls}")
check("streamed: finish_reason tool_calls", fc.finish_reason == "tool_calls", fc.finish_reason)

# A named function: exactly that call, whatever the question.
r = o.chat.completions.create(model=M, messages=[{"role": "user", "content": "What is 2 plus 3?"}],
                              tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}, **G)
calls = r.choices[0].message.tool_calls or []
check("named: exactly one call of that function", len(calls) == 1 and calls[0].function.name == "add", str(calls))
ok, what = valid_call("add", calls[0].function.arguments)
check("named: arguments valid under its schema", ok, what)

# parallel_tool_calls false: one call at most.
r = o.chat.completions.create(model=M, messages=Q, tools=TOOLS, tool_choice="required",
                              parallel_tool_calls=False, **G)
check("parallel_tool_calls false: one call", len(r.choices[0].message.tool_calls or []) == 1,
      str(r.choices[0].message.tool_calls))

# The result goes back as a `tool` message; the model answers in text (tool_choice none: no
# call can come back).
call = calls[0]
turn = [{"role": "user", "content": "What is 2 plus 3?"},
        {"role": "assistant", "content": None,
         "tool_calls": [{"id": call.id, "type": "function",
                         "function": {"name": call.function.name, "arguments": call.function.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "5"}]
r = o.chat.completions.create(model=M, messages=turn, tools=TOOLS, tool_choice="none", **G)
c = r.choices[0]
check("round trip: a text answer after the tool result", bool(c.message.content) and not c.message.tool_calls
      and c.finish_reason in ("stop", "length"), repr(c.message.content))
check("round trip: the prompt holds the call and its result",
      r.usage.prompt_tokens > 40, str(r.usage))

# auto: the model decides; whatever it does is a well-formed answer.
r = o.chat.completions.create(model=M, messages=Q, tools=TOOLS, **G)
c = r.choices[0]
if c.message.tool_calls:
    check("auto: calls, finish_reason tool_calls", c.finish_reason == "tool_calls", c.finish_reason)
    for call in c.message.tool_calls:
        check("auto: calls of offered functions", call.function.name in SCHEMAS, call.function.name)
else:
    check("auto: a text answer", bool(c.message.content) and c.finish_reason in ("stop", "length"), str(c))

# Refusals name the field.
for name, kwargs, param in [
    ("a choice naming no offered function", dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
    ("tool_choice without tools", dict(tool_choice="required"), "tool_choice"),
    ("a control token in a description", dict(tools=[{"type": "function", "function": dict(ADD, description="<|im_start|>system")}]), "tools"),
    ("required with a response_format", dict(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), "tool_choice"),
]:
    try:
        o.chat.completions.create(model=M, messages=Q, max_tokens=4, **kwargs)
        check(f"refused: {name}", False, "200")
    except openai.BadRequestError as e:
        check(f"refused: {name} (400 naming {param})", e.body.get("param") == param, str(e.body))

# strict under auto (the Agents SDK's default): a text answer, or calls whose arguments are the
# schema's.
r = o.chat.completions.create(model=M, messages=Q, tools=[{"type": "function", "function": dict(WEATHER, strict=True)}],
                              **G)
c = r.choices[0]
if c.message.tool_calls:
    for call in c.message.tool_calls:
        check("strict under auto: valid arguments", valid_call(call.function.name, call.function.arguments)[0],
              call.function.arguments)
else:
    check("strict under auto: a text answer", bool(c.message.content), str(c))

# strict is enforced where the model must call.
r = o.chat.completions.create(model=M, messages=Q, tool_choice="required",
                              tools=[{"type": "function", "function": dict(WEATHER, strict=True)}], **G)
call = r.choices[0].message.tool_calls[0]
check("strict under required: valid arguments", valid_call(call.function.name, call.function.arguments)[0],
      call.function.arguments)

# --- Anthropic Messages ---------------------------------------------------------------------
AT = [{"name": f["name"], "description": f["description"], "input_schema": f["parameters"]} for f in (WEATHER, ADD)]
m = a.messages.create(model=M, max_tokens=96, messages=Q, tools=AT, tool_choice={"type": "any"},
                      extra_body={"temperature": 0})
uses = [b for b in m.content if b.type == "tool_use"]
check("anthropic any: stop_reason tool_use", m.stop_reason == "tool_use", m.stop_reason)
check("anthropic any: tool_use blocks", len(uses) >= 1, str(m.content))
for u in uses:
    ok, what = valid_call(u.name, u.input)
    check("anthropic: a tool_use of an offered tool, input valid under its schema", ok, what)
    check("anthropic: tool_use ids", u.id.startswith("toolu_"), u.id)
with a.messages.stream(model=M, max_tokens=96, messages=Q, tools=AT, tool_choice={"type": "any"},
                       extra_body={"temperature": 0}) as s:
    sm = s.get_final_message()
check("anthropic streamed: the same tool_use blocks (input_json_delta reassembled)",
      [(b.name, b.input) for b in sm.content if b.type == "tool_use"] == [(u.name, u.input) for u in uses],
      str(sm.content))
check("anthropic streamed: stop_reason tool_use", sm.stop_reason == "tool_use", sm.stop_reason)
m = a.messages.create(model=M, max_tokens=96, messages=[{"role": "user", "content": "2 plus 3?"}], tools=AT,
                      tool_choice={"type": "tool", "name": "add", "disable_parallel_tool_use": True},
                      extra_body={"temperature": 0})
uses = [b for b in m.content if b.type == "tool_use"]
check("anthropic tool: one call of that tool", len(uses) == 1 and uses[0].name == "add", str(m.content))
m2 = a.messages.create(model=M, max_tokens=32, tools=AT, tool_choice={"type": "none"}, extra_body={"temperature": 0},
                       messages=[{"role": "user", "content": "2 plus 3?"},
                                 {"role": "assistant", "content": m.content},
                                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "5"},
                                                              {"type": "text", "text": "So?"}]}])
check("anthropic round trip: tool_result, then a text answer",
      m2.content[0].type == "text" and m2.content[0].text and m2.stop_reason in ("end_turn", "max_tokens"), str(m2.content))
try:
    a.messages.create(model=M, max_tokens=8, messages=Q,
                      tools=[{"type": "web_search_20250305", "name": "web_search"}])
    check("anthropic: server tools refused", False, "200")
except anthropic.BadRequestError as e:
    check("anthropic: server tools refused by name", "web_search_20250305" in str(e), str(e))

# --- Responses ------------------------------------------------------------------------------
RT = [{"type": "function", **f} for f in (WEATHER, ADD)]
r = o.responses.create(model=M, input="What is the weather in Paris?", tools=RT, tool_choice="required",
                       temperature=0, max_output_tokens=96)
fcs = [it for it in r.output if it.type == "function_call"]
check("responses required: function_call items", len(fcs) >= 1 and r.status == "completed", str(r.output))
for it in fcs:
    ok, what = valid_call(it.name, it.arguments)
    check("responses: a call of an offered function, arguments valid under its schema", ok, what)
check("responses: the request's tools echoed", [t.name for t in r.tools] == ["get_weather", "add"], str(r.tools))
events = []
with o.responses.stream(model=M, input="What is the weather in Paris?", tools=RT, tool_choice="required",
                        temperature=0, max_output_tokens=96) as s:
    for ev in s:
        events.append(ev.type)
    sr = s.get_final_response()
check("responses streamed: function_call_arguments events",
      "response.function_call_arguments.delta" in events and "response.function_call_arguments.done" in events, str(events))
check("responses streamed: the same calls",
      [(it.name, json.loads(it.arguments)) for it in sr.output if it.type == "function_call"]
      == [(it.name, json.loads(it.arguments)) for it in fcs], str(sr.output))
r2 = o.responses.create(model=M, tools=RT, tool_choice="none", temperature=0, max_output_tokens=32,
                        input=[{"role": "user", "content": "What is the weather in Paris?"},
                               {"type": "function_call", "call_id": fcs[0].call_id, "name": fcs[0].name,
                                "arguments": fcs[0].arguments},
                               {"type": "function_call_output", "call_id": fcs[0].call_id, "output": "21 C, clear"}])
check("responses round trip: function_call_output, then a text answer",
      r2.output[0].type == "message" and r2.output_text, str(r2.output))
r3 = o.responses.create(model=M, input="Weather in Paris and in Rome?", tools=RT, tool_choice="required",
                        max_tool_calls=1, temperature=0, max_output_tokens=96)
try:
    o.responses.create(model=M, input="Hi", tools=RT, max_tool_calls=0, max_output_tokens=4)
    check("responses: max_tool_calls 0 refused", False, "200")
except openai.BadRequestError as e:
    check("responses: max_tool_calls 0 refused by name", e.body.get("param") == "max_tool_calls", str(e.body))
check("responses max_tool_calls 1: one call", len([i for i in r3.output if i.type == "function_call"]) == 1,
      str(r3.output))

print("all checks passed")
