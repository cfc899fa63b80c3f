"""Cachet's gateway against the official `openai` Python client (plus raw HTTP for bad input).

Run by gateway/tests/openai_client.rs with: BASE_URL, KEY (a tenant key), LIMITED_KEY (a tenant
allowed 2 requests per minute). Prints one line per check; exits non-zero on the first failure.
"""
import json
import os
import ssl
import sys
import urllib.error
import urllib.request

import openai

base = os.environ["BASE_URL"]
# TLS with the test's own CA (CA_FILE), as a real client would be configured.
CA = os.environ.get("CA_FILE")
SSL = ssl.create_default_context(cafile=CA) if CA else None


def make_client(key):
    return openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0,
                         http_client=openai.DefaultHttpxClient(verify=SSL if SSL else True))


client = make_client(os.environ["KEY"])
MSG = [{"role": "user", "content": "What is the capital of France?"}]


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f": {detail}" if detail else ""), flush=True)
    if not cond:
        sys.exit(1)


models = [m.id for m in client.models.list().data]
check("models.list" + (" over TLS" if CA else ""), models == ["smollm2"] and base.startswith("https://" if CA else "http"), str(models))

r = client.chat.completions.create(model="smollm2", messages=MSG, temperature=0, max_tokens=24)
check("chat completion names Paris", "Paris" in r.choices[0].message.content, r.choices[0].message.content)
check("finish_reason", r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
check("usage", r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens)

r2 = client.chat.completions.create(model="smollm2", messages=MSG, temperature=0, max_tokens=24)
cached = r2.usage.prompt_tokens_details.cached_tokens
check("cached_tokens on a repeated prefix", cached >= 16, f"{cached} of {r2.usage.prompt_tokens}")

chunks = list(client.chat.completions.create(model="smollm2", messages=MSG, temperature=0, max_tokens=24,
                                             stream=True, stream_options={"include_usage": True}))
text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
check("streamed text equals the non-streamed one", text == r.choices[0].message.content, repr(text))
check("stream ends with usage", chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0)

c = client.completions.create(model="smollm2", prompt="The capital of France is", temperature=0, max_tokens=8)
check("text completion", len(c.choices[0].text) > 0 and c.usage.prompt_tokens > 0, repr(c.choices[0].text))

s = client.chat.completions.create(model="smollm2", messages=MSG, temperature=0, max_tokens=24, stop=[" Paris"])
check("stop string", "Paris" not in s.choices[0].message.content and s.choices[0].finish_reason == "stop", repr(s.choices[0].message.content))

try:
    make_client("sk-wrong").models.list()
    check("401 for a bad key", False)
except openai.AuthenticationError as e:
    check("401 for a bad key", e.status_code == 401)

limited = make_client(os.environ["LIMITED_KEY"])
got_429 = None
for _ in range(4):
    try:
        limited.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1)
    except openai.RateLimitError as e:
        got_429 = e
        break
check("429 over the tenant's limit", got_429 is not None)
check("Retry-After on the 429", int(got_429.response.headers.get("retry-after", "0")) >= 1, str(dict(got_429.response.headers)))

r = client.chat.completions.create(model="smollm2", messages=MSG, n=2, temperature=0, max_tokens=8)
check("n = 2 gives two choices", len(r.choices) == 2 and r.choices[0].message.content == r.choices[1].message.content)


def raw(path, body, key=os.environ["KEY"]):
    req = urllib.request.Request(base + path, data=body, method="POST",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=SSL) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


for name, body, status in [
    ("malformed JSON", b"{not json", 400),
    ("wrong types", json.dumps({"model": "smollm2", "messages": "hi"}).encode(), 400),
    ("empty messages", json.dumps({"model": "smollm2", "messages": []}).encode(), 400),
    ("unknown model", json.dumps({"model": "gpt-9", "messages": MSG}).encode(), 404),
    ("oversize body", b'{"model": "smollm2", "messages": [{"role": "user", "content": "' + b"x" * (2 << 20) + b'"}]}', 413),
]:
    code, doc = raw("/v1/chat/completions", body)
    check(f"{name} -> {status}", code == status and "message" in doc.get("error", {}), f"{code} {doc}")

with urllib.request.urlopen(base + "/health", context=SSL) as resp:
    check("still serving after bad input", resp.status == 200)

# /metrics through Prometheus' own parser (the exposition is OpenMetrics text).
from prometheus_client.openmetrics.parser import text_string_to_metric_families

with urllib.request.urlopen(base + "/metrics", context=SSL) as resp:
    families = {f.name: f for f in text_string_to_metric_families(resp.read().decode())}
check("metrics parse", "cachet_time_to_first_token_seconds" in families, ", ".join(sorted(families)))
ttft = families["cachet_time_to_first_token_seconds"]
count = [s.value for s in ttft.samples if s.name.endswith("_count")][0]
check("TTFT histogram counts requests", count >= 5, str(count))
buckets = sorted(float(s.labels["le"]) for s in ttft.samples if s.name.endswith("_bucket") and s.labels["le"] != "+Inf")
check("vLLM's TTFT buckets", buckets[:4] == [0.001, 0.005, 0.01, 0.02] and buckets[-1] == 2560.0, str(buckets))
reqs = {(s.labels["tenant"], s.labels["status"]): s.value for s in families["cachet_requests"].samples if s.name.endswith("_total")}
check("per-tenant request counters", reqs.get(("acme", "200"), 0) >= 5 and reqs.get(("acme", "400"), 0) >= 1 and reqs.get(("limited", "429"), 0) >= 1, str(reqs))
hits = families["cachet_prefix_cache_hit_tokens"].samples[0].value
queried = families["cachet_prefix_cache_queried_tokens"].samples[0].value
check("prefix-cache tokens", 0 < hits <= queried, f"{hits} of {queried}")
for name in ["cachet_inter_token_latency_seconds", "cachet_e2e_request_latency_seconds", "cachet_request_queue_time_seconds",
             "cachet_num_requests_running", "cachet_num_requests_waiting", "cachet_kv_cache_usage_ratio", "cachet_generation_tokens"]:
    check(f"metric {name}", name in families)
steps = families["cachet_engine_steps"].samples[0].value
busy = families["cachet_engine_step_seconds"].samples[0].value
gap = families["cachet_engine_step_gap_seconds"].samples[0].value
check("engine step time and the host's gaps between steps", steps > 0 and busy > 0 and gap >= 0, f"{steps} steps, {busy} s, gaps {gap} s")
print("all checks passed")
