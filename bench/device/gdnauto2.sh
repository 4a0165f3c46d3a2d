#!/usr/bin/env bash
# device-limit: 70
# bench/device/gdnauto2.sh BIN OUTDIR: the final auto rule of gd_kernel_p's form (form 2 from 3 units an
# SM): test_gdn_decode_cuda on auto, decode steps at B = 32 (form 2 now) and B = 16 (form 0).
. "$(dirname "$0")/lib.sh"
dev_init gdnauto2 65 "$@"
timeout 30 "$D/tests/test_gdn_decode_cuda" >"$OUT/ut.log" 2>&1
echo "test_gdn_decode_cuda rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut.log" | tr '\n' ' ')"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
for b in 32 16; do
    timeout -k 3 30 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 65 \
        --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" --mamba-ssm-dtype bfloat16 >"$OUT/b$b.out" 2>"$OUT/b$b.err"
    echo "B=$b auto rc=$? $(grep -oE "decode steps of .*" "$OUT/b$b.err" | cut -c1-90) $(el)"
done
