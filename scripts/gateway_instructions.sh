#!/usr/bin/env bash
# Instructions the gateway executes per proxied chat request, counted by valgrind's callgrind:
# deterministic where wall-clock rates on this shared 2-core machine move by 1.5x between runs,
# so two builds compare exactly. `cachet serve` (one lane) runs under callgrind with a mock
# OpenAI upstream (scripts/mock_upstream.sh, as scripts/gateway_cost.sh); after a
# warm-up the counting is switched on for REQS requests on one keep-alive connection, then the
# total is divided by them. The callgrind output stays in OUT for callgrind_annotate.
#   REQS=1000 OUT=dir scripts/gateway_instructions.sh target/release/cachet [more binaries...]
# Needs valgrind, nginx, curl, python3 (apt install valgrind nginx-light curl).
set -euo pipefail
reqs=${REQS:-1000}
out=${OUT:-gateway-instructions-out}
mkdir -p "$out"
source "$(dirname "$0")/mock_upstream.sh"
mock=$(free_port)
mock_upstream "$mock"
key=sk-cost-bench
body='{"model":"smollm2","max_tokens":1,"messages":[{"role":"system","content":"You are a helpful assistant for Acme routers."},{"role":"user","content":"What is the capital of France?"}]}'
printf '%s' "$body" > "$dir/body.json"
for bin in "$@"; do
  name=$(basename "$bin")
  gw=$(free_port)
  cachet_config "$bin" "$key" "$mock" > "$dir/cachet.toml"
  rm -f "$out/callgrind.$name.out"*
  CACHET_USAGE_DB=off valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$out/callgrind.$name.out" \
    "$bin" serve --model smollm2 --config "$dir/cachet.toml" --io-threads 1 \
    --listen "127.0.0.1:$gw" --log-format json 2> "$out/cachet-$name.log" &
  pid=$!
  for _ in $(seq 1 600); do
    curl -sf -o /dev/null -H "authorization: Bearer $key" -d "$body" "127.0.0.1:$gw/v1/chat/completions" && break
    sleep 0.2
  done
  for _ in $(seq 1 200); do
    curl -sf -o /dev/null -H "authorization: Bearer $key" -d "$body" "127.0.0.1:$gw/v1/chat/completions"
  done
  callgrind_control -i on "$pid" > /dev/null 2>&1
  python3 - "$gw" "$reqs" "$dir/body.json" "$key" <<'PY'
import socket, sys
port, n, body, key = int(sys.argv[1]), int(sys.argv[2]), open(sys.argv[3], "rb").read(), sys.argv[4]
req = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
       b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (key.encode(), len(body))) + body
s = socket.create_connection(("127.0.0.1", port))
for _ in range(n):
    s.sendall(req)
    buf = b""
    while True:
        buf += s.recv(65536)
        if b"\r\n\r\n" in buf:
            head, rest = buf.split(b"\r\n\r\n", 1)
            assert head.startswith(b"HTTP/1.1 200"), head
            cl = [int(l.split(b":")[1]) for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")]
            if cl and len(rest) >= cl[0]:
                break
PY
  callgrind_control -d "$pid" > /dev/null 2>&1
  callgrind_control -i off "$pid" > /dev/null 2>&1
  sleep 1
  kill "$pid"; wait "$pid" 2>/dev/null || true
  # The dump taken after the counted requests (the file written at exit holds the rest).
  ir=$(awk '/^totals:/ {print $2}' "$out/callgrind.$name.out.1")
  python3 -c "print(f'{\"$name\"}: {$ir / $reqs:,.0f} instructions a request ({$reqs} requests)')" | tee -a "$out/report.txt"
done
