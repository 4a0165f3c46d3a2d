#!/usr/bin/env bash
# device-limit: 70
# bench/device/gdnauto2.sh BIN OUTDIR: the final auto rule of gd_kernel_p's form (form 2 from 3 units an
# SM): test_gdn_decode_cuda on auto, decode steps at B = 32 (form 2 now) and B = 16 (form 0).
. "$(dirname "$0")/lib.sh"
dev_init gdnauto2 65 "$@"
timeout 30 "$D/tests/test_gdn_decode_cuda" >"$OUT/ut.log" 2>&1
echo "test_gdn_decode_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut.log" | tr '\n' ' ')"
dev_step b32 32 bfloat16
dev_step b16 16 bfloat16
