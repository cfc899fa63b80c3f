#!/usr/bin/env bash
# The gateway's own cost, side by side in one run on this machine: a mock OpenAI-compatible
# upstream (nginx returning a fixed answer: /v1/chat/completions as JSON, /v1/completions as the
# SSE stream the gateway reads, /v1/models), nginx as a plain HTTP proxy in front of it, and
# `cachet serve` with the mock as its OpenAI upstream (auth, request checks, normalization,
# cached tokenization, routing, the response rebuilt). wrk drives each with the same chat
# request: at one connection for the latency a request adds (p50 / p99 over the mock alone), and
# at CONNS connections for SECS seconds for the request rate against nginx's.
#   CACHET=target/release/cachet CONNS=16 SECS=10 OUT=dir scripts/gateway_cost.sh
# Needs nginx and wrk (apt install nginx-light wrk).
set -euo pipefail
bin=${CACHET:-target/release/cachet}
conns=${CONNS:-16}
secs=${SECS:-10}
out=${OUT:-gateway-cost-out}
mkdir -p "$out"
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
mock=$(free_port); proxy=$(free_port); gw=$(free_port)

chunk='{"id":"cmpl-1","object":"text_completion","created":1,"model":"smollm2","choices":[{"index":0,"text":"Paris","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}'
chat='{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"smollm2","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}'
esc() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
cat > "$dir/nginx.conf" <<EOF
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/body; proxy_temp_path $dir/proxy;
  fastcgi_temp_path $dir/fcgi; uwsgi_temp_path $dir/uwsgi; scgi_temp_path $dir/scgi;
  upstream mock { server 127.0.0.1:$mock; keepalive 64; }
  server {
    listen 127.0.0.1:$mock;
    location = /v1/models { default_type application/json; return 200 '{"object":"list","data":[{"id":"smollm2","object":"model"}]}'; }
    location = /v1/completions { default_type text/event-stream; return 200 "data: $(esc "$chunk")\n\ndata: [DONE]\n\n"; }
    location = /v1/chat/completions { default_type application/json; return 200 "$(esc "$chat")"; }
  }
  server {
    listen 127.0.0.1:$proxy;
    location / { proxy_pass http://mock; proxy_http_version 1.1; proxy_set_header Connection ""; }
  }
}
EOF
nginx -c "$dir/nginx.conf" -g 'daemon off;' &
key=sk-cost-bench
cat > "$dir/cachet.toml" <<EOF
[[tenant]]
id = "bench"
api_key_sha256 = ["$("$bin" tenant hash-key $key)"]

[[upstream]]
kind = "openai"
url = "http://127.0.0.1:$mock"
model = "smollm2"
EOF
CACHET_USAGE_DB=off "$bin" serve --model smollm2 --config "$dir/cachet.toml" \
  --listen 127.0.0.1:$gw --log-format json 2> "$out/cachet.log" &
for p in $mock $proxy $gw; do
  for _ in $(seq 1 600); do curl -s -o /dev/null "127.0.0.1:$p/" 2>/dev/null && break; sleep 0.1; done
done
# The gateway answers once its upstream's health check has: wait for a real answer.
body='{"model":"smollm2","max_tokens":1,"messages":[{"role":"system","content":"You are a helpful assistant for Acme routers."},{"role":"user","content":"What is the capital of France?"}]}'
for _ in $(seq 1 100); do
  curl -sf -o /dev/null -H "authorization: Bearer $key" -d "$body" "127.0.0.1:$gw/v1/chat/completions" && break
  sleep 0.2
done
curl -sS -H "authorization: Bearer $key" -d "$body" "127.0.0.1:$gw/v1/chat/completions" > "$out/cachet-answer.json"
cat > "$dir/post.lua" <<EOF
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $key"
wrk.body = '$body'
EOF
run() { # name port connections
  wrk -t1 -c"$3" -d"${secs}s" --latency -s "$dir/post.lua" "http://127.0.0.1:$2/v1/chat/completions" > "$out/wrk-$1-c$3.txt"
}
# Warm-up, then each path in turn: one connection (latency), then CONNS (rate).
wrk -t1 -c"$conns" -d2s -s "$dir/post.lua" "http://127.0.0.1:$gw/v1/chat/completions" > /dev/null
for c in 1 "$conns"; do run mock $mock "$c"; run nginx $proxy "$c"; run cachet $gw "$c"; done
if [ -n "${PERF:-}" ]; then
  # Where cachet's CPU goes at CONNS connections (perf, call graphs).
  perf record -F 999 -g -o "$out/perf.data" -p "$(pgrep -f "serve --model smollm2 --config $dir")" -- sleep 5 > /dev/null 2>&1 &
  run cachet-perf $gw "$conns"
  wait %%
fi
python3 - "$out" "$conns" <<'EOF'
import re, sys
out, conns = sys.argv[1], sys.argv[2]
def parse(name):
    t = open(f"{out}/wrk-{name}.txt").read()
    def us(v):
        n, u = float(re.match(r"([\d.]+)", v).group(1)), re.search(r"(us|ms|s)$", v).group(1)
        return n * {"us": 1, "ms": 1e3, "s": 1e6}[u]
    p = {q: us(v) for q, v in re.findall(r"^\s+(50|99)%\s+(\S+)", t, re.M)}
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
    errs = re.search(r"Non-2xx or 3xx responses: (\d+)", t)
    return p["50"], p["99"], rps, int(errs.group(1)) if errs else 0
lines = [f"| path | 1 connection: p50 | p99 | over the mock (p50) | {conns} connections: req/s | vs nginx | non-2xx |",
         "|---|---|---|---|---|---|---|"]
m1, n1 = parse("mock-c1"), parse(f"nginx-c{conns}")
for name, key in [("mock upstream alone", "mock"), ("nginx proxy → mock", "nginx"), ("cachet serve → mock (OpenAI upstream)", "cachet")]:
    one, many = parse(f"{key}-c1"), parse(f"{key}-c{conns}")
    over = "—" if key == "mock" else f"+{one[0] - m1[0]:.0f} µs"
    ratio = "—" if key == "mock" else f"{many[2] / n1[2]:.2f}×"
    lines.append(f"| {name} | {one[0]:.0f} µs | {one[1]:.0f} µs | {over} | {many[2]:,.0f} | {ratio} | {one[3] + many[3]} |")
open(f"{out}/report.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
