#!/bin/bash
# bench/device/c16moe.sh BIN OUTDIR: the MoE at 9..64 tokens (cuda_grouped_gemm's mid-batch path,
# src/ops/cuda/moe_mid.cu) at the full Qwen3.5-397B's per-GPU shape under --tp 2 (E 512, top-10,
# H 4096, I 512, BF16 shared expert 512: tests/fixtures/moe_shapes/qwen3.5-397b-tp2-rank), the
# full 397B shape (I 1024) and the 35B (E 256, top-8, H 2048, I 512), old vs new in the same run.
# device-limit: 235
# 1. doctor moe cells (fp64 CPU oracle, ✅/❌), M = 8, 9, 16, 32, 64: the defaults ("base") against
#    the new variants (LASTSTAND_MG_MID4K=1: gate/up at H = 4096 with one barrier at 2 blocks an
#    SM, =2: K split over block pairs of 8 warps at 4 blocks an SM; LASTSTAND_MG_MIDR16=1: the
#    router at H = 4096 by 16 warps; MIDALL=1: the mid path at
#    every 16-row tile size, i.e. 397B M = 32, 64 too), each knob alone at M = 16;
# 2. ncu (--clock-control none) of one call's kernels at M = 16 on the rank shape, base and new;
# 3. pytest tests/test_gpu_moe_grouped.py -k "rank_shape or mid_gemvs" (BUILD=$D LS_SHARED=$D).
. "$(dirname "$0")/lib.sh"
dev_init c16moe 235 "$@"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
R397="--model-path tests/fixtures/moe_shapes/qwen3.5-397b-tp2-rank"
F397="--model-path synth:qwen3.5-397b-a17b,layers=1"
S35="--model-path synth:qwen3.5-35b-a3b,layers=1"
NEW="LASTSTAND_MG_MID4K=1 LASTSTAND_MG_MIDR16=1"
NEW2="LASTSTAND_MG_MID4K=2 LASTSTAND_MG_MIDR16=1"
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
doc r397-base "" "$R397" 8,9,16,32,64 25
doc r397-new "$NEW" "$R397" 8,9,16,32,64 25
doc r397-new2 "$NEW2" "$R397" 8,9,16,32,64 25
doc r397-newall "$NEW LASTSTAND_MG_MIDALL=1" "$R397" 32,64 20
doc r397-new2all "$NEW2 LASTSTAND_MG_MIDALL=1" "$R397" 32,64 20
echo "$(el)"

# ncu of one call (8 kernels: router, top-k, plan, side-stream shared gate/up + down, gate/up,
# down, combine) at M = 16, after 10 calls
if [ -n "$NCU" ]; then
    for v in "base:" "new:$NEW" "new2:$NEW2"; do
        [ "$(left)" -gt 110 ] || { echo "ncu ${v%%:*}: skipped (time)"; continue; }
        echo "== 2. ncu r397 M = 16 ${v%%:*} (${v#*:}) $(el)"
        env ${v#*:} timeout -k 3 40 "$NCU" --clock-control none -k regex:'mv_|mvd_|mvb_|mr_|mg_' --launch-skip 80 \
            --launch-count 8 --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
            --section WarpStateStats --metrics dram__bytes_read.sum "$BIN" doctor --device cuda --families moe $R397 \
            --m 16 --backends cuda_grouped_gemm --trial-timeout 35 >"$OUT/ncu-r397-${v%%:*}.txt" 2>&1
        echo "rc=$? $(el)"
        python3 bench/device/c16moe_ncu.py "$OUT/ncu-r397-${v%%:*}.txt"
    done
fi

echo "== 1b. doctor moe, full 397B (I 1024, BF16 shared 1024) and 35B $(el)"
doc f397-base "" "$F397" 8,9,16,32,64 25
doc f397-new "$NEW" "$F397" 8,9,16,32,64 25
doc f397-new2 "$NEW2" "$F397" 8,9,16,32,64 25
doc f397-newall "$NEW LASTSTAND_MG_MIDALL=1" "$F397" 32,64 20
doc f397-new2all "$NEW2 LASTSTAND_MG_MIDALL=1" "$F397" 32,64 20
doc s35-base "" "$S35" 8,9,16,32,64 15
echo "== 1c. each knob alone at M = 16, rank shape; the grouped GEMM (LASTSTAND_MG_MID=0) $(el)"
doc r397-gu4k "LASTSTAND_MG_MID4K=1" "$R397" 16 15
doc r397-r16 "LASTSTAND_MG_MIDR16=1" "$R397" 16 15
doc r397-grouped "LASTSTAND_MG_MID=0" "$R397" 16 15

if python3 -c "import pytest" 2>/dev/null; then
    l=$(( $(left) - 3 ))
    if [ "$l" -ge 20 ]; then
        echo "== 3. pytest tests/test_gpu_moe_grouped.py -k 'rank_shape or mid_gemvs' (limit ${l}s) $(el)"
        BUILD=$D LS_SHARED=$D timeout -k 3 "$l" python3 -m pytest -q -p no:cacheprovider tests/test_gpu_moe_grouped.py \
            -k "rank_shape or mid_gemvs" 2>&1 | tail -n 6
    else
        echo "pytest: skipped (time)"
    fi
fi
echo "total $(el)"
