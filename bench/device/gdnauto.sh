#!/usr/bin/env bash
# device-limit: 240
# bench/device/gdnauto.sh BIN OUTDIR: gd_kernel_p's form chosen by the unit count (S23, LASTSTAND_GDN_PCFG
# unset = auto; the rule when this ran, before commit cbe8d39: form 2 where form 0's grid would give
# each block two units or more; the rule after it: from 3 units an SM, checked by gdnauto2.sh). Checks the
# threshold's neighbourhood (B = 32: 512 units against 528; B = 48) against both forms forced, the fp32
# state at B = 16 and 128, and the GDN GPU tests on auto.
. "$(dirname "$0")/lib.sh"
dev_init gdnauto 235 "$@"
(cd "$(dirname "$D")" && timeout -k 3 100 python3 -m pytest -q tests/test_gpu_bf16_state.py tests/test_gpu_gdn_decode.py 2>&1 | tail -2)
dev_step b128-auto 128 bfloat16
dev_step b32-c0 32 bfloat16 LASTSTAND_GDN_PCFG=0
dev_step b32-c2 32 bfloat16 LASTSTAND_GDN_PCFG=2
dev_step b48-c0 48 bfloat16 LASTSTAND_GDN_PCFG=0
dev_step b48-c2 48 bfloat16 LASTSTAND_GDN_PCFG=2
dev_step b16f-c0 16 float32 LASTSTAND_GDN_PCFG=0
dev_step b16f-c2 16 float32 LASTSTAND_GDN_PCFG=2
dev_step b1-auto 1 bfloat16
echo "done $(el)"
