#!/usr/bin/env python3
"""Renders tool conversations with transformers' own chat-template code (the jinja2 environment
`apply_chat_template` uses: trimmed blocks, its `tojson`) and writes the expected prompts to
tests/fixtures/chat_template_reference.json, which `tests/tests/tokenizer.rs` holds Cachet's
renderer to.

Templates: Qwen2.5's (tests/fixtures/qwen2.5-chat-template.jinja, as shipped in the
Qwen2.5-Coder-0.5B-Instruct GGUF of ../shared/MODELS.md) and ours for ChatML models
(examples/chat-templates/chatml-tools.jinja).

    python3 -m venv /tmp/hf && /tmp/hf/bin/pip install transformers jinja2
    /tmp/hf/bin/python scripts/chat_template_reference.py
"""
import json
import pathlib

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city. Température en °C — \"quoted\" \\ slashed",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city's name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time now, in a zone.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}, "n": {"type": "integer", "minimum": 0, "maximum": 1.5}}},
    },
}
CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}},
    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {"zone": "Europe/Paris", "n": 2}}},
]

CASES = [
    {"name": "plain", "tools": None, "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Hi there"},
    ]},
    {"name": "tools_default_system", "tools": [WEATHER, CLOCK], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
    ]},
    {"name": "round_trip", "tools": [WEATHER, CLOCK], "messages": [
        {"role": "system", "content": "You answer with data."},
        {"role": "user", "content": "Weather and time in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear ☀\"}"},
        {"role": "tool", "tool_call_id": "call_2", "content": "14:05"},
    ]},
    {"name": "text_and_call_then_answer", "tools": [WEATHER], "messages": [
        {"role": "user", "content": "And in Rome?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": CALLS[:1]},
        {"role": "tool", "tool_call_id": "call_1", "content": "rain"},
        {"role": "assistant", "content": "It rains in Rome."},
        {"role": "user", "content": "Thanks! \"quotes\", \\ back\\slash,\nnew line, </tool_call> 🦀"},
    ]},
]


def main():
    templates = {
        "qwen2.5": (ROOT / "tests/fixtures/qwen2.5-chat-template.jinja").read_text(),
        "chatml-tools": (ROOT / "examples/chat-templates/chatml-tools.jinja").read_text(),
    }
    out = {"transformers": transformers.__version__, "cases": []}
    for tname, template in templates.items():
        for case in CASES:
            rendered, _ = render_jinja_template(
                conversations=[case["messages"]],
                tools=case["tools"],
                chat_template=template,
                add_generation_prompt=True,
            )
            out["cases"].append({
                "template": tname,
                "name": case["name"],
                "messages": case["messages"],
                "tools": case["tools"],
                "prompt": rendered[0],
            })
    path = ROOT / "tests/fixtures/chat_template_reference.json"
    path.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(out['cases'])} renderings to {path}")


if __name__ == "__main__":
    main()
