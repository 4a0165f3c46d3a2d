#!/bin/bash
# bench/device/attnpre.sh: cuda_flash_prefill's head_dim 256 prefill on Hopper wgmma
# (src/ops/cuda/attention_prefill_wg.cu, LASTSTAND_FP_WG=1) against fp_kernel (mma.sync,
# LASTSTAND_FP_WG=0): right (the doctor's fp64 oracle, the GPU pytests) and faster (the doctor's
# times, one causal prompt of 1k-8k tokens; PyTorch SDPA on the same shapes; ncu; 8k TTFT).
# device-limit: 235
#
#   bash bench/device/attnpre.sh BIN OUTDIR
#
# 1. doctor attention cells, 35B (16 q / 2 kv x 256) and 397B (32 / 2 x 256), the new kernel with K/V
#    by TMA (the default) and by cp.async (LASTSTAND_FP_WG_TMA=0) for one prompt: the doctor's mixed
#    batches (M = 1, 16, 512, 3072: decode rows, prefill chunks after prefixes, random pages) and one
#    causal prompt (LASTSTAND_DOCTOR_ATTN_PREFILL=0: M new tokens, no prefix; =1024: after 1024
#    cached) at M = 1024, 2048, 8192; old and new, verdict (fp64, 32 sampled rows) + time + TFLOP/s.
# 2. the peer: torch SDPA BF16 causal, GQA, the same shapes (median of 20, CUDA events).
# 3. ncu of both kernels at the 8192-token prompt (35B): time, tensor pipe, issue, occupancy,
#    registers, shared memory, the top stall reasons.
# 4. pytest tests/test_gpu_prefill.py + tests/test_gpu_attn_graph.py with LASTSTAND_FP_WG=1.
# 5. TTFT of 8192-token prompts, serve synth 35B (40 layers), chunk 8192, old vs new.
. "$(dirname "$0")/lib.sh"
dev_init attnpre 235 "$@"
export NCCL_NVLS_ENABLE=0
PARTS=${PARTS:-12345} # which parts run (diagnostics: a subset)

doc() { # label env shape M-list
    local tag=$1 ev=$2 sh=$3 m=$4 f="$OUT/doctor-$(echo "$1-$3" | tr ' =/,' '____')"
    ( [ -n "$ev" ] && export $ev; timeout 30 "$BIN" doctor --device cuda --shapes $sh --families attention \
        --backends cuda_flash_prefill --m $m --json "$f.json" > "$f.txt" 2> "$f.err" )
    local rc=$?
    python3 - "$f.json" "$tag" "$sh" $rc <<'PY'
import json, sys
p, tag, sh, rc = sys.argv[1:5]
try:
    t = [t for t in json.load(open(p))["tables"] if t["family"] == "attention"][0]
    cells = t["cells"]["cuda_flash_prefill"]
    parts = []
    for m in sorted(cells, key=int):
        c = cells[m]
        ms = c.get("ms") or 0
        tf = f" {c['tflops']:.1f} TFLOP/s" if c.get("tflops") else ""
        parts.append(f"M={m} {'PASS' if c['status'] == 'ok' else 'FAIL ' + c['status']} {ms * 1e3:.1f} us{tf}"
                     + ("" if c["status"] == "ok" else f" ({c.get('detail', '')[:120]})"))
    print(f"  {tag:34s} {sh[:10]:10s} rc={rc}: " + "; ".join(parts))
except Exception as e:
    print(f"  {tag:34s} {sh[:10]:10s} rc={rc}: no report ({e})")
PY
    [ -s "$f.err" ] && grep -iE "error|crash|wgmma" "$f.err" | head -3 | sed 's/^/    /'
}

# the probe: one 2048-token prompt on the new kernel (a hang or a wrong answer there: the rest runs
# the old kernel only)
LASTSTAND_FP_WG=1 LASTSTAND_DOCTOR_ATTN_PREFILL=0 timeout 25 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b \
    --families attention --backends cuda_flash_prefill --m 2048 --json "$OUT/probe.json" >"$OUT/probe.txt" 2>&1
echo "== 0. probe rc=$?: $(grep -oE '"status": *"[a-z]+"' "$OUT/probe.json" 2>/dev/null | head -1) $(el)"
NEWBAD=0
if ! grep -qE '"status": *"ok"' "$OUT/probe.json" 2>/dev/null; then
    grep -iE "error|crash|wrong|mismatch" "$OUT/probe.txt" | head -3 | cut -c1-200
    # K/V by cp.async instead of TMA: kept for the rest when it passes
    LASTSTAND_FP_WG=1 LASTSTAND_FP_WG_TMA=0 LASTSTAND_DOCTOR_ATTN_PREFILL=0 timeout 25 "$BIN" doctor --device cuda \
        --shapes qwen3.5-35b-a3b --families attention --backends cuda_flash_prefill --m 2048 \
        --json "$OUT/probe0.json" >"$OUT/probe0.txt" 2>&1
    echo "   probe with LASTSTAND_FP_WG_TMA=0: $(grep -oE '"status": *"[a-z]+"' "$OUT/probe0.json" 2>/dev/null | head -1)"
    if grep -qE '"status": *"ok"' "$OUT/probe0.json" 2>/dev/null; then export LASTSTAND_FP_WG_TMA=0; else NEWBAD=1; fi
fi
WGS="0 1"
[ $NEWBAD = 1 ] && { WGS=0; echo "  the new kernel failed the probe: only FP_WG=0 below"; }
[[ $PARTS == *1* ]] && echo "== 1. doctor attention cells, cuda_flash_prefill, old (FP_WG=0) vs new (FP_WG=1) $(el)"
[[ $PARTS == *1* ]] && for sh in qwen3.5-35b-a3b qwen3.5-397b-a17b; do
    for wg in $WGS; do
        doc "mixed, FP_WG=$wg" "LASTSTAND_FP_WG=$wg" $sh 1,16,512,3072
    done
    for wg in $WGS; do
        doc "one prompt, FP_WG=$wg" "LASTSTAND_FP_WG=$wg LASTSTAND_DOCTOR_ATTN_PREFILL=0" $sh 1024,2048,8192
    done
    [ $NEWBAD = 0 ] && doc "one prompt, FP_WG=1, TMA=0" \
        "LASTSTAND_FP_WG=1 LASTSTAND_FP_WG_TMA=0 LASTSTAND_DOCTOR_ATTN_PREFILL=0" $sh 1024,2048,8192
    for wg in $WGS; do
        doc "prompt after 1024, FP_WG=$wg" "LASTSTAND_FP_WG=$wg LASTSTAND_DOCTOR_ATTN_PREFILL=1024" $sh 100,2048
    done
done

[[ $PARTS == *2* ]] && echo "== 2. peer: torch SDPA, BF16, causal, GQA $(el)" &&
timeout -k 3 40 python3 - <<'PY' 2>&1 | tail -n 12
import torch, torch.nn.functional as F
def timeit(fn, reps=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    ts.sort(); return ts[len(ts) // 2]
print(f"  torch {torch.__version__}")
for nh, nkv in ((16, 2), (32, 2)):
    for S in (1024, 2048, 8192):
        q = torch.randn(1, nh, S, 256, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, nkv, S, 256, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        fl = 4.0 * nh * 256 * S * (S + 1) / 2
        try:
            us = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))
            tag = "gqa"
        except Exception:
            ke, ve = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
            us = timeit(lambda: F.scaled_dot_product_attention(q, ke, ve, is_causal=True))
            tag = "expanded kv"
        print(f"  SDPA {nh} q / {nkv} kv x 256, S = {S:5d} ({tag}): {us:9.1f} us {fl / (us * 1e-6) / 1e12:6.1f} TFLOP/s")
PY

if [[ $PARTS == *3* ]] && [ -n "$NCU" ] && [ "$(left)" -gt 120 ]; then
    echo "== 3. ncu, one 8192-token prompt (35B shape), the new kernel $(el)"
    for wg in ${NCU_WGS:-1}; do # fp_kernel's profile is in R1's log
        k=fp_kernel; [ $wg = 1 ] && k=fw_kernel
        LASTSTAND_FP_WG=$wg LASTSTAND_DOCTOR_ATTN_PREFILL=0 timeout -k 3 45 "$NCU" --clock-control none \
            -k regex:$k --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
            --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum \
            "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families attention --backends cuda_flash_prefill \
            --m 8192 > "$OUT/ncu-$k.txt" 2>&1
        echo "  $k: rc=$?"
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Dynamic Shared|Achieved Occupancy|Theoretical Occupancy|hmma_cycles|gmma|Warp Cycles Per Issued|Block Size|Grid Size" \
            "$OUT/ncu-$k.txt" | head -16 | sed 's/^ */    /'
        grep -E "Stall|stall" "$OUT/ncu-$k.txt" | head -4 | cut -c1-200 | sed 's/^ */    /'
    done
fi

PLANS=("${DEV_PLANS_PREFILL[@]}")
PORT=$((35000 + $$ % 2000))
[[ $PARTS == *5* ]] && for wg in $WGS; do
    [ "$(left)" -gt 45 ] || { echo "== 5. ttft FP_WG=$wg: skipped (time)"; continue; }
    echo "== 5. ttft: serve synth 35B (40 layers), chunk 8192, prefix cache off, LASTSTAND_FP_WG=$wg; c = 1 $(el)"
    LASTSTAND_FP_WG=$wg "$BIN" serve --model-path synth:qwen3.5-35b-a3b --host 127.0.0.1 --port $PORT --device cuda \
        "${PLANS[@]}" --trust-backend --prefix-cache off --max-running-requests 4 --context-length 16384 \
        --chunked-prefill-size 8192 >"$OUT/serve-$wg.log" 2>&1 &
    spid=$!
    t1=$(date +%s)
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ]; do
        if ! kill -0 $spid 2>/dev/null || [ $(( $(date +%s) - t1 )) -gt 40 ]; then
            echo "  server not healthy after $(( $(date +%s) - t1 )) s"; tail -3 "$OUT/serve-$wg.log"; break
        fi
        sleep 0.5
    done
    for len in 1024 2048 4096 8192; do
        timeout -k 3 25 "$BIN" bench --base-url "http://127.0.0.1:$PORT" --backend openai --num-prompts 3 \
            --random-input-len $len --random-output-len 1 --random-range-ratio 1.0 --max-concurrency 1 \
            --warmup-requests 1 --extra-request-body '{"logprobs":0}' --output-file "$OUT/bench-$wg-$len.jsonl" \
            >"$OUT/bench-$wg-$len.txt" 2>&1
        python3 - "$OUT/bench-$wg-$len.jsonl" $wg $len <<'PY'
import json, sys
p, wg, n = sys.argv[1:4]
try:
    r = json.loads(open(p).read().splitlines()[-1])
    print(f"  FP_WG={wg} prompt {n:>5s}: TTFT median {r['median_ttft_ms']:8.1f} ms  mean {r['mean_ttft_ms']:8.1f}  "
          f"max {r['max_ttft_ms']:8.1f}  ok {r['completed']}/{r['completed'] + r['failed']}")
except Exception as err:
    print(f"  FP_WG={wg} prompt {n}: no result ({err})")
PY
    done
    grep -E "wgmma kernel|no sm_90a" "$OUT/serve-$wg.log" | head -2 | cut -c1-200
    kill -TERM $spid 2>/dev/null
    for _ in $(seq 50); do kill -0 $spid 2>/dev/null || break; sleep 0.2; done
    kill -KILL $spid 2>/dev/null
    wait $spid 2>/dev/null
done
if [[ $PARTS == *4* ]] && [ "$(left)" -gt 30 ] && python3 -c "import pytest" 2>/dev/null; then
    echo "== 4. pytest test_gpu_prefill.py test_gpu_attn_graph.py, LASTSTAND_FP_WG=1 $(el)"
    LASTSTAND_FP_WG=1 BUILD=$D LS_SHARED=$D timeout -k 3 $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider \
        -rfE -k "flash_prefill or graph" tests/test_gpu_prefill.py tests/test_gpu_attn_graph.py 2>&1 | grep -vE "^\s*$" | tail -12
    echo "rc=$? $(el)"
fi

echo "total $(( $(date +%s) - T0 )) s"
