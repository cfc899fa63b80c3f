#!/usr/bin/env python3
"""Renders chat templates as transformers' `apply_chat_template` does (its own
`render_jinja_template`: jinja2's sandbox, trimmed blocks, its `tojson`, `raise_exception`,
`strftime_now`) — the reference `tests/tests/chat_templates.rs` holds Cachet's renderer to.

Reads {"templates": {name: source}, "cases": [...], "bos_token", "eos_token"} on stdin and
writes {name: {case: {"ok": text} | {"error": message}}} on stdout. A case is {"name",
"messages", "tools" (or null), "add_generation_prompt", "kwargs"}.
"""
import json
import sys

from transformers.utils.chat_template_utils import render_jinja_template


def main():
    job = json.load(sys.stdin)
    out = {}
    for name, source in job["templates"].items():
        results = {}
        for case in job["cases"]:
            try:
                rendered, _ = render_jinja_template(
                    conversations=[case["messages"]],
                    tools=case["tools"],
                    chat_template=source,
                    add_generation_prompt=case["add_generation_prompt"],
                    bos_token=job["bos_token"],
                    eos_token=job["eos_token"],
                    **case["kwargs"],
                )
                # (one rendering per conversation, generation indices)
                results[case["name"]] = {"ok": rendered[0]}
            except Exception as e:  # noqa: BLE001 - any refusal is a refusal
                results[case["name"]] = {"error": f"{type(e).__name__}: {e}"}
        out[name] = results
    json.dump(out, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
