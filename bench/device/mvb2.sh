#!/usr/bin/env bash
# device-limit: 300
# bench/device/mvb2.sh BIN OUTDIR: the BF16 shared expert's mid-batch GEMV (mvb_kernel) with both
# 8-slot groups of a 16-token tile in one pass (S22, LASTSTAND_MG_MVB2, default 1; 0 = two passes,
# each weight chunk read twice). S21's timeline at 113 sequences: the shared gate/up 20.8 us a layer
# on the critical path for 4 MB of weights (read 16 times: 8 tiles x 2 passes, from L2).
# Prediction: ~half the L2 traffic and half the dependent load chains: the shared gate/up ~11 us,
# the 128-sequence step -0.3..0.6 ms (the part that no longer hides under router/top-k/plan); B = 16
# -0.1 ms; the same ids (same mma order per group).
# 1. pytest tests/test_gpu_moe_grouped.py (the doctor's fp64 oracle, early == late bit for bit)
# 2. the full synth 35B's decode step, the BF16 GDN state, MVB2 = 1 / 0 at B = 16, 64, 128.
. "$(dirname "$0")/lib.sh"
dev_init mvb2 295 "$@"
echo "== pytest tests/test_gpu_moe_grouped.py $(el)"
(cd "$(dirname "$D")" && timeout -k 3 150 python3 -m pytest -q tests/test_gpu_moe_grouped.py 2>&1 | tail -6)
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
for b in 128 64 16; do
    for v in 1 0; do
        [ "$(left)" -lt 25 ] && break 2
        LASTSTAND_MG_MVB2=$v timeout -k 3 90 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" \
            --max-new-tokens 65 --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" --mamba-ssm-dtype bfloat16 \
            >"$OUT/b$b-$v.out" 2>"$OUT/b$b-$v.err"
        echo "B=$b MVB2=$v rc=$? $(grep -oE "decode steps of .*" "$OUT/b$b-$v.err" | cut -c1-90) $(el)"
    done
    cmp -s "$OUT/b$b-1.out" "$OUT/b$b-0.out" && echo "B=$b ids equal" || echo "B=$b ids DIFFER"
done
echo "done $(el)"
