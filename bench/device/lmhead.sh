#!/usr/bin/env bash
# device-limit: 100
# bench/device/lmhead.sh: the logits tail of a decode step on the H200 (integrator's device
# rounds, notes DEVICE_ROUNDS.md): the wide sampler (sample.cu, a thread-block cluster a row)
# against the one-block sampler, and the lm_head's own plan.
#
#   bash bench/device/lmhead.sh BIN OUTDIR
#
# 1. test_sample_cuda (beside BIN: tests/): every host-oracle test on both forms, then the
#    cluster form against the one-block form on 248320-wide rows (ids, draws, logprobs).
# 2. test_sample_cuda --bench: µs a call of each form (one block, cluster, cluster with 16-byte
#    passes, S6; removed in S8), 248320-wide BF16 rows, batch 1 and 16, greedy and sampled
#    (T 0.7 with top_p 0.9, or top_k 50 and top_p 0.95).
# 3. The engine's mean decode step (`generate`, CUDA graphs, 512-token prompt + 129 tokens) of
#    synth Qwen3.5-35B-A3B (8 layers: the tail is the same as the full model's), cluster (the
#    default since R1) vs one-block sampler (LASTSTAND_SAMPLE_WIDE=0), greedy and T 0.8 seeded:
#    the ids must agree.
# 4. The decode step with the lm_head on cuda_cublaslt vs cuda_gemv (--lm-head-backend
#    cuda_gemv:16,cuda_cublaslt: a named backend must take every M the lm_head may see; the
#    projections keep the cuda_gemv:8,cuda_cublaslt plan); then the full 40-layer model before
#    (one-block sampler, lm_head on the gemm plan) and after (both changes).
# 5. The doctor's lm_head row group (first: its own choice) and gemm rows at --shapes
#    qwen3.5-35b-a3b, M = 1, 16: cuda_ref, cuda_gemv, cuda_cublaslt.
# Each step is bounded by `timeout`; the whole script stays under 100 s.
. "$(dirname "$0")/lib.sh"
dev_init lmhead 95 "$@"
PLANS=("${DEV_PLANS_DECODE[@]}")

echo "== test_sample_cuda $(el)"
if [ -x "$D/tests/test_sample_cuda" ]; then
    timeout -k 3 40 "$D/tests/test_sample_cuda" >"$OUT/test_sample_cuda.log" 2>&1
    echo "rc=$? (0: every test passed) $(el)"
    grep -E "^\[==========\] |PASSED|FAILED|SKIPPED|rror|Assert|chi2" "$OUT/test_sample_cuda.log" | head -24
    echo "== test_sample_cuda --bench $(el)"
    timeout -k 3 20 "$D/tests/test_sample_cuda" --bench >"$OUT/sample_bench.log" 2>&1
    echo "rc=$? $(el)"
    tail -8 "$OUT/sample_bench.log"
else
    echo "missing: $D/tests/test_sample_cuda"
fi

# gen tag preset timeout args...: mean decode step (the engine's "decode steps" line) and the ids
gen() {
    local tag=$1 preset=$2 lim=$3
    shift 3
    env ${GEN_ENV:-} timeout -k 3 "$lim" "$BIN" generate --model-path "synth:$preset" \
        --ids "$(ids 512)" --max-new-tokens 129 --device cuda "${PLANS[@]}" "$@" >"$OUT/gen-$tag.out" 2>&1
    local rc=$?
    printf '  %-16s rc=%d %s | %s\n' "$tag" $rc "$(grep -oE '[0-9]+ decode steps[^|]*ms each' "$OUT/gen-$tag.out" | head -1)" \
        "$(grep -oE '"ids": *\[[0-9, ]{0,60}' "$OUT/gen-$tag.out" | head -1)"
    [ $rc = 0 ] || grep -iE "error|fail" "$OUT/gen-$tag.out" | head -3
}
same_ids() { # tag tag
    local a b
    a=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$1.out" 2>/dev/null)
    b=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$2.out" 2>/dev/null)
    echo "  ids $1 == $2: $([ -n "$a" ] && [ "$a" = "$b" ] && echo yes || echo NO)"
}
L8="qwen3.5-35b-a3b,layers=8"
echo "== decode step, synth 35B 8 layers: the cluster sampler (default) vs one block (LASTSTAND_SAMPLE_WIDE=0) $(el)"
for mode in greedy t08; do
    extra=()
    [ $mode = t08 ] && extra=(--temperature 0.8 --seed 7)
    for w in 1 0; do
        [ "$(left)" -gt 40 ] || { echo "  (skipped: time)"; continue; }
        GEN_ENV="LASTSTAND_SAMPLE_WIDE=$w" gen "$mode-wide$w" "$L8" 20 "${extra[@]}"
    done
    same_ids "$mode-wide1" "$mode-wide0"
done
same_ids t08-vec t08-wide0

echo "== decode step, synth 35B 8 layers: the lm_head on cuda_cublaslt vs cuda_gemv (--lm-head-backend) $(el)"
for lm in cuda_cublaslt cuda_gemv:16,cuda_cublaslt; do
    [ "$(left)" -gt 40 ] || { echo "  (skipped: time)"; continue; }
    gen "lm-${lm%%:*}" "$L8" 20 --lm-head-backend "$lm"
done
same_ids lm-cuda_cublaslt lm-cuda_gemv

echo "== decode step, full synth 35B (40 layers): the logits tail before (one-block sampler, lm_head on" \
     "the projections' cuda_gemv) and after (cluster sampler, lm_head cuda_cublaslt) $(el)"
[ "$(left)" -gt 55 ] && GEN_ENV="LASTSTAND_SAMPLE_WIDE=0" gen l40-before qwen3.5-35b-a3b 30
[ "$(left)" -gt 35 ] && gen l40-after qwen3.5-35b-a3b 30 --lm-head-backend cuda_cublaslt
same_ids l40-before l40-after

if [ "$(left)" -gt 15 ]; then
    echo "== doctor gemm + lm_head at qwen3.5-35b-a3b, M = 1, 16 $(el)"
    timeout -k 3 $(( $(left) - 2 )) "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families lm_head,gemm \
        --m 1,16 --backends cuda_ref,cuda_gemv,cuda_cublaslt --json "$OUT/doctor.json" >"$OUT/doctor.txt" 2>"$OUT/doctor.err"
    echo "rc=$? $(el)"
    grep -E "^(gemm|lm_head) |^ +(1|16) |measured device copy|^  (gemm|lm_head) " "$OUT/doctor.txt" | cut -c1-190 | head -40
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor.err" | head -3
fi
echo "total $(( $(date +%s) - T0 )) s"
