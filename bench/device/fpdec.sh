#!/usr/bin/env bash
# device-limit: 240
# bench/device/fpdec.sh BIN OUTDIR: fp_dec_kernel with a row's chunks dealt to ~N blocks an SM
# (LASTSTAND_FP_BPS = N; 0 = a block a chunk, as before S24). S23's timeline: at 110 sequences of
# ~545 keys the attention decode moved 1.27 TB/s (97 us + 10.8 us merge a layer), each block 2 key
# tiles (64-key chunks), so every block paid the load latency once and its pipeline never filled.
# Prediction: BPS=2 at B = 128 ~97 -> ~55 us a layer, the step -0.4 ms; B = 1 unchanged (grid =
# the split count there); the same bits at every BPS (the chunks are the row plan's).
# 1. test_attn_cuda (fp64, graph replay at other contexts bit for bit) at BPS 2 and 1; pytest
#    test_gpu_attn_graph.py (graphs == eager)
# 2. the full synth 35B's decode step per BPS, ids compared across BPS
. "$(dirname "$0")/lib.sh"
dev_init fpdec 235 "$@"
for b in 2 1; do
    LASTSTAND_FP_BPS=$b timeout 60 "$D/tests/test_attn_cuda" >"$OUT/ut$b.log" 2>&1
    echo "test_attn_cuda BPS=$b rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut$b.log" | tr '\n' ' ') $(el)"
    grep -E "FAIL|differ|Failure" "$OUT/ut$b.log" | head -5
done
(cd "$(dirname "$D")" && timeout -k 3 80 python3 -m pytest -q tests/test_gpu_attn_graph.py 2>&1 | tail -2)
echo "pytest $(el)"
for b in 0 2 1 4; do dev_step b128-$b 128 bfloat16 LASTSTAND_FP_BPS=$b; done
for b in 0 2; do dev_step b64-$b 64 bfloat16 LASTSTAND_FP_BPS=$b; done
for b in 0 2; do dev_step b16-$b 16 bfloat16 LASTSTAND_FP_BPS=$b; done
for b in 0 2; do dev_step b1-$b 1 bfloat16 LASTSTAND_FP_BPS=$b; done
for n in b128-2 b128-1 b128-4 b64-2 b16-2 b1-2; do
    o=${n%-*}-0.out
    [ -f "$OUT/$n.out" ] && { cmp -s "$OUT/$n.out" "$OUT/$o" && echo "$n ids == BPS 0" || echo "$n ids DIFFER from BPS 0"; }
done
echo "done $(el)"
