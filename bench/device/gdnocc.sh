#!/usr/bin/env bash
# device-limit: 420
# bench/device/gdnocc.sh BIN OUTDIR: gd_kernel_p with the BF16 state at two blocks an SM (S22,
# LASTSTAND_GDN_POCC, default 2; 1 = one block an SM as before). S22's first call measured the BF16
# state at -9% on the 128-sequence step where its halved bytes predicted -14%: a block of 4 warps
# (one a scheduler) waits on its own latencies once the bytes are halved. Prediction: gd_kernel_p
# ~125 -> ~80 us a GDN layer at 119 sequences, the step 15.8 -> ~14.5 ms; B = 64 11.7 -> ~11.0;
# float32 unchanged (its buffers leave room for one block). Then the attention decode's short-context
# chunks at 119 sequences (LASTSTAND_FP_SHORT 16 / 4 / 0): whether batching a row's chunks would pay.
# 1. pytest test_gpu_bf16_state.py, test_gpu_gdn_decode.py (the doctor's fp64 oracle, graphs == eager)
# 2. the full synth 35B's decode step (generate --batch B, 512-token prompts + 65 tokens, graphs)
. "$(dirname "$0")/lib.sh"
dev_init gdnocc 415 "$@"
echo "== pytest test_gpu_bf16_state.py test_gpu_gdn_decode.py $(el)"
(cd "$(dirname "$D")" && timeout -k 3 150 python3 -m pytest -q tests/test_gpu_bf16_state.py tests/test_gpu_gdn_decode.py 2>&1 | tail -6)
dev_step b128-bf-occ2 128 bfloat16
dev_step b128-bf-occ1 128 bfloat16 LASTSTAND_GDN_POCC=1
dev_step b128-f32 128 float32
dev_step b64-bf-occ2 64 bfloat16
dev_step b64-bf-occ1 64 bfloat16 LASTSTAND_GDN_POCC=1
dev_step b16-bf-occ2 16 bfloat16
dev_step b16-bf-occ1 16 bfloat16 LASTSTAND_GDN_POCC=1
for o in 1 2; do cmp -s "$OUT/b128-bf-occ$o.out" "$OUT/b128-bf-occ2.out" && echo "b128 occ$o ids == occ2" || echo "b128 occ$o ids DIFFER"; done
cmp -s "$OUT/b64-bf-occ1.out" "$OUT/b64-bf-occ2.out" && echo "b64 occ1 ids == occ2" || echo "b64 occ1 ids DIFFER"
dev_step b128-fs4 128 bfloat16 LASTSTAND_FP_SHORT=4
dev_step b128-fs0 128 bfloat16 LASTSTAND_FP_SHORT=0
dev_step b1-fs16 1 bfloat16
dev_step b1-fs4 1 bfloat16 LASTSTAND_FP_SHORT=4
echo "done $(el)"
