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
# the NVFP4 fixture's experts (I = 48) do not split in whole 16-column blocks: --tp 1 only.
# R2 found the GDN models (qwen3_5_moe_text, qwen3_next) off transformers on CUDA while qwen3_moe
# (no GDN) passed: each GDN backend alone, and every family on its reference / simplest backend
# ("ref"), say whether a kernel or the load is at fault.
REF = ["--gemm-backend", "cuda_ref", "--fp4-gemm-backend", "cuda_ref", "--moe-runner-backend", "cuda_expert_loop",
       "--attention-backend", "cuda_naive", "--gdn-backend", "cuda_per_token", "--lm-head-backend", "cuda_ref"]
runs = [("qwen3_5_moe_text", 1, "0", []), ("qwen3_5_moe_text", 1, "0", REF), ("qwen3_5_moe_text", 2, "0", REF),
        ("qwen3_5_moe_text", 2, "0", []), ("qwen3_5_moe_text", 2, "1", [])]
runs += [("qwen3_5_moe_text", 1, "0", ["--gdn-backend", g]) for g in ("cuda_per_token", "cuda_recurrent", "cuda_chunked", "cuda_decode")]
runs += [("qwen3_5_moe_text", 1, "LASTSTAND_GDN_PIECE_ROWS=0", []), ("qwen3_5_moe_text", 1, "LASTSTAND_PREFIX_SNAPSHOT=cut", [])]
runs += [("qwen3_next", 1, "0", []), ("qwen3_next", 1, "0", REF), ("qwen3_next", 2, "0", []),
         ("qwen3_moe", 1, "0", []), ("qwen3_moe", 2, "0", []), ("qwen3_5_moe_text-nvfp4", 1, "0", []),
         ("qwen3_5_moe_text-nvfp4", 1, "0", REF)]
for name, tp, p2p, flags in runs:
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        print(f"  {name}: no fixture at {d}"); continue
    r = json.load(open(os.path.join(d, "ref.json")))
    hf = np.array(r["logits"], dtype=np.float64)
    env = dict(os.environ, LASTSTAND_TP_P2P=p2p if len(p2p) == 1 else "0")
    if "=" in p2p:  # an environment switch of the forward pass instead
        env[p2p.split("=")[0]] = p2p.split("=")[1]
    tag = f"--tp {tp}{' P2P' if p2p == '1' else ''} " + ("ref backends" if flags == REF else " ".join(flags[1:]) or "auto")
    if "=" in p2p:
        tag += " " + p2p
    try:
        p = subprocess.run([BIN, "logits", "--model-path", d, "--ids", ",".join(map(str, r["input_ids"])),
                            "--device", "cuda", "--tp", str(tp), *flags], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {name} {tag}: FAIL timeout"); continue
    if p.returncode:
        print(f"  {name} {tag}: FAIL exit {p.returncode}: {p.stderr.strip().splitlines()[-1][:200]}"); continue
    a = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    rel = (np.abs(a - hf).max(axis=1) / np.abs(hf).max(axis=1))
    agree = (a.argmax(1) == hf.argmax(1)).mean()
    worst = int(rel.argmax())
    print(f"  {name:22s} {tag:34s}: rel {rel.max():.2e} (row {worst} of {len(rel)}; row 0 {rel[0]:.1e}), argmax {agree:.0%}: "
          f"{'PASS' if rel.max() <= 2e-2 else 'FAIL'}")
PY
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
for spec in "1 6" "16 32"; do
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
if [ -n "$NCU" ]; then
    prof tp2 2 80 --devices 0 --kernel-name "regex:^(?!nccl)"
    [ -f "$OUT/ncu-tp2.csv" ] && [ -s "$OUT/ncu-tp2.csv" ] || prof tp1 1 60
else
    echo "== ncu: not found"
fi
echo "== total $(( $(date +%s) - T0 )) s"
