#!/usr/bin/env bash
# device-limit: 240
# bench/device/gdchain.sh BIN OUTDIR: the GDN decode kernels' chains (S24), run on main and on the
# branch that changes them, in one call (compare the two logs, and the ids across the bundles).
# Branch gdc: gd_kernel_p's unit q/k conv over all 128 threads instead of warp 0 alone (every warp
# sums q·q, k·k, q·k from shared memory in warp 0's lane order), two block barriers a task instead of
# three, the state buffer refilled before the fused norm; gd_body (gd_kernel, B <= ~24) stores the
# final state before the norm's cluster barrier. Same arithmetic in the same order: the same bits.
# On main this is also the check of S23's final auto rule (form 2 from 3 units an SM: B = 32 form 2,
# B = 16 form 0).
# 1. test_gdn_decode_cuda (gd_kernel_p's bits == gd_kernel's, every form in one process); pytest
#    test_gpu_bf16_state.py + test_gpu_gdn_decode.py (the doctor's fp64 oracle, graphs == eager)
# 2. the full synth 35B's decode step (512-token prompts + 65 tokens, graphs) at B = 1 .. 128
. "$(dirname "$0")/lib.sh"
dev_init gdchain 235 "$@"
timeout 40 "$D/tests/test_gdn_decode_cuda" >"$OUT/ut.log" 2>&1
echo "test_gdn_decode_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut.log" | tr '\n' ' ') $(el)"
grep -E "FAIL|differ|Failure" "$OUT/ut.log" | head -5
(cd "$(dirname "$D")" && timeout -k 3 100 python3 -m pytest -q tests/test_gpu_bf16_state.py tests/test_gpu_gdn_decode.py 2>&1 | tail -2)
echo "pytest $(el)"
dev_step b1 1 bfloat16
dev_step b16 16 bfloat16
dev_step b32 32 bfloat16
dev_step b64 64 bfloat16
dev_step b128 128 bfloat16
dev_step b128f 128 float32
echo "done $(el)"
