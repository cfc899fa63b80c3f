#!/usr/bin/env python3
"""Structured outputs against a running `cachet serve`, two measurements.

corpus   — a public schema corpus nobody here tuned to: every schema of the JSON-Schema-Test-Suite
           (draft 2020-12, as vendored in the `jsonschema` sdist on PyPI) sent as
           `response_format: json_schema`; the share that compiles, and of the outputs the share
           the reference validator (`jsonschema`, Draft 2020-12) accepts — of those that finished,
           and of all (outputs cut by max_tokens count as failures there).
overhead — the cost of the grammar per decode step: the server's mean inter-token latency
           (`x-cachet-timings`) of unconstrained and constrained requests side by side,
           alternating, at each concurrency.

Usage:
  structured_bench.py corpus   --base URL --key KEY --sdist jsonschema-X.tar.gz [--limit N] [--out F]
  structured_bench.py overhead --base URL --key KEY --concurrency 1,64 [--out F]
"""
import argparse
import concurrent.futures as cf
import io
import json
import statistics
import sys
import tarfile
import time
import urllib.error
import urllib.request


def post(base, key, body, timeout=600):
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json",
                                          "x-cachet-timings": "1"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def corpus_schemas(sdist):
    """(file, description, schema) of every test group of draft2020-12's top-level files."""
    out = []
    with tarfile.open(sdist) as t:
        for m in sorted(t.getmembers(), key=lambda m: m.name):
            parts = m.name.split("/")
            if len(parts) == 5 and parts[2:4] == ["tests", "draft2020-12"] and m.name.endswith(".json"):
                groups = json.load(io.TextIOWrapper(t.extractfile(m), encoding="utf-8"))
                for g in groups:
                    out.append((parts[4], g.get("description", ""), g["schema"]))
    return out


def corpus(a):
    import jsonschema
    schemas = corpus_schemas(a.sdist)
    if a.limit:
        schemas = schemas[: a.limit]

    def one(item):
        f, desc, schema = item
        body = {"model": a.model, "temperature": 0, "max_tokens": a.max_tokens,
                "messages": [{"role": "user", "content": "Write a JSON value valid under this JSON Schema:\n" + json.dumps(schema)}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}}
        if isinstance(schema, bool):
            body["response_format"]["json_schema"]["schema"] = schema
        code, doc = post(a.base, a.key, body)
        r = {"file": f, "description": desc, "status": code}
        if code != 200:
            r["error"] = doc.get("error", {}).get("message", "")[:200]
            return r
        c = doc["choices"][0]
        r["finish"] = c["finish_reason"]
        r["text"] = c["message"]["content"]
        try:
            v = json.loads(r["text"])
            jsonschema.Draft202012Validator(schema).validate(v)
            r["valid"] = True
        except Exception as e:  # not JSON, or invalid under the schema
            r["valid"] = False
            r["why"] = str(e)[:200]
        return r

    t0 = time.time()
    with cf.ThreadPoolExecutor(a.workers) as ex:
        results = list(ex.map(one, schemas))
    n = len(results)
    compiled = [r for r in results if r["status"] == 200]
    finished = [r for r in compiled if r["finish"] == "stop"]
    valid_fin = [r for r in finished if r["valid"]]
    valid_all = [r for r in compiled if r["valid"]]
    summary = {
        "schemas": n, "compiled": len(compiled), "finished": len(finished),
        "valid_of_finished": len(valid_fin), "valid_of_compiled": len(valid_all),
        "seconds": round(time.time() - t0, 1),
    }
    print(f"| schemas | compiled | finished (stop) | valid / finished | valid / compiled |")
    print(f"|---|---|---|---|---|")
    pct = lambda x, y: f"{x} ({100 * x / y:.1f}%)" if y else "-"
    print(f"| {n} | {pct(len(compiled), n)} | {pct(len(finished), len(compiled))} | "
          f"{pct(len(valid_fin), len(finished))} | {pct(len(valid_all), len(compiled))} |")
    refused = {}
    for r in results:
        if r["status"] != 200:
            refused[r["file"]] = refused.get(r["file"], 0) + 1
    print("refused by file:", json.dumps(refused))
    bad = [r for r in finished if not r["valid"]]
    for r in bad[:20]:
        print("INVALID", r["file"], "|", r["description"], "|", r["text"][:120], "|", r.get("why", ""))
    if a.out:
        json.dump({"summary": summary, "results": results}, open(a.out, "w"), indent=1)


OVERHEAD_SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "count": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "count", "tags"]}}},
    "required": ["items"]}


def overhead(a):
    rows = []
    for c in [int(x) for x in a.concurrency.split(",")]:
        res = {"free": [], "json": []}
        for rep in range(a.reps):
            for mode in ("free", "json"):
                body = {"model": a.model, "temperature": 1.0, "max_tokens": a.max_tokens, "ignore_eos": mode == "free",
                        "messages": [{"role": "user", "content": "List some items as JSON."}]}
                if mode == "json":
                    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "o", "schema": OVERHEAD_SCHEMA}}
                with cf.ThreadPoolExecutor(c) as ex:
                    out = list(ex.map(lambda i: post(a.base, a.key, dict(body, seed=1000 * rep + i)), range(c)))
                itl = [d["usage"]["cachet_timings"]["mean_itl_ms"] for code, d in out
                       if code == 200 and d["usage"]["completion_tokens"] > 8]
                toks = [d["usage"]["completion_tokens"] for code, d in out if code == 200]
                res[mode].append((statistics.median(itl) if itl else float("nan"), statistics.mean(toks)))
        f = statistics.median(x[0] for x in res["free"])
        j = statistics.median(x[0] for x in res["json"])
        rows.append({"concurrency": c, "free_itl_ms": f, "json_itl_ms": j, "ratio": j / f,
                     "free_tokens": statistics.mean(x[1] for x in res["free"]),
                     "json_tokens": statistics.mean(x[1] for x in res["json"]), "runs": res})
        print(f"| {c} | {f:.2f} ms | {j:.2f} ms | {j / f:.3f}× |", flush=True)
    if a.out:
        json.dump(rows, open(a.out, "w"), indent=1)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["corpus", "overhead"])
    p.add_argument("--base", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--model", default="smollm2")
    p.add_argument("--sdist")
    p.add_argument("--limit", type=int, default=0)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", default="1,64")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args()
    if a.mode == "corpus":
        corpus(a)
    else:
        print("| concurrency | mean ITL, free | mean ITL, json_schema | ratio |\n|---|---|---|---|", flush=True)
        overhead(a)


if __name__ == "__main__":
    sys.exit(main())
