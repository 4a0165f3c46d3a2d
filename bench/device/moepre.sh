#!/bin/bash
# bench/device/moepre.sh: the NVFP4 grouped MoE GEMMs of prefill (cuda_grouped_gemm at 64-row
# tiles, src/ops/cuda/moe_wgmma.cu) on Hopper: mw_kernel (LASTSTAND_MG_WGMMA2=0, S9's) against
# m2_kernel (LASTSTAND_MG_WGMMA2=1: up to 256 tokens a CTA, the weights decoded straight into
# wgmma's A registers), for the integrator's device rounds.
# device-limit: 240
#
#   bash bench/device/moepre.sh BIN OUTDIR
#
# 1. doctor moe (fp64 CPU oracle on sampled tokens, every cell checked) at the 35B shapes
#    (--shapes qwen3.5-35b-a3b: NVFP4 shared expert in the same launches) M = 512, 2048, 8192,
#    old vs new; the 397B shapes M = 2048, 8192 old vs new; the padding case (M = 100, 64-row
#    tiles forced) and M = 3001 new; new with static unit scheduling (LASTSTAND_MG_WGMMA2_DYN=0)
#    at M = 2048, 8192. TFLOP/s of the MoE call from the doctor's time.
#    On a new-path failure: compute-sanitizer memcheck of the doctor at M = 512.
# 2. ncu of the GEMM kernels at the 35B shapes, M = 8192 (one gate/up + one down launch each,
#    old and new): duration, SOL, pipes, issue, warp stalls, occupancy, registers, shared memory.
#    synth 35B (BF16 shared expert on the side stream) at M = 2048, 8192: the shared expert's tiles
#    on mg_gemm_kernel vs m2_kernel's BF16 form (LASTSTAND_MG_WGMMA2_SH=1).
# 3. 8k TTFT: serve synth:qwen3.5-35b-a3b (40 layers, prefill8k.sh's plans), 4096- and
#    8192-token prompts, old vs new (both switches).
# 4. tests/test_gpu_moe_wgmma.py with the new kernel (time left permitting).
. "$(dirname "$0")/lib.sh"
dev_init moepre 235 "$@"
export NCCL_NVLS_ENABLE=0
OLD="LASTSTAND_MG_WGMMA2=0"
NEW="LASTSTAND_MG_WGMMA2=1"
NEWSH="LASTSTAND_MG_WGMMA2=1 LASTSTAND_MG_WGMMA2_SH=1"

# doctor TAG ENVS PRESET MS MAXS (PRESET: a --shapes preset, or synth:... for --model-path)
doctor() {
    local tag=$1 envs=$2 preset=$3 ms=$4 t=$5 l rc src
    l=$(( $(left) - 5 )); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 8 ] || { echo "$tag: skipped (time)"; return 1; }
    case $preset in synth:*) src=--model-path ;; *) src=--shapes ;; esac
    env $envs timeout -k 2 "$t" "$BIN" doctor --device cuda --families moe $src "$preset" --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    rc=$?
    grep -E "^moe|^ +M |^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    grep -iE "wgmma kernels|error|fault|illegal" "$OUT/doc-$tag.err" | head -3 | cut -c1-250
    [ $rc -ne 0 ] && { echo "$tag rc=$rc $(el)"; tail -n 4 "$OUT/doc-$tag.err" | cut -c1-250; }
    ! grep -q "❌" "$OUT/doc-$tag.txt" && [ $rc -eq 0 ]
}

echo "== 1. doctor moe, old (mw_kernel) vs new (m2_kernel, forced at every M: MINROWS=0) $(el)"
NEW0="$NEW LASTSTAND_MG_WGMMA2_MINROWS=0"
doctor old35 "$OLD" qwen3.5-35b-a3b 512,2048,4096,8192 30
doctor new35 "$NEW0" qwen3.5-35b-a3b 512,2048,4096,8192 30
ok35=$?
doctor new35st "$NEW0 LASTSTAND_MG_WGMMA2_DYN=0" qwen3.5-35b-a3b 8192 25
doctor new35nd "$NEW0 LASTSTAND_MG_WGMMA2_DEFER=0" qwen3.5-35b-a3b 8192 25
doctor new35np "$NEW0 LASTSTAND_MG_WGMMA2_PFU=0" qwen3.5-35b-a3b 8192 25
doctor old397 "$OLD" qwen3.5-397b-a17b 8192 35
doctor new397 "$NEW0" qwen3.5-397b-a17b 2048,8192 35
ok397=$?
LASTSTAND_GROUPED_BM=64 doctor newpad "$NEW0" qwen3.5-35b-a3b 100,3001 25
okpad=$?
# synth 35B: the BF16 shared expert (its own launches, side stream): on mg_gemm_kernel vs m2_kernel's BF16 form
doctor syn35 "$NEW" "synth:qwen3.5-35b-a3b,layers=1" 8192 25
doctor syn35sh "$NEWSH" "synth:qwen3.5-35b-a3b,layers=1" 2048,8192 25
oksh=$?
echo "new path verdicts: 35B $([ $ok35 = 0 ] && echo PASS || echo FAIL), 397B $([ $ok397 = 0 ] && echo PASS || echo FAIL), padding/3001 $([ $okpad = 0 ] && echo PASS || echo FAIL), BF16 shared $([ $oksh = 0 ] && echo PASS || echo FAIL)"
# the routed GEMMs' FLOPs: M·k·(3·2·H·I); 35B H 2048 I 512 k 8 (+ shared 512 over M), 397B H 4096 I 1024 k 10 (+ shared 1024)
python3 - "$OUT" <<'PY'
import re, sys, glob, os
fl = {"35": (2048, 512, 8, 512), "397": (4096, 1024, 10, 1024)}
for tag in ("old35", "new35", "new35st", "new35nd", "new35np", "old397", "new397", "syn35", "syn35sh"):
    p = os.path.join(sys.argv[1], f"doc-{tag}.txt")
    if not os.path.exists(p):
        continue
    H, I, k, Ish = fl["397" if "397" in tag else "35"]
    for ln in open(p):
        m = re.match(r"\s+(\d+)\s+\S+\s+([\d.]+) (µs|ms)", ln)
        if m:
            M = int(m.group(1)); t = float(m.group(2)) * (1e-6 if m.group(3) == "µs" else 1e-3)
            f = M * (k * 6 * H * I + 6 * H * Ish)
            print(f"  {tag:7s} M {M:5d}  {t*1e3:8.3f} ms  MoE call {f/t/1e12:6.1f} TFLOP/s (routed + shared FLOPs)")
PY
if [ $ok35 != 0 ] && command -v compute-sanitizer >/dev/null && [ "$(left)" -gt 100 ]; then
    echo "== memcheck: doctor new path, 35B shapes, M = 512 $(el)"
    env $NEW timeout -k 2 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" doctor --device cuda \
        --families moe --shapes qwen3.5-35b-a3b --m 512 --backends cuda_grouped_gemm --trial-timeout 40 \
        >"$OUT/memcheck.txt" 2>&1
    echo "rc=$? $(el)"
    grep -E "Invalid|Error|at 0x|by thread|m2_kernel" "$OUT/memcheck.txt" | head -12 | cut -c1-250
fi

if [ -n "$NCU" ]; then
    for v in "new:$NEW:m2_kernel"; do
        tag=${v%%:*}; rest=${v#*:}; envs=${rest%%:*}; kre=${rest#*:}
        [ "$(left)" -gt 120 ] || { echo "ncu $tag: skipped (time)"; continue; }
        echo "== 2. ncu $tag ($kre), 35B shapes, M = 8192, gate/up then down $(el)"
        env $envs timeout -k 2 35 "$NCU" --clock-control none -k regex:"$kre" --launch-count 2 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
            --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
            --section InstructionStats -o "$OUT/ncu-$tag" \
            "$BIN" doctor --device cuda --families moe --shapes qwen3.5-35b-a3b --m 8192 \
            --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/ncu-$tag.txt" 2>&1
        echo "rc=$? $(el)"
        grep -E "==ERROR|==WARNING" "$OUT/ncu-$tag.txt" | head -3 | cut -c1-200
        if [ -f "$OUT/ncu-$tag.ncu-rep" ]; then
            timeout 20 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
                >"$OUT/ncu-$tag.csv" 2>/dev/null
            # FLOPs of one gate/up and one down launch at M = 8192 (routed + the NVFP4 shared expert: 73728 rows)
            timeout 20 python3 bench/device/moepre_ncu.py "$OUT/ncu-$tag.csv" 309237645312 154618822656 2>&1 | head -30
            timeout 20 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --page details --print-rule-details 2>/dev/null |
                grep -iE "stall|pipe|bank|bottleneck|theoretical" | cut -c1-230 | head -14
        fi
    done
fi

# 3. TTFT (prefill8k.sh's serve / bench)
PLANS=("${DEV_PLANS_PREFILL[@]}")
PORT=$((36000 + $$ % 2000))
for v in "new:$NEWSH" "newnosh:$NEW" "old:$OLD"; do
    tag=${v%%:*}; envs=${v#*:}
    [ "$(left)" -gt 55 ] || { echo "ttft $tag: skipped (time)"; continue; }
    echo "== 3. ttft $tag ($envs LASTSTAND_GDN_WY=1): serve synth 35B (40 layers), chunk 8192, prefix cache off $(el)"
    env $envs LASTSTAND_GDN_WY=1 "$BIN" serve --model-path synth:qwen3.5-35b-a3b --host 127.0.0.1 --port $PORT \
        --device cuda "${PLANS[@]}" --trust-backend --prefix-cache off --max-running-requests 4 \
        --context-length 16384 --chunked-prefill-size 8192 >"$OUT/serve-$tag.log" 2>&1 &
    spid=$!
    t1=$(date +%s)
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")" = 200 ]; do
        if ! kill -0 $spid 2>/dev/null || [ $(( $(date +%s) - t1 )) -gt 40 ]; then
            echo "server not healthy after $(( $(date +%s) - t1 )) s"; tail -5 "$OUT/serve-$tag.log"; break
        fi
        sleep 0.5
    done
    echo "healthy after $(( $(date +%s) - t1 )) s"
    for len in 4096 8192; do
        timeout -k 3 25 "$BIN" bench --base-url "http://127.0.0.1:$PORT" --backend openai --num-prompts 3 \
            --random-input-len $len --random-output-len 1 --random-range-ratio 1.0 --max-concurrency 1 \
            --warmup-requests 1 --extra-request-body '{"logprobs":0}' --output-file "$OUT/bench-$tag-$len.jsonl" \
            >"$OUT/bench-$tag-$len.txt" 2>&1
        rc=$?
        python3 - "$OUT/bench-$tag-$len.jsonl" $tag $len $rc <<'PY'
import json, sys
p, tag, n, rc = sys.argv[1:5]
try:
    r = json.loads(open(p).read().splitlines()[-1])
    med = r["median_ttft_ms"]
    print(f"  ttft {tag:3s} prompt {n:>5s}  TTFT median {med:8.1f} ms  mean {r['mean_ttft_ms']:8.1f}  max {r['max_ttft_ms']:8.1f}"
          f"  ({int(n) / (med / 1e3):7.0f} prompt tok/s)  ok {r['completed']}/{r['completed'] + r['failed']}")
except Exception as err:
    print(f"  ttft {tag} prompt {n}: bench rc {rc}, no result ({err})")
PY
    done
    kill -TERM $spid 2>/dev/null
    for _ in $(seq 50); do kill -0 $spid 2>/dev/null || break; sleep 0.2; done
    kill -KILL $spid 2>/dev/null
    wait $spid 2>/dev/null
    grep -E "wgmma|ERROR|error" "$OUT/serve-$tag.log" | cut -c1-220 | head -3
done

if [ "$(left)" -gt 30 ] && python3 -c "import pytest" 2>/dev/null; then
    echo "== 4. pytest tests/test_gpu_moe_wgmma.py (its m2 cases force m2_kernel) $(el)"
    env BUILD=$D LS_SHARED=$D timeout -k 3 $(( $(left) - 5 )) python3 -m pytest -q -p no:cacheprovider -rfE \
        tests/test_gpu_moe_wgmma.py 2>&1 | grep -vE "^\s*$" | tail -12
    echo "rc=$? $(el)"
fi
echo "total $(( $(date +%s) - T0 )) s"
