#!/bin/bash
# bench/device/flagship.sh BIN OUTDIR: the full-size Qwen3.5-397B-A17B (synth: all 60 layers,
# random weights with the real shapes, NVFP4 experts, ~237 GB) served over two H200s with
# --tp 2 (DEVICE_ROUNDS.md protocol; needs 2 GPUs and ~16 GB of host RAM).
# device-limit: 420
#
#   bash bench/device/flagship.sh BIN OUTDIR
#   env: FLAG_LAYERS=N  serve synth:qwen3.5-397b-a17b,layers=N instead of all 60
#        FLAG_EXTRA="..." extra serve flags
#
# Prints: the GPUs and their memory before; `serve --tp 2` start-up with every backend flag on
# auto (doctor, smoke test at 8 layers, the streamed load's phases, the per-GPU memory plan,
# CUDA graph capture) and the seconds of each phase; per-GPU memory used once healthy (and a
# sample every 15 s while it starts, so a start that runs out of memory shows where);
# `laststand bench` at concurrency 1 (4 prompts) and 16 (16 prompts), 1024 in / 128 out; the
# engine's mean decode step from its shutdown line. If the server never becomes healthy, its
# log tail (the exact error) is printed.
set -u
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUT=$2
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
T0=$(date +%s)
n_gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "${n_gpu:-0}" -lt 2 ]; then echo "SKIP: flagship needs 2 GPUs; nvidia-smi -L lists ${n_gpu:-0}"; exit 0; fi
export LD_LIBRARY_PATH="$(dirname "$BIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 XDG_CACHE_HOME="$OUT/cache"
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2'; then
    nd=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    if [ -n "$nd" ] && [ -f "$nd/libnccl.so.2" ]; then export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nd"; echo "libnccl.so.2 from $nd"; fi
fi
MODEL="synth:qwen3.5-397b-a17b${FLAG_LAYERS:+,layers=$FLAG_LAYERS}"
PORT=$((33000 + $$ % 2000)); URL=http://127.0.0.1:$PORT
echo "== GPUs before"
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv,noheader
echo "== host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2" GB RAM, "$7" GB available"}')"
echo "== the memory plan from the config alone (serve --dry-run)"
"$BIN" serve --model-path "$MODEL" --tp 2 --device cuda --dry-run --max-running-requests 16 --context-length 8192 \
    ${FLAG_EXTRA:-} 2>&1 | tail -12

SERVE=("$BIN" serve --model-path "$MODEL" --tp 2 --device cuda --host 127.0.0.1 --port "$PORT"
       --max-running-requests 16 --context-length 8192 ${FLAG_EXTRA:-})
echo "== ${SERVE[*]}"
"${SERVE[@]}" > "$OUT/server.log" 2>&1 &
SPID=$!
( while kill -0 $SPID 2>/dev/null; do
    echo "$(( $(date +%s) - T0 ))s $(nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | paste -sd ' ') host_rss_kb=$(awk '/VmRSS/{print $2}' /proc/$SPID/status 2>/dev/null) host_hwm_kb=$(awk '/VmHWM/{print $2}' /proc/$SPID/status 2>/dev/null)"
    sleep 15; done ) > "$OUT/mem_samples.txt" 2>&1 &
MPID=$!
stop_server() {
    if kill -0 "$SPID" 2>/dev/null; then
        kill -TERM "$SPID" 2>/dev/null
        for _ in $(seq 100); do kill -0 "$SPID" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$SPID" 2>/dev/null
    fi
    wait "$SPID" 2>/dev/null
    kill "$MPID" 2>/dev/null; wait "$MPID" 2>/dev/null
}
trap stop_server EXIT
ok=0; ts=$(date +%s)
while [ $(( $(date +%s) - T0 )) -lt 330 ]; do
    if [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = "200" ]; then ok=1; break; fi
    kill -0 "$SPID" 2>/dev/null || break
    sleep 2
done
echo "== start-up: $([ $ok = 1 ] && echo "healthy after $(( $(date +%s) - ts )) s" || echo "NOT HEALTHY after $(( $(date +%s) - ts )) s")"
grep -E "start-up|load phases|ranks' layers|opened in|layers loaded|of weights|GiB free|loaded in|memory plan|KV pool|prefix cache on|graphs captured|CUDA graphs|doctor|smoke test:|tensor parallel|error|Error|ERROR|warn|WARN" \
    "$OUT/server.log" | cut -c1-300 | head -60
echo "== memory samples (s since start, per GPU MiB used, server host RSS)"
cat "$OUT/mem_samples.txt"
if [ $ok != 1 ]; then
    echo "== the server's log tail"
    tail -40 "$OUT/server.log" | cut -c1-400
    exit 1
fi
echo "== GPUs once healthy"
nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader
echo "== bench"
for spec in "1 4" "16 16"; do
    set -- $spec
    left=$(( 400 - ($(date +%s) - T0) ))
    [ $left -lt 30 ] && { echo "bench c=$1: skipped (${left}s left)"; continue; }
    timeout $left "$BIN" bench --base-url "$URL" --backend openai --num-prompts "$2" --random-input-len 1024 \
        --random-output-len 128 --random-range-ratio 1.0 --max-concurrency "$1" --warmup-requests 1 \
        --extra-request-body '{"logprobs":0}' --output-file "$OUT/bench_c$1.jsonl" 2>&1 | tail -14
done
curl -s "$URL/metrics" > "$OUT/metrics.txt"
stop_server
trap - EXIT
echo "== engine at shutdown"
grep -E "decode steps|steps replayed|prefill" "$OUT/server.log" | tail -4 | cut -c1-300
echo "== total $(( $(date +%s) - T0 )) s"
