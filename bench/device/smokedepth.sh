#!/bin/bash
# bench/device/smokedepth.sh BIN OUTDIR: serve's depth-limited smoke test on the H200.
# device-limit: 200
#   Starts `serve --model-path synth:qwen3.5-35b-a3b,layers=16 --device cuda` (16 layers so the
#   model builds in budget; the smoke test runs the first 8 = 2 of each layer kind), waits for
#   /health (or the server's exit), prints the smoke-test lines, the measured max logits rel err
#   of the chosen combination and "the last backend standing" table, then stops the server.
#   Success: no fast backend eliminated by the smoke test (the full-40-layer run refused them
#   all: BF16 rounding amplification 0.29-0.37 > 0.25), the table shows the doctor's plans.
set -u
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUT=$2
mkdir -p "$OUT/cache"
PORT=$((31000 + $$ % 2000))
LOG="$OUT/server.log"
t0=$(date +%s)
XDG_CACHE_HOME="$OUT/cache" "$BIN" serve --model-path "synth:qwen3.5-35b-a3b,layers=16" --device cuda \
    --port "$PORT" > "$LOG" 2>&1 &
pid=$!
state="timeout"
while [ $(( $(date +%s) - t0 )) -lt 185 ]; do
    if ! kill -0 "$pid" 2>/dev/null; then state="exited"; break; fi
    if grep -q "serving synth" "$LOG" 2>/dev/null; then
        if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
            state="healthy"; break
        fi
    fi
    sleep 1
done
echo "== server: $state after $(( $(date +%s) - t0 )) s"
kill "$pid" 2>/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
echo "== smoke test / doctor lines"
grep -i "smoke\|eliminated\|backend check\|the doctor" "$LOG" | cut -c1-1200
echo "== max logits rel err of the chosen combination"
grep -o "max logits rel err [^ ]* (tolerance [^)]*)" "$LOG" || echo "(no pass line)"
echo "== the table"
awk '/the last backend standing|backend check FAILED/{p=1} p&&/^\[/{print; n++} n>7{exit}' "$LOG" | cut -c1-1500
echo "== refused fast backends (should be none)"
grep -c "smoke test: .* backend .* fails" "$LOG"
echo "== last lines"
tail -5 "$LOG" | cut -c1-600
