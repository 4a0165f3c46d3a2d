#!/bin/bash
# bench/device/flagship.sh BIN OUTDIR: the full-size Qwen3.5-397B-A17B (synth: all 60 layers,
# random weights with the real shapes, NVFP4 experts, ~237 GB) served over two H200s with
# --tp 2 (DEVICE_ROUNDS.md protocol; needs 2 GPUs and ~16 GB of host RAM).
# device-limit: 420
#
#   bash bench/device/flagship.sh BIN OUTDIR
#   reads the fixtures .dev/int/fixtures/models/{qwen3_5_moe_text,qwen3_5_moe_text-nvfp4,qwen3_next,qwen3_moe}
#   (copies of ../shared/fixtures/models; FIX=DIR elsewhere)
#   env: FLAG_LAYERS=N  serve synth:qwen3.5-397b-a17b,layers=N instead of all 60
#        FLAG_EXTRA="..." extra serve flags
#
# Prints: the GPUs and their memory before; `serve --tp 2` start-up with every backend flag on
# auto (doctor, smoke test at 8 layers, the streamed load's phases, the per-GPU memory plan,
# CUDA graph capture) and the seconds of each phase; per-GPU memory used once healthy (and a
# sample every 15 s while it starts, so a start that runs out of memory shows where);
# `laststand bench` at concurrency 1 (6 prompts), 8 (16) and 16 (32), 1024 in / 128 out; the
# engine's mean decode step from its shutdown line. If the server never becomes healthy, its
# log tail (the exact error) is printed. Then ncu over a 4-layer cut's decode step (below).
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
echo "== commit $(git log --oneline -1 2>/dev/null | cut -c1-100)"
echo "== GPUs before"
nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv,noheader
echo "== host: $(nproc) cores, $(free -g | awk '/Mem:/{print $2" GB RAM, "$7" GB available"}')"
echo "== the streamed load on CUDA vs transformers: logits of fixtures (safetensors: views sliced per rank, pages"
echo "   released after each layer) at --tp 1 and --tp 2, max|a-b|/max|b| per row against ref.json (bar 2e-2)"
FIX=${FIX:-.dev/int/fixtures/models}
timeout 150 python3 - "$BIN" "$FIX" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, FIX = sys.argv[1:3]
# the NVFP4 fixture's experts (I = 48) do not split in whole 16-column blocks: --tp 1 only
for name, tps in (("qwen3_5_moe_text", (1, 2)), ("qwen3_next", (1, 2)), ("qwen3_moe", (1, 2)),
                  ("qwen3_5_moe_text-nvfp4", (1,))):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        print(f"  {name}: no fixture at {d}"); continue
    r = json.load(open(os.path.join(d, "ref.json")))
    hf = np.array(r["logits"], dtype=np.float64)
    for tp, p2p in [(t, "0") for t in tps] + ([(2, "1")] if 2 in tps else []):
        env = dict(os.environ, LASTSTAND_TP_P2P=p2p)
        try:
            p = subprocess.run([BIN, "logits", "--model-path", d, "--ids", ",".join(map(str, r["input_ids"])),
                                "--device", "cuda", "--tp", str(tp)], capture_output=True, text=True, timeout=60, env=env)
        except subprocess.TimeoutExpired:
            print(f"  {name} --tp {tp} p2p={p2p}: FAIL timeout (a hung all-reduce?)"); continue
        tag = f"--tp {tp}{' P2P' if p2p == '1' else ''}"
        if p.returncode:
            print(f"  {name} {tag}: FAIL exit {p.returncode}: {p.stderr.strip().splitlines()[-1][:300]}"); continue
        a = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
        rel = (np.abs(a - hf).max(axis=1) / np.abs(hf).max(axis=1)).max()
        agree = (a.argmax(1) == hf.argmax(1)).mean()
        used = " (peer all-reduce on)" if "through peer memory" in p.stderr else (" (P2P NOT USED)" if p2p == "1" else "")
        print(f"  {name:24s} {tag:10s}: rel {rel:.2e}, argmax agrees {agree:.0%}: {'PASS' if rel <= 2e-2 else 'FAIL'}{used}")
PY
# LASTSTAND_TP_P2P=1 (the small all-reduces through peer memory, opt-in) against NCCL: `generate` of
# the 397B cut to 8 layers at --tp 2, 512-token prompt + 65 greedy tokens, CUDA graphs: the engine's
# mean decode step and the ids
echo "== peer all-reduce vs NCCL: generate synth:qwen3.5-397b-a17b,layers=8 --tp 2, 512 + 65 tokens, graphs"
IDS512=$(python3 -c "print(','.join(str(1000+(i*7919)%200000) for i in range(512)))")
for p2p in 0 1 0 1; do
    LASTSTAND_TP_P2P=$p2p timeout 60 "$BIN" generate --model-path synth:qwen3.5-397b-a17b,layers=8 --tp 2 --device cuda \
        --ids "$IDS512" --max-new-tokens 65 > "$OUT/gen-p2p$p2p.out" 2> "$OUT/gen-p2p$p2p.err"
    echo "  p2p=$p2p rc=$? $(grep -oE "[0-9]+ decode steps.*each" "$OUT/gen-p2p$p2p.err" | tail -1) $(grep -oE "through peer memory|CUDA graphs off.*" "$OUT/gen-p2p$p2p.err" | head -1 | cut -c1-120)"
done
cmp -s "$OUT/gen-p2p0.out" "$OUT/gen-p2p1.out" && echo "  ids: p2p == nccl (equal)" || { echo "  ids: DIFFER"; head -c 300 "$OUT/gen-p2p0.out"; echo; head -c 300 "$OUT/gen-p2p1.out"; echo; }
grep -hE "error|rror:" "$OUT"/gen-p2p*.err | head -3
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
while [ $(( $(date +%s) - T0 )) -lt 340 ]; do
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
for spec in "1 6" "8 16" "16 32"; do
    set -- $spec
    left=$(( 300 - ($(date +%s) - T0) ))
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

# Where a decode step's time goes: ncu over `generate` of the model cut to 4 layers (3 GDN + 1
# attention, each with its MoE), eager, a 64-token prompt + 3 new tokens; the last forward is a
# decode step at M = 1. tp2: GPU 0's kernels of --tp 2 (the rank's shapes; NCCL's kernels are not
# profiled, so the all-reduces run as they would); tp1: one GPU, unsplit shapes (the fallback if
# the tp2 profile hangs). decprof_table.py tabulates per kernel name.
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_decode --gdn-backend cuda_decode:16,cuda_chunked --gemm-backend cuda_gemv:8,cuda_cublaslt
       --lm-head-backend cuda_cublaslt)
IDS=$(python3 -c "print(','.join(str(1000+(i*7919)%200000) for i in range(64)))")
prof() { # tag tp limit [ncu flags...]
    local tag=$1 tp=$2 lim=$3; shift 3
    left=$(( 410 - ($(date +%s) - T0) )); [ $lim -gt $left ] && lim=$left
    [ $lim -lt 40 ] && { echo "== ncu $tag: skipped (${left}s left)"; return; }
    echo "== ncu $tag: generate synth:qwen3.5-397b-a17b,layers=4 --tp $tp, eager, 64 + 3 tokens (limit ${lim}s)"
    timeout -k 3 "$lim" "$NCU" --clock-control none --cache-control none "$@" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-$tag" \
        "$BIN" generate --model-path synth:qwen3.5-397b-a17b,layers=4 --tp "$tp" --ids "$IDS" --max-new-tokens 3 \
        --device cuda --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu-$tag.out" 2>&1
    echo "rc=$?"
    grep -E "==ERROR|error:" "$OUT/ncu-$tag.out" | head -3
    if [ -f "$OUT/ncu-$tag.ncu-rep" ]; then
        timeout 30 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$tag.csv" 2>/dev/null
        timeout 20 python3 bench/device/decprof_table.py "$OUT/ncu-$tag.csv" "$tag" | grep -v "^ *[0-9]* [a-zA-Z_]" | head -40
    fi
}
# NCCL all-reduce latency at the decode step's sizes (BF16 [M, 4096], 2 GPUs of one process, as
# model_tp.c calls it), through PyTorch's single-process torch.cuda.nccl, eager and in a CUDA graph
echo "== NCCL all-reduce, 2 GPUs, BF16 [M, 4096] (PyTorch torch.cuda.nccl, one process)"
timeout 60 python3 - <<'PY' 2>&1 | tail -8
import torch, torch.cuda.nccl as nccl
print(f"  torch {torch.__version__}, NCCL {nccl.version()}")
for M in (1, 16, 2048):
    xs = [torch.ones(M, 4096, dtype=torch.bfloat16, device=f"cuda:{d}") for d in (0, 1)]
    for _ in range(20): nccl.all_reduce(xs)
    for d in (0, 1): torch.cuda.synchronize(d)
    n = 200 if M < 2048 else 50
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(0):
        s.record()
        for _ in range(n): nccl.all_reduce(xs)
        e.record()
    for d in (0, 1): torch.cuda.synchronize(d)
    us = s.elapsed_time(e) * 1e3 / n
    print(f"  M = {M:5d} ({M * 8192 / 1024:.0f} KiB): {us:7.1f} us a call (eager, launch included); x 120 a step = {us * 120 / 1e3:.2f} ms")
PY
if [ -n "$NCU" ]; then
    prof tp2 2 90 --devices 0 --kernel-name "regex:^(?!nccl)"
    [ -f "$OUT/ncu-tp2.csv" ] && [ -s "$OUT/ncu-tp2.csv" ] || prof tp1 1 60
else
    echo "== ncu: not found"
fi
echo "== total $(( $(date +%s) - T0 )) s"
