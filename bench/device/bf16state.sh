#!/usr/bin/env bash
# device-limit: 540
# bench/device/bf16state.sh BIN OUTDIR: the GDN state in BF16 (--mamba-ssm-dtype bfloat16, S21:
# compiled, first run here). 1. pytest tests/test_gpu_bf16_state.py (the doctor's fp64 oracle on
# the BF16 state at every bucket for cuda_decode / cuda_chunked / cuda_recurrent; graphs == eager).
# 2. The full synth 35B's decode step (`generate --batch B`, 512-token prompts + 65 tokens, CUDA
# graphs, the plans serve picks) at B = 1, 64, 128 with the state in float32 and in bfloat16.
# Prediction (bench/RESULTS.md S21): gd_kernel_p 175 -> ~95 us a GDN layer at 113 sequences,
# the step 16.9 -> ~14.5 ms; B = 1 about unchanged (its 4 MB of state a layer is latency-bound).
. "$(dirname "$0")/lib.sh"
dev_init bf16state 535 "$@"
echo "== pytest tests/test_gpu_bf16_state.py $(el)"
(cd "$(dirname "$D")" && timeout -k 3 200 python3 -m pytest -q tests/test_gpu_bf16_state.py 2>&1 | tail -6)
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
for b in ${BF_BATCHES:-1 64 128}; do
    for d in float32 bfloat16; do
        [ "$(left)" -lt 40 ] && break 2
        timeout -k 3 90 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 65 \
            --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" --mamba-ssm-dtype "$d" >"$OUT/b$b-$d.out" 2>"$OUT/b$b-$d.err"
        echo "B=$b $d rc=$? $(grep -oE "decode steps of .*" "$OUT/b$b-$d.err" | cut -c1-90) $(el)"
    done
done
# 3. the early shared expert's new checks of S21 (not yet run on a GPU): logits bit for bit early vs
# late, graphs' greedy ids early vs late, the doctor's oracle at partial tiles
echo "== pytest tests/test_gpu_moe_grouped.py -k early $(el)"
[ "$(left)" -gt 60 ] && (cd "$(dirname "$D")" && timeout -k 3 $(( $(left) - 10 )) python3 -m pytest -q tests/test_gpu_moe_grouped.py -k early 2>&1 | tail -6)
echo "done $(el)"
