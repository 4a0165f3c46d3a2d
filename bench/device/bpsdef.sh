#!/usr/bin/env bash
# device-limit: 330
# bench/device/bpsdef.sh BIN OUTDIR: the attention decode's blocks a row at the S25 default
# (LASTSTAND_FP_BPS = 4; S24 measured 2 as default and found it 2% slower than 0 at 4000-token
# contexts, B = 64, where 4 was 0.3% faster). Checks the default at the long and short contexts
# against 0 (a block a chunk slot) and 8, ids compared with 0 (the bits are the row plan's at every N):
# test_attn_cuda under the default, then the full synth 35B's decode step (graphs).
. "$(dirname "$0")/lib.sh"
dev_init bpsdef 325 "$@"
timeout 60 "$D/tests/test_attn_cuda" >"$OUT/ut.log" 2>&1
echo "test_attn_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut.log" | tr '\n' ' ') $(el)"
for p in 0 4 8; do dev_lstep L64-$p 64 4000 LASTSTAND_FP_BPS=$p; done
for p in 0 4; do dev_lstep L16-$p 16 4000 LASTSTAND_FP_BPS=$p; done
for p in 0 4 8; do dev_step S128-$p 128 bfloat16 LASTSTAND_FP_BPS=$p; done
for p in 0 4; do dev_step S64-$p 64 bfloat16 LASTSTAND_FP_BPS=$p; done
for n in L64-4 L64-8 L16-4 S128-4 S128-8 S64-4; do
    [ -f "$OUT/$n.out" ] && { cmp -s "$OUT/$n.out" "$OUT/${n%-*}-0.out" && echo "$n ids == BPS 0" || echo "$n ids DIFFER"; }
done
echo "done $(el)"
