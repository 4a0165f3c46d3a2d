#!/usr/bin/env bash
# `make run`: serve the demo model and print how to talk to it.
#   scripts/run.sh BIN MODEL_DIR [extra serve flags...]
# HOST and PORT (default 127.0.0.1:30000) pick the address.
set -euo pipefail
BIN=${1:-build/laststand}
MODEL=${2:-build/demo-model}
shift $(( $# >= 2 ? 2 : $# ))
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-30000}
NAME=laststand-demo

"$BIN" serve --model-path "$MODEL" --served-model-name "$NAME" --host "$HOST" --port "$PORT" \
    --reasoning-parser qwen3 --tool-call-parser qwen3_coder "$@" &
pid=$!
trap 'kill -TERM $pid 2>/dev/null; wait $pid 2>/dev/null; exit 0' INT TERM

url="http://$HOST:$PORT"
for _ in $(seq 1 600); do
    if ! kill -0 $pid 2>/dev/null; then
        wait $pid; exit $?
    fi
    if curl -sf "$url/health" >/dev/null 2>&1; then break; fi
    sleep 0.2
done

cat <<MSG

laststand is serving the demo model ($NAME: random weights, so its text is noise) at
  $url        (OpenAI API under $url/v1, Prometheus metrics at $url/metrics)

Try:
  curl $url/v1/chat/completions -H 'Content-Type: application/json' -d '{"model": "$NAME", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 32}'

Stop with Ctrl-C.
MSG
wait $pid
