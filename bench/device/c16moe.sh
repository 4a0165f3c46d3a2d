#!/bin/bash
# bench/device/c16moe.sh BIN OUTDIR: the MoE at 9..128 tokens (cuda_grouped_gemm's mid-batch path,
# src/ops/cuda/moe_mid.cu) at the full Qwen3.5-397B's per-GPU shape under --tp 2 (E 512, top-10,
# H 4096, I 512, BF16 shared expert 512: tests/fixtures/moe_shapes/qwen3.5-397b-tp2-rank), the
# full 397B shape (I 1024) and the 35B (E 256, top-8, H 2048, I 512), old vs new in the same run.
# device-limit: 235
# R2 (R1 in bench/RESULTS.md "The MoE at 9..64 tokens at the 397B's shapes"): the defaults now
# have gate/up at H = 4096 with one barrier at 2 blocks an SM and the mid path up to M·k = 2E
# (LASTSTAND_MG_MID4K=1; "old" = LASTSTAND_MG_MID4K=0: R1's base).
# 1. doctor moe cells (fp64 CPU oracle, ✅/❌), M = 8, 9, 16, 32, 64, 96, 128: defaults vs old;
#    MIDALL=1 at M = 128, 192;
# 2. ncu (--clock-control none) of one call's kernels at M = 16 on the rank shape (instructions,
#    stall reasons), defaults;
# 3. pytest tests/test_gpu_moe_grouped.py -k "rank_shape or mid_gemvs" (BUILD=$D LS_SHARED=$D);
# 4. (time left) the 40-layer synth 35B served at c = 16 (c16.sh's plans and engine step),
#    defaults.
# (The four router / top-k / grid opt-ins this script also timed in S11 were deleted, within noise
# of the defaults: bench/RESULTS.md "Deleted in S11 (midclean)".)
. "$(dirname "$0")/lib.sh"
dev_init c16moe 235 "$@"
echo "ncu: ${NCU:-none}"
R397="--model-path tests/fixtures/moe_shapes/qwen3.5-397b-tp2-rank"
F397="--model-path synth:qwen3.5-397b-a17b,layers=1"
S35="--model-path synth:qwen3.5-35b-a3b,layers=1"
OLD="LASTSTAND_MG_MID4K=0"
export XDG_CACHE_HOME="$OUT/cache"

# doc TAG "ENVS" "SRC" MS LIMIT: the doctor's moe rows (cuda_grouped_gemm), prefixed by TAG
doc() {
    local tag=$1 envs=$2 src=$3 ms=$4 t=$5 l
    l=$(( $(left) - 5 )); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 8 ] || { echo "$tag: skipped (time)"; return; }
    env $envs timeout -k 3 "$t" "$BIN" doctor --device cuda --families moe $src --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$OUT/doc-$tag.txt" | cut -c1-60 | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc $(el)"; tail -n 3 "$OUT/doc-$tag.err"; }
}

echo "== 1. doctor moe, rank shape (H 4096 E 512 top-10 I 512, BF16 shared 512) $(el)"
doc r397-def "" "$R397" 8,9,16,32,64,96,128 25
doc r397-old "$OLD" "$R397" 8,9,16,32,64,96,128 25
doc r397-all "LASTSTAND_MG_MIDALL=1" "$R397" 128,192 15
echo "$(el)"

# ncu of one call (8 kernels: router, top-k, plan, side-stream shared gate/up + down, gate/up,
# down, combine) at M = 16, after 10 calls
if [ -n "$NCU" ]; then
    for v in "def:"; do
        [ "$(left)" -gt 150 ] || { echo "ncu ${v%%:*}: skipped (time)"; continue; }
        echo "== 2. ncu r397 M = 16 ${v%%:*} (${v#*:}) $(el)"
        env ${v#*:} timeout -k 3 40 "$NCU" --clock-control none -k regex:'mv_|mvd_|mvb_|mr_|mg_' --launch-skip 80 \
            --launch-count 8 --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
            --section WarpStateStats --metrics dram__bytes_read.sum,smsp__inst_executed.sum \
            "$BIN" doctor --device cuda --families moe $R397 \
            --m 16 --backends cuda_grouped_gemm --trial-timeout 35 >"$OUT/ncu-r397-${v%%:*}.txt" 2>&1
        echo "rc=$? $(el)"
        python3 bench/device/c16_ncu_gd.py "$OUT/ncu-r397-${v%%:*}.txt"
        grep -E "^  [a-z_]+.*\(|smsp__inst_executed.sum|Stall [A-Z]|stalled" "$OUT/ncu-r397-${v%%:*}.txt" | grep -E "mv_kernel|mvd_kernel|inst_exec" | cut -c1-120 | head -8
    done
fi

echo "== 1b. doctor moe, full 397B (I 1024, BF16 shared 1024) and 35B $(el)"
doc f397-def "" "$F397" 8,9,16,32,64,96,128 25
doc f397-old "$OLD" "$F397" 8,9,16,32,64,96,128 25
doc f397-all "LASTSTAND_MG_MIDALL=1" "$F397" 128 15
doc s35-def "" "$S35" 8,9,16,32,64 15

if python3 -c "import pytest" 2>/dev/null; then
    l=$(( $(left) - 3 ))
    [ "$l" -gt 60 ] && l=60
    if [ "$l" -ge 20 ]; then
        echo "== 3. pytest tests/test_gpu_moe_grouped.py -k 'rank_shape or mid_gemvs' (limit ${l}s) $(el)"
        BUILD=$D LS_SHARED=$D timeout -k 3 "$l" python3 -m pytest -q -p no:cacheprovider tests/test_gpu_moe_grouped.py \
            -k "rank_shape or mid_gemvs" 2>&1 | tail -n 6
    else
        echo "pytest: skipped (time)"
    fi
fi

# 4. the 40-layer synth 35B at c = 16 (c16.sh's plans: serve's auto picks, named; CUDA graphs; the
# engine's mean decode step from server.log), defaults, 16 x 1024 in / 128 out
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:16,cuda_cublaslt
       --lm-head-backend cuda_cublaslt --trust-backend)
n=0
for v in "def:"; do
    lim=$(( $(left) - 3 ))
    [ "$lim" -gt 24 ] || { echo "== 4. e2e ${v%%:*}: skipped (time)"; continue; }
    [ "$lim" -gt 38 ] && lim=38
    n=$((n + 1))
    echo "== 4. e2e ${v%%:*}: serve synth 35B (40 layers), CUDA graphs, c = 16, 16 x 1024 in / 128 out ${v#*:} $(el)"
    env ${v#*:} BIN="$BIN" PORT=$((34000 + $$ % 1000 + n)) CONCURRENCY=16 NUM_PROMPTS=16 INPUT_LEN=1024 OUTPUT_LEN=128 \
        WARMUP=1 HEALTH_TIMEOUT=$(( lim - 12 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-${v%%:*}" qwen3.5-35b-a3b -- \
        --device cuda "${PLANS[@]}" >"$OUT/e2e-${v%%:*}.out" 2>&1
    echo "rc=$? $(el)"
    [ -f "$OUT/e2e-${v%%:*}/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TTFT p50 | TPOT p50 ms | TPOT p99 ms | ITL p50 ms" &&
        grep -E "^\| 16 \|" "$OUT/e2e-${v%%:*}/SUMMARY.md" | cut -d'|' -f2,4,6,8,10,11,12 | sed 's/^/  /'
    grep -E "decode steps|checked against|ERROR|error" "$OUT/e2e-${v%%:*}/server.log" 2>/dev/null | cut -c1-200 | tail -3
done
echo "total $(el)"
