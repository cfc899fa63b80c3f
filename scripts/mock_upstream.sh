# Shared by the gateway's cost benchmarks (sourced): a scratch directory ($dir, removed and the
# background jobs killed on exit), `free_port`, a mock
# OpenAI-compatible upstream — nginx returning fixed answers: /v1/chat/completions as JSON,
# /v1/completions as the SSE stream the gateway reads, /v1/models — and `nginx_conf`, which
# writes and starts one nginx (one worker, its own files under $dir) in the background;
# `cachet_config`, a gateway config with the mock as its upstream.
#   source scripts/mock_upstream.sh; mock_upstream PORT; cachet_config BIN KEY PORT > cachet.toml
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
chunk='{"id":"cmpl-1","object":"text_completion","created":1,"model":"smollm2","choices":[{"index":0,"text":"Paris","finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}'
chat='{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"smollm2","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":1,"total_tokens":13}}'
esc() { printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g'; }
nginx_conf() { # name, then the http block's servers
  mkdir -p "$dir/$1"
  cat > "$dir/$1/nginx.conf" <<CONF
worker_processes 1;
pid $dir/$1/nginx.pid;
error_log $dir/$1/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/$1/body; proxy_temp_path $dir/$1/proxy;
  fastcgi_temp_path $dir/$1/fcgi; uwsgi_temp_path $dir/$1/uwsgi; scgi_temp_path $dir/$1/scgi;
  $2
}
CONF
  nginx -c "$dir/$1/nginx.conf" -g 'daemon off;' &
}
models='{"object":"list","data":[{"id":"smollm2","object":"model"}]}'
mock_upstream() { # port
  nginx_conf mock "server {
    listen 127.0.0.1:$1;
    location = /v1/models { default_type application/json; return 200 '$models'; }
    location = /v1/completions { default_type text/event-stream; return 200 \"data: $(esc "$chunk")\n\ndata: [DONE]\n\n\"; }
    location = /v1/chat/completions { default_type application/json; return 200 \"$(esc "$chat")\"; }
  }"
}
# A `cachet serve` config: one tenant with API key KEY, the mock at PORT as its OpenAI upstream.
cachet_config() { # cachet binary, key, port
  cat <<CONF
[[tenant]]
id = "bench"
api_key_sha256 = ["$("$1" tenant hash-key "$2")"]

[[upstream]]
kind = "openai"
url = "http://127.0.0.1:$3"
model = "smollm2"
CONF
}
