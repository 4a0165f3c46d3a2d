#!/usr/bin/env bash
# device-limit: 230
# bench/device/fmerge.sh BIN OUTDIR: the attention decode's rows of several chunks merged by the
# row's last block (LASTSTAND_FP_FMERGE=1, S25) instead of fp_merge_rows_kernel after it (0).
# S21's B = 1 timeline: fp_dec 5.9 us + fp_merge 4.7 us of share an attention layer, the merge
# mostly its handoff. Prediction: B = 1 -2..3 us a layer (10 layers: ~-25 us, -1%), B = 128
# -5..8 us a layer; the same bits (the merge's arithmetic, row by row).
# 1. test_attn_cuda (fp64; graph replay == eager) under 1 and 0; tests/test_gpu_attn_graph.py
# 2. the full synth 35B's decode step (graphs) under 1 and 0, ids compared
. "$(dirname "$0")/lib.sh"
dev_init fmerge 225 "$@"
for f in 1 0; do
    LASTSTAND_FP_FMERGE=$f timeout 60 "$D/tests/test_attn_cuda" >"$OUT/ut$f.log" 2>&1
    echo "test_attn_cuda FMERGE=$f rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut$f.log" | tr '\n' ' ') $(el)"
    grep -E "FAIL|differ|Failure" "$OUT/ut$f.log" | head -5
done
(cd "$(dirname "$D")" && timeout -k 3 80 python3 -m pytest -q tests/test_gpu_attn_graph.py 2>&1 | tail -2)
echo "pytest $(el)"
for b in 1 16 128; do for f in 0 1; do dev_step b$b-$f $b bfloat16 LASTSTAND_FP_FMERGE=$f; done; done
for b in 1 16 128; do
    [ -f "$OUT/b$b-1.out" ] && { cmp -s "$OUT/b$b-1.out" "$OUT/b$b-0.out" && echo "B=$b ids: FMERGE 1 == 0" || echo "B=$b ids DIFFER"; }
done
for f in 0 1; do dev_step c1-$f 1 bfloat16 LASTSTAND_FP_FMERGE=$f; done
echo "done $(el)"
