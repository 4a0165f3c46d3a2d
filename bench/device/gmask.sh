#!/usr/bin/env bash
# device-limit: 150
# bench/device/gmask.sh BIN OUTDIR: constrained decoding sampled on the GPU (task gmask, S9;
# bench/RESULTS.md "Constrained decoding on the GPU (S9)").
# 1. test_sample_cuda (beside BIN: tests/): every form against the host sampler, now with grammar
#    masks and logit_bias rows (smp_row.n_mask / n_bias): greedy tokens, logprobs, top logprobs
#    equal to smp_sample_ex's; draws in the host's kept set; forms agree on 248320-wide rows.
# 2. test_sample_cuda --bench-mask: µs a call of the engine's sampler without edits, with a 150k-
#    and a 500-id mask, with the mask and 3 biases (batch 1 / 16); --bench: the unconstrained
#    forms (compare with RESULTS S8 tidy-R3: the unconstrained path must not get slower).
# 3. tests/test_gpu_grammar.py with LASTSTAND_GRAMMAR_DEVICE=1: constrained rows take the device
#    path (/metrics), the same greedy outputs as a host-path server, schema-valid outputs, a mixed
#    batch.
# 4. bench/device/gmask_tpot.py: TPOT of constrained vs unconstrained requests, host path vs device
#    path, c1 and c16 (1 constrained + 15 unconstrained), synth:qwen3.5-35b-a3b,layers=8 (and,
#    GMASK_40=1, the full 40 layers).
# Reads nothing from ../shared (the demo tokenizer is written by BIN synth).
. "$(dirname "$0")/lib.sh"
dev_init gmask 145 "$@"
export BUILD=$D LS_SHARED=$D
lim() { local l; l=$(left); [ "$l" -lt 5 ] && l=5; echo "$l"; }

T="$D/tests/test_sample_cuda"
echo "== test_sample_cuda $(el)"
timeout 30 "$T" > "$OUT/sample_cuda.log" 2>&1
echo "rc=$? (0: every test passed) $(el)"
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|ERROR|Failure|device .*host|form .* one block|full-vocab|row .*\((fp32|BF16)\)" \
    "$OUT/sample_cuda.log" | head -30
echo "== test_sample_cuda --bench-mask $(el)"
timeout 20 "$T" --bench-mask 2>&1 | tee "$OUT/bench_mask.log" | head -12
echo "== test_sample_cuda --bench (unconstrained forms) $(el)"
timeout 20 "$T" --bench 2>&1 | tee "$OUT/bench.log" | grep -E "tailed" | head -16

echo "== tests/test_gpu_grammar.py (LASTSTAND_GRAMMAR_DEVICE=1 server, a host-path server to compare) $(el)"
LS_GRAMMAR_GPU_DEVICE=1 timeout 70 python3 -m pytest -q -s -p no:cacheprovider -rfEs --durations=4 \
    tests/test_gpu_grammar.py 2>&1 | tee "$OUT/grammar.log" | \
    grep -E "GRAMMAR_|passed|failed|error|Error|assert|SKIP|slowest|[0-9.]+s (call|setup)" | head -40

echo "== TPOT, host path vs device path $(el)"
[ -f "$D/demo-model/config.json" ] || "$BIN" synth --preset demo --out "$D/demo-model" > /dev/null 2>&1
timeout "$(lim)" python3 bench/device/gmask_tpot.py "$BIN" "$D/demo-model" 2>&1 | tee "$OUT/tpot.log" | \
    grep -E "^==|GMASK_|Error|error" | head -20
# the full 40 layers only on request (GMASK_40=1): in R2 its server did not come up within the
# ~88 s the budget had left
if [ "${GMASK_40:-0}" = 1 ]; then
    echo "== TPOT on the full 40 layers, device path then host path $(el)"
    timeout "$(lim)" python3 bench/device/gmask_tpot.py "$BIN" "$D/demo-model" synth:qwen3.5-35b-a3b 1,0 2>&1 | \
        tee "$OUT/tpot40.log" | grep -E "^==|GMASK_|Error|error" | head -20
fi
echo "done $(el)"
