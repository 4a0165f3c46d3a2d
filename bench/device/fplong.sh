#!/usr/bin/env bash
# device-limit: 300
# bench/device/fplong.sh BIN OUTDIR: fp_dec_kernel's dealing of a row's chunks to about N blocks an SM
# (LASTSTAND_FP_BPS = N, S24; 0 = a block a chunk slot) at long contexts, where a row has up to 32
# chunks of 4 key tiles and few blocks a row could leave a short last wave: the full synth 35B's
# decode step (graphs) after 4000-token prompts at B = 64 under BPS 0, 2, 4 and B = 16 under 0, 2, ids
# compared; then B = 128 at 512 tokens under 2 and 4; test_attn_cuda under the default.
# (S24's first form of this script measured a variant that kept grid.z = the split count with runs of
# at most 16 key tiles: the ~7700 blocks a step that exit at once cost what the dealing saved,
# B = 128 14.667 vs 14.650 ms.)
. "$(dirname "$0")/lib.sh"
dev_init fplong 295 "$@"
timeout 60 "$D/tests/test_attn_cuda" >"$OUT/ut.log" 2>&1
echo "test_attn_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut.log" | tr '\n' ' ') $(el)"
for p in 0 2 4; do dev_lstep L64-$p 64 4000 LASTSTAND_FP_BPS=$p; done
for p in 0 2; do dev_lstep L16-$p 16 4000 LASTSTAND_FP_BPS=$p; done
for p in 2 4; do dev_step S128-$p 128 bfloat16 LASTSTAND_FP_BPS=$p; done
for n in L64-2 L64-4 L16-2; do
    [ -f "$OUT/$n.out" ] && { cmp -s "$OUT/$n.out" "$OUT/${n%-*}-0.out" && echo "$n ids == BPS 0" || echo "$n ids DIFFER"; }
done
[ -f "$OUT/S128-4.out" ] && { cmp -s "$OUT/S128-4.out" "$OUT/S128-2.out" && echo "S128-4 ids == BPS 2" || echo "S128-4 ids DIFFER"; }
echo "done $(el)"
