#!/usr/bin/env bash
# device-limit: 300
# bench/device/gdnpcfg.sh BIN OUTDIR: gd_kernel_p's forms (S23, LASTSTAND_GDN_PCFG): 0 = 3 state buffers
# a block, a task's rows unrolled (245 registers, 2 blocks an SM with the BF16 state); 1 = 2 buffers,
# rows in a loop (102 registers), 3 blocks; 2 = 1 buffer, 5 blocks; 3 = 1 buffer, 6 blocks (80).
# S23's ncu: form 0 at 119 sequences issues 22% of cycles with 2 warps a scheduler, a task's latency
# chain not hidden. Prediction: form 2 / 3 ~95 -> ~60-65 us a GDN layer, the 128-sequence step
# 14.8 -> ~14.0 ms; the same bits (same arithmetic, only the unrolling and buffering differ).
# 1. test_gdn_decode_cuda (gd_kernel_p's bits == gd_kernel's) under each form; pytest
#    test_gpu_bf16_state.py + test_gpu_gdn_decode.py under form 2
# 2. the full synth 35B's decode step (512-token prompts + 65 tokens, graphs) per form
. "$(dirname "$0")/lib.sh"
dev_init gdnpcfg 295 "$@"
for c in 1 2 3; do
    LASTSTAND_GDN_PCFG=$c timeout 40 "$D/tests/test_gdn_decode_cuda" >"$OUT/ut$c.log" 2>&1
    echo "test_gdn_decode_cuda PCFG=$c rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut$c.log" | tr '\n' ' ') $(el)"
    grep -E "FAIL|differ|Failure" "$OUT/ut$c.log" | head -5
done
echo "== pytest PCFG=2 $(el)"
(cd "$(dirname "$D")" && LASTSTAND_GDN_PCFG=2 timeout -k 3 100 python3 -m pytest -q tests/test_gpu_bf16_state.py tests/test_gpu_gdn_decode.py 2>&1 | tail -3)
for c in 2 0 3 1; do dev_step b128-c$c 128 bfloat16 LASTSTAND_GDN_PCFG=$c; done
for c in 2 0; do dev_step b64-c$c 64 bfloat16 LASTSTAND_GDN_PCFG=$c; done
for c in 2 0; do dev_step b128f-c$c 128 float32 LASTSTAND_GDN_PCFG=$c; done
for c in 2 0; do dev_step b16-c$c 16 bfloat16 LASTSTAND_GDN_PCFG=$c; done
for n in b128-c3 b128-c1 b128-c0 b64-c0 b128f-c0 b16-c0; do
    o=${n%-c*}-c2.out
    [ -f "$OUT/$n.out" ] && { cmp -s "$OUT/$n.out" "$OUT/$o" && echo "$n ids == form 2" || echo "$n ids DIFFER from form 2"; }
done
echo "done $(el)"
