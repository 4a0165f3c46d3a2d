#!/bin/bash
# bench/device/tidy.sh: task tidy (S10): gdn_decode.cu's shared prologue (every form bit for bit as
# before) and gd_kernel_p in 8-warp blocks (LASTSTAND_GDN_P8: a head's row halves on two warps a
# scheduler; R1 measured a prefetch of a task's small inputs instead: no gain, removed), with the GPU
# tests of the files the task moved (test_prefix_cuda).
# device-limit: 240
#
#   bash bench/device/tidy.sh BIN OUTDIR
#
# 1. cmocka test_gdn_decode_cuda: gd_kernel_s / gd_kernel_p == gd_kernel bit for bit (35B, 397B,
#    dk 64, fixture shapes; 1, 6, 0 tokens; fused norm and not; the 16-sequence step), gd_kernel_p
#    with LASTSTAND_GDN_P8=0 and =1; test_prefix_cuda (its fixture setup now shared).
# 2. test_gdn_decode_cuda --bench: µs a call (CUDA events, L2 flushed before each call) of the
#    decode step of 1 / 4 / 8 / 16 / 64 sequences, 35B and 397B shapes: gd_kernel, gd_kernel_p,
#    gd_kernel_p in 8-warp blocks, interleaved; their outputs and states compared.
# 3. ncu (caches flushed) on the wide-step test: gd_kernel_p's 132-block launches, 4 warps
#    (<128, false>) and 8 (<128, true>): duration, occupancy, issue, stalls, DRAM %.
# 4. pytest tests/test_gpu_gdn_decode.py (doctor fp64 cells, fixtures' logits, graphs == eager),
#    with LASTSTAND_GDN_P8=1 (gd_kernel_p runs only at wide steps: the doctor's M = 16, 64 rows mix
#    prompt chunks, so this is mostly the shared prologue's check), and test_gpu_gdn_wy.py
#    (cuda_chunked: the gdn backends' run start is one helper now, gdn_cu.h).
# 5. (time left) the engine's decode step: serve of the 40-layer synth 35B, c = 16 (32 x 1024 in /
#    256 out), CUDA graphs, LASTSTAND_GDN_P8=0 then =1.
. "$(dirname "$0")/lib.sh"
dev_init tidy 236 "$@"
TEST=$D/tests/test_gdn_decode_cuda

# 1. the bitwise tests
for t in test_gdn_decode_cuda test_prefix_cuda; do
    echo "== cmocka $t $(el)"
    if [ -x "$D/tests/$t" ]; then
        LS_SHARED="$D" timeout -k 3 50 "$D/tests/$t" >"$OUT/$t.log" 2>&1
        echo "rc=$? (0: every test passed) $(el)"
        grep -E "^\[  (PASSED|FAILED) |SKIPPED|differs|rror|skipping|vs without|vs from the cut" "$OUT/$t.log" | head -16
    else
        echo "missing: $D/tests/$t"
    fi
done

# 2. the timings, interleaved
if [ -x "$TEST" ]; then
    echo "== test_gdn_decode_cuda --bench $(el)"
    timeout -k 3 40 "$TEST" --bench >"$OUT/bench.log" 2>&1
    echo "rc=$? $(el)"
    cut -c1-300 "$OUT/bench.log" | tail -12
fi

# 3. ncu: gd_kernel_p at 16 sequences, 4 and 8 warps
if [ "$(left)" -gt 100 ]; then
    echo "== ncu: the wide-step test, gd_kernel_p launches (132 blocks: 16 sequences) $(el)"
    dev_ncu_test "$OUT/ncu-gp.txt" 40 gd_kernel_p test_wide_decode_step_equals_the_group_kernel "$TEST" &&
        python3 bench/device/c16_ncu_gd.py <(sed 's/(int)//g; s/(bool)0/false/g; s/(bool)1/true/g' "$OUT/ncu-gp.txt") |
        grep -A1 -E "132x1 x" | grep -v "^--"
else
    echo "== ncu: skipped (time)"
fi

# 4. pytest, LASTSTAND_GDN_P8=1 (test_gpu_gdn_wy.py: cuda_chunked, whose run start is now shared)
if [ "$(left)" -gt 90 ]; then
    echo "== pytest tests/test_gpu_gdn_decode.py tests/test_gpu_gdn_wy.py (LASTSTAND_GDN_P8=1) $(el)"
    BUILD=$D LS_SHARED=$D LASTSTAND_GDN_P8=1 timeout -k 3 70 python3 -u -m pytest -v -p no:cacheprovider \
        -rfEs tests/test_gpu_gdn_decode.py tests/test_gpu_gdn_wy.py >"$OUT/pytest.log" 2>&1
    echo "rc=$? $(el)"
    grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$OUT/pytest.log" | cut -c1-200 | tail -12
fi

# 5. the engine's decode step at c = 16 (40 layers, CUDA graphs), LASTSTAND_GDN_P8=0 / 1
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:16,cuda_cublaslt
       --lm-head-backend cuda_cublaslt --trust-backend)
PORT=$((36000 + $$ % 2000))
n=0
for v in 0 1; do
    lim=$(( $(left) - 3 ))
    [ "$lim" -gt 24 ] || { echo "== e2e LASTSTAND_GDN_P8=$v: skipped (time)"; continue; }
    [ "$lim" -gt 32 ] && lim=32
    n=$((n + 1))
    echo "== e2e LASTSTAND_GDN_P8=$v: serve synth 35B (40 layers), CUDA graphs, c = 16, 32 x 1024 in / 256 out $(el)"
    LASTSTAND_GDN_P8=$v BIN="$BIN" PORT=$((PORT + n)) CONCURRENCY=16 NUM_PROMPTS=32 INPUT_LEN=1024 OUTPUT_LEN=256 \
        WARMUP=1 HEALTH_TIMEOUT=$(( lim - 12 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$v" qwen3.5-35b-a3b -- \
        --device cuda "${PLANS[@]}" >"$OUT/e2e-$v.out" 2>&1
    echo "rc=$? $(el) $(grep -E "startup_s" "$OUT/e2e-$v/meta.txt" 2>/dev/null)"
    E=$OUT/e2e-$v
    [ -f "$E/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TTFT p50 | TPOT p50 ms | TPOT p99 ms | ITL p50 ms" &&
        grep -E "^\| 16 \|" "$E/SUMMARY.md" | cut -d'|' -f2,4,6,8,10,11,12 | sed 's/^/  /'
    grep -E "decode steps of|ERROR|error" "$E/server.log" 2>/dev/null | cut -c1-200 | tail -3
    [ -f "$E/SUMMARY.md" ] || tail -5 "$E.out"
done
echo "total $(( $(date +%s) - T0 )) s"
