#!/usr/bin/env bash
# The gateway's own cost, side by side in one run on this machine: a mock OpenAI-compatible
# upstream (nginx returning a fixed answer: /v1/chat/completions as JSON, /v1/completions as the
# SSE stream the gateway reads, /v1/models), nginx as a plain HTTP proxy in front of it (in its
# own process: a proxy sharing one event loop with its upstream would skip the hop between
# processes every other path pays), and `cachet serve` with the mock as its OpenAI upstream
# (auth, request checks, normalization, cached tokenization, routing, the response rebuilt) —
# serving thread-per-core (`--io-threads auto`, the default) and on the shared work-stealing
# runtime (`--io-threads shared`). wrk drives each with the same chat request: at one connection
# for the latency a request adds (p50 / p99 over the mock alone; ROUNDS rounds taken in turn and
# the median reported, as single runs on a shared 2-core machine move by tens of µs), and at
# CONNS connections for SECS seconds for the request rate against nginx's.
#   CACHET=target/release/cachet CONNS=16 SECS=10 ROUNDS=3 OUT=dir scripts/gateway_cost.sh
# Needs nginx and wrk (apt install nginx-light wrk).
set -euo pipefail
bin=${CACHET:-target/release/cachet}
conns=${CONNS:-16}
secs=${SECS:-10}
rounds=${ROUNDS:-3}
out=${OUT:-gateway-cost-out}
mkdir -p "$out"
source "$(dirname "$0")/mock_upstream.sh"
mock=$(free_port); proxy=$(free_port); gw=$(free_port); gws=$(free_port)

mock_upstream "$mock"
nginx_conf proxy "upstream mock { server 127.0.0.1:$mock; keepalive 64; }
  server {
    listen 127.0.0.1:$proxy;
    location / { proxy_pass http://mock; proxy_http_version 1.1; proxy_set_header Connection \"\"; }
  }"
key=sk-cost-bench
cachet_config "$bin" "$key" "$mock" > "$dir/cachet.toml"
for mode in auto:$gw shared:$gws; do
  # Access lines off, as nginx's are here (access_log off): each costs ~13% of the rate on
  # 2 cores (BENCHMARKS.md §12).
  RUST_LOG=${RUST_LOG:-info,cachet::access=off} CACHET_USAGE_DB=off "$bin" serve --model smollm2 --config "$dir/cachet.toml" --io-threads "${mode%%:*}" \
    --listen "127.0.0.1:${mode#*:}" --log-format json 2> "$out/cachet-${mode%%:*}.log" &
done
for p in $mock $proxy $gw $gws; do
  for _ in $(seq 1 600); do curl -s -o /dev/null "127.0.0.1:$p/" 2>/dev/null && break; sleep 0.1; done
done
# The gateway answers once its upstream's health check has: wait for a real answer.
body='{"model":"smollm2","max_tokens":1,"messages":[{"role":"system","content":"You are a helpful assistant for Acme routers."},{"role":"user","content":"What is the capital of France?"}]}'
for p in $gw $gws; do
  for _ in $(seq 1 100); do
    curl -sf -o /dev/null -H "authorization: Bearer $key" -d "$body" "127.0.0.1:$p/v1/chat/completions" && break
    sleep 0.2
  done
done
curl -sS -H "authorization: Bearer $key" -d "$body" "127.0.0.1:$gw/v1/chat/completions" > "$out/cachet-answer.json"
cat > "$dir/post.lua" <<CONF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
wrk.body = '$body'
CONF
run() { # name port connections [file suffix]
  wrk -t1 -c"$3" -d"${secs}s" --latency -s "$dir/post.lua" "http://127.0.0.1:$2/v1/chat/completions" > "$out/wrk-$1-c$3${4:-}.txt"
}
paths="mock:$mock nginx:$proxy cachet:$gw cachet-shared:$gws"
# Warm-up, then each path in turn: one connection (latency) for ROUNDS rounds, then CONNS (rate).
for p in $proxy $gw $gws; do wrk -t1 -c"$conns" -d2s -s "$dir/post.lua" "http://127.0.0.1:$p/v1/chat/completions" > /dev/null; done
for r in $(seq 1 "$rounds"); do
  for p in $paths; do run "${p%%:*}" "${p#*:}" 1 "-r$r"; done
done
for p in $paths; do run "${p%%:*}" "${p#*:}" "$conns"; done
if [ -n "${PERF:-}" ]; then
  # Where cachet's CPU goes at CONNS connections (perf, call graphs).
  perf record -F 999 -g -o "$out/perf.data" -p "$(pgrep -f -- "--io-threads auto --listen 127.0.0.1:$gw")" -- sleep 5 > /dev/null 2>&1 &
  run cachet-perf $gw "$conns"
  wait %%
fi
python3 - "$out" "$conns" "$rounds" <<'PY'
import re, statistics, sys
out, conns, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def parse(name):
    t = open(f"{out}/wrk-{name}.txt").read()
    def us(v):
        n, u = float(re.match(r"([\d.]+)", v).group(1)), re.search(r"(us|ms|s)$", v).group(1)
        return n * {"us": 1, "ms": 1e3, "s": 1e6}[u]
    p = {q: us(v) for q, v in re.findall(r"^\s+(50|99)%\s+(\S+)", t, re.M)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    return p["50"], p["99"], rps, int(errs.group(1)) if errs else 0
def one(key):  # the rounds' median p50 and p99, non-2xx answers, each round's p50
    runs = [parse(f"{key}-c1-r{r}") for r in range(1, rounds + 1)]
    med = lambda i: statistics.median(r[i] for r in runs)
    return med(0), med(1), sum(r[3] for r in runs), [r[0] for r in runs]
lines = [f"| path | 1 connection: p50 (median of {rounds}) | p99 | over the mock (p50) | each round's p50 (µs) | {conns} connections: req/s | vs nginx | non-2xx |",
         "|---|---|---|---|---|---|---|---|"]
m1, n1 = one("mock"), parse(f"nginx-c{conns}")
for name, key in [("mock upstream alone", "mock"), ("nginx proxy → mock", "nginx"),
                  ("cachet serve → mock (OpenAI upstream), thread per core", "cachet"),
                  ("cachet serve → mock, `--io-threads shared`", "cachet-shared")]:
    o, many = one(key), parse(f"{key}-c{conns}")
    over = "—" if key == "mock" else f"+{o[0] - m1[0]:.0f} µs"
    ratio = "—" if key == "mock" else f"{many[2] / n1[2]:.2f}×"
    each = " / ".join(f"{v:.0f}" for v in o[3])
    lines.append(f"| {name} | {o[0]:.0f} µs | {o[1]:.0f} µs | {over} | {each} | {many[2]:,.0f} | {ratio} | {o[2] + many[3]} |")
open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
