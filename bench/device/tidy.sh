#!/usr/bin/env bash
# device-limit: 90
# bench/device/tidy.sh: the sampler's sampled row (sample.cu; task tidy, RESULTS "Sampling: (S8)")
# and the GPU tests of S8's deletions, for the integrator's device rounds (notes DEVICE_ROUNDS.md).
#
#   bash bench/device/tidy.sh BIN OUTDIR
#
# 1. test_sample_cuda (beside BIN: tests/): every host-oracle case on every form (one block; a
#    cluster with the row in global memory or, LASTSTAND_SAMPLE_SM=1, each block's share of it in
#    shared memory; each without and with the top_k / top logprobs bound from the widen's warp
#    maxima, LASTSTAND_SAMPLE_LB), their kept sets / seeded tokens against the one-block form
#    and the host.
# 2. test_sample_cuda --bench: µs a call, 248320-wide BF16 rows, batch 1 and 16, those four forms.
# 3. test_sample_cuda --phases: the shared-memory form's phase times (clock64 stamps) of one row,
#    without and with the bound.
# 4. test_gemv_cuda, test_gdn_decode_cuda (after S8's deletions in gemv.cu).
# 5. The engine's mean decode step (`generate`, CUDA graphs, 512-token prompt + 129 tokens) of
#    synth Qwen3.5-35B-A3B, 8 layers, seeded T 0.7 top_k 20 top_p 0.95 and T 0.7 top_p 0.9: S7's
#    form (LASTSTAND_SAMPLE_LB=0 LASTSTAND_SAMPLE_SM=0), the defaults (the bound, the row in shared
#    memory up to 8 rows), LASTSTAND_SAMPLE_SM=0 (the ids must agree), and greedy.
# Each step is bounded by `timeout`; the whole script stays under 90 s.
. "$(dirname "$0")/lib.sh"
dev_init tidy 86 "$@"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt
       --lm-head-backend cuda_cublaslt)
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }

T="$D/tests/test_sample_cuda"
echo "== test_sample_cuda $(el)"
if [ -x "$T" ]; then
    timeout -k 3 40 "$T" >"$OUT/test_sample_cuda.log" 2>&1
    echo "rc=$? (0: every test passed) $(el)"
    grep -E "^\[==========\] Running|^\[  (PASSED|FAILED) |SKIPPED|rror|Assert|failure|row [0-9]+:|not in the host" \
        "$OUT/test_sample_cuda.log" | head -40
    echo "== test_sample_cuda --bench $(el)"
    timeout -k 3 25 "$T" --bench >"$OUT/sample_bench.log" 2>&1
    echo "rc=$? $(el)"
    cut -c1-300 "$OUT/sample_bench.log" | tail -34
    echo "== test_sample_cuda --phases $(el)"
    timeout -k 3 10 "$T" --phases >"$OUT/sample_phases.log" 2>&1
    echo "rc=$? $(el)"
    cut -c1-400 "$OUT/sample_phases.log" | tail -14
else
    echo "missing: $T"
fi

for t in test_gemv_cuda test_gdn_decode_cuda; do
    echo "== cmocka $t $(el)"
    if [ -x "$D/tests/$t" ]; then
        timeout -k 3 30 "$D/tests/$t" >"$OUT/$t.log" 2>&1
        echo "rc=$? (0: every test passed) $(el)"
        grep -E "^\[  (PASSED|FAILED) |SKIPPED|differs|rror|skipping" "$OUT/$t.log" | head -6
    else
        echo "missing: $D/tests/$t"
    fi
done

# gen tag timeout args...: mean decode step (the engine's "decode steps" line) and the ids
gen() {
    local tag=$1 lim=$2
    shift 2
    env ${GEN_ENV:-} timeout -k 3 "$lim" "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=8" \
        --ids "$(ids 512)" --max-new-tokens 129 --device cuda "${PLANS[@]}" "$@" >"$OUT/gen-$tag.out" 2>&1
    local rc=$?
    printf '  %-12s rc=%d %s | %s\n' "$tag" $rc "$(grep -oE '[0-9]+ decode steps[^|]*ms each' "$OUT/gen-$tag.out" | head -1)" \
        "$(grep -oE '"ids": *\[[0-9, ]{0,60}' "$OUT/gen-$tag.out" | head -1)"
    [ $rc = 0 ] || grep -iE "error|fail" "$OUT/gen-$tag.out" | head -3
}
same_ids() { # tag tag
    local a b
    a=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$1.out" 2>/dev/null)
    b=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$2.out" 2>/dev/null)
    echo "  ids $1 == $2: $([ -n "$a" ] && [ "$a" = "$b" ] && echo yes || echo NO)"
}
echo "== decode step, synth 35B 8 layers: before S8 (LB=0 SM=0), the default (LB, SM), SM=0 $(el)"
for f in old def sm0; do
    [ "$(left)" -gt 12 ] || { echo "  (skipped: time)"; continue; }
    env=""
    [ $f = old ] && env="LASTSTAND_SAMPLE_LB=0 LASTSTAND_SAMPLE_SM=0"
    [ $f = sm0 ] && env="LASTSTAND_SAMPLE_SM=0"
    GEN_ENV="$env" gen "k20p95-$f" 20 --temperature 0.7 --top-k 20 --top-p 0.95 --seed 7
done
same_ids k20p95-old k20p95-def
same_ids k20p95-old k20p95-sm0
for f in old def; do
    [ "$(left)" -gt 12 ] || { echo "  (skipped: time)"; continue; }
    GEN_ENV="$([ $f = old ] && echo LASTSTAND_SAMPLE_LB=0 LASTSTAND_SAMPLE_SM=0)" gen "p90-$f" 20 --temperature 0.7 --top-p 0.9 --seed 11
done
same_ids p90-old p90-def
grep -h "row stays in global memory" "$OUT"/gen-*.out | sort -u | head -2
[ "$(left)" -gt 12 ] && gen greedy 20
echo "total $(( $(date +%s) - T0 )) s"
