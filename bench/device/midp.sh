#!/usr/bin/env bash
# device-limit: 560
# bench/device/midp.sh BIN OUTDIR: the persistent pipelined mid-batch MoE GEMVs (moe_midp.cu,
# LASTSTAND_MG_MIDP) against the per-tile ones (mv_kernel / mvd_kernel, LASTSTAND_MG_MIDP=0).
# 1. tests/test_gpu_moe_grouped.py -k MIDP_K (the doctor's fp64 verdicts with MIDP on,
#    off and everywhere, NVFP4 / BF16 shared experts, the family shapes).
# 2. `laststand doctor --families moe --backends cuda_grouped_gemm`, one MoE layer: synth 35B and
#    397B (BF16 shared expert beside NVFP4 experts), M = 8 .. 256, MIDP = 0 / 1 / 2 (µs a call).
# 3. `generate --batch B` of the full synth 35B (the plans serve picks): the mean decode step at
#    B = BATCHES (default 64 128 256), MIDP = 0 and the default; the greedy ids of the two compared.
# 4. With NCU (an ncu binary): one eager 8-layer step at B = 128 with the default, kernel table;
#    with NCU_MP=1 instead ncu's sections (speed of light, warp states, scheduler, memory) of
#    mp_kernel's first launches. MIDP_VALS (default 0 1 2) picks the doctor's MIDP values.
. "$(dirname "$0")/lib.sh"
dev_init midp 555 "$@"
B35="synth:qwen3.5-35b-a3b,layers=1"
B397="synth:qwen3.5-397b-a17b,layers=1"

echo "== 1. pytest tests/test_gpu_moe_grouped.py -k MIDP_K $(el)"
l=$(( $(left) - 330 )); [ "$l" -gt 200 ] && l=200
if [ "$l" -ge 30 ]; then
    BUILD=$D timeout -k 5 "$l" python3 -m pytest -q -p no:cacheprovider --timeout 120 \
        tests/test_gpu_moe_grouped.py -k "${MIDP_K:-persistent or midp or default or nop or 35b}" 2>&1 | tail -n 12
else
    echo "skipped (time)"
fi

# doctor TAG ENVS MODEL MS LIMIT: the table's rows prefixed by TAG
doctor() {
    local tag=$1 envs=$2 model=$3 ms=$4 t=$5 l
    l=$(left); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 5 ] || { echo "$tag: skipped (time)"; return; }
    env $envs timeout "$t" "$BIN" doctor --device cuda --families moe --model-path "$model" --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc"; tail -n 4 "$OUT/doc-$tag.err"; }
    grep -E "❌" "$OUT/doc-$tag.txt" | head -3
}
echo "== 2. doctor, one MoE layer $(el)"
MS=8,16,32,64,128,256
for v in ${MIDP_VALS:-0 1 2}; do doctor "35b-p$v" "LASTSTAND_MG_MIDP=$v" "$B35" "$MS" 25; done
[ -n "${NCU_MP:-}" ] && doctor "35b-p1-d2" "LASTSTAND_MG_MIDP=1 LASTSTAND_MG_MIDP_D2=1" "$B35" "$MS" 25
for v in ${MIDP_VALS:-0 1 2}; do doctor "397b-p$v" "LASTSTAND_MG_MIDP=$v" "$B397" 16,32,64,128,192 30; done

PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
gen() { # tag B limit env...
    local tag=$1 b=$2 lim=$3
    shift 3
    [ "$(left)" -gt "$lim" ] || { echo "$tag: skipped (time)"; return; }
    echo "== 3. $tag: synth:qwen3.5-35b-a3b, batch $b, 512 + 65 tokens, CUDA graphs $* $(el)"
    env "$@" timeout -k 3 "$lim" "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" \
        --max-new-tokens 65 --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" >"$OUT/gen-$tag.out" 2>"$OUT/gen-$tag.err"
    echo "rc=$? $(el)"
    grep -E "decode steps of|rror" "$OUT/gen-$tag.err" | cut -c1-200 | head -3
}
for b in ${BATCHES:-64 128 256}; do
    gen "b$b-p0" "$b" 80 LASTSTAND_MG_MIDP=0
    gen "b$b-p1" "$b" 80 LASTSTAND_MG_MIDP=1
    if [ -s "$OUT/gen-b$b-p0.out" ] && [ -s "$OUT/gen-b$b-p1.out" ]; then
        echo "b$b greedy/sampled ids: $(cmp -s "$OUT/gen-b$b-p0.out" "$OUT/gen-b$b-p1.out" && echo identical || echo differ) \
($(wc -l <"$OUT/gen-b$b-p1.out") requests)"
    fi
done

if [ -n "$NCU" ] && [ -n "${NCU_MP:-}" ] && [ "$(left)" -gt 40 ]; then
    ST=""
    for r in barrier long_scoreboard short_scoreboard wait lg_throttle mio_throttle math_pipe_throttle not_selected \
        selected dispatch_stall no_instruction membar tex_throttle drain branch_resolving sleeping misc; do
        ST="$ST,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
    done
    for v in 1 0; do
        echo "== 5. ncu stall reasons, MIDP=$v: synth:qwen3.5-35b-a3b,layers=2 eager, batch 128 $(el)"
        LASTSTAND_MG_MIDP=$v timeout -k 3 60 "$NCU" --clock-control none -k regex:"mp_kernel|mv_kernel|mvd_kernel" -c 2 \
            --metrics "gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__warps_active.avg.per_cycle_active,smsp__issue_active.avg.pct_of_peak_sustained_active$ST" \
            "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=2" --ids "$(ids 64)" --max-new-tokens 2 \
            --ignore-eos --batch 128 --device cuda --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu-mp$v.txt" 2>&1
        echo "rc=$? $(el)"
        grep -E "_kernel<|gpu__time|dram__|inst_executed|warps_active|issue_active|stalled" "$OUT/ncu-mp$v.txt" |
            grep -vE " 0(\.0+)?$" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//; s/\(const mg_expert.*//' | head -60
    done
fi
if [ -n "$NCU" ] && [ -z "${NCU_MP:-}" ] && [ "$(left)" -gt 70 ]; then
    echo "== 4. ncu: synth:qwen3.5-35b-a3b,layers=8 eager, batch 128, 64-token prompts + 3 tokens $(el)"
    timeout -k 3 $(( $(left) - 15 )) "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=8" --ids "$(ids 64)" --max-new-tokens 3 --ignore-eos \
        --batch 128 --device cuda --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu.out" 2>&1
    echo "rc=$? $(el)"
    if [ -f "$OUT/ncu.ncu-rep" ]; then
        timeout 30 "$NCU" --import "$OUT/ncu.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu.csv" 2>/dev/null
        timeout 20 python3 bench/device/decprof_table.py "$OUT/ncu.csv" b128
        rm -f "$OUT/ncu.ncu-rep"
    else
        tail -5 "$OUT/ncu.out"
    fi
fi
echo "done $(el)"
