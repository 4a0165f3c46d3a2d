#!/usr/bin/env bash
# device-limit: 330
# bench/device/shearly.sh BIN OUTDIR: the early BF16 shared expert of cuda_grouped_gemm's mid path
# (LASTSTAND_MG_SHEARLY, S21). 1. `generate --batch B` of the full synth Qwen3.5-35B-A3B (512-token
# prompts + 65 tokens, CUDA graphs, the plans serve picks) at B = 16, 64, 128 with SHEARLY=1 (now the
# default) and =0 (forked after the plan, before): the engine's mean decode step (greedy ids are compared by the pytest below; the step schedules of
# two generate runs may differ, which changes the batches and so the rounding). 2. pytest tests/test_gpu_moe_grouped.py (the doctor's
# fp64 oracle at the changed path; the early == late tokens test). 3. dectrace.sh at B = 16.
. "$(dirname "$0")/lib.sh"
dev_init shearly 325 "$@"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
# variants: the default (early), late (before S21)
VARS=("def:" "late:LASTSTAND_MG_SHEARLY=0")
for b in ${SH_BATCHES:-16 64 128}; do
    for v in "${VARS[@]}"; do
        t=${v%%:*}
        env ${v#*:} timeout -k 3 90 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" \
            --max-new-tokens 65 --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" >"$OUT/b$b-$t.out" 2>"$OUT/b$b-$t.err"
        echo "B=$b $t (${v#*:}) rc=$? $(grep -oE "decode steps of .*" "$OUT/b$b-$t.err" | cut -c1-90) $(el)"
    done
done
echo "== pytest test_gpu_moe_grouped.py $(el)"
(cd "$(dirname "$D")" && timeout -k 3 150 python3 -m pytest -q -x tests/test_gpu_moe_grouped.py \
    -k "default or sh- or early or 397b-rank or every_bucket" 2>&1 | tail -5)
if [ "$(left)" -gt 40 ]; then
    TRACE_B=16 timeout -k 3 $(( $(left) - 5 )) bash bench/device/dectrace.sh "$BIN" "$OUT/trace16" 2>&1 |
        grep -vE "^ +[0-9]+ " | head -30
fi
echo "done $(el)"
