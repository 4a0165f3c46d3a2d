#!/usr/bin/env bash
# device-limit: 260
# bench/device/attdec.sh BIN OUTDIR: fp_decw_kernel (S22, LASTSTAND_FP_DEC=3: the row plan's decode
# rows with the 4 warps splitting the keys, each warp its own cp.async stages and online softmax, no
# block barrier until the chunk's end; transposed products, no fragment shuffles) against fp_dec_kernel
# (FP_DEC=1: the warps split head_dim and meet in shared memory three times a 32-key tile).
# S22's timeline at 110 sequences: fp_dec 97 us an attention layer for ~123 MB of KV (1.27 TB/s).
# Prediction: ~40-50 us there (2.5-3 TB/s: 8 warps an SM each with 2 rounds of 8 KB in flight,
# no barriers), the 128-sequence step -0.5 ms; M = 1 about equal (one block a chunk either way).
# 1. test_attn_cuda (fp64 reference, graph replay at other contexts bit for bit), FP_DEC=3, and
#    under compute-sanitizer memcheck; tests/test_gpu_attn_graph.py (graph == eager tokens).
# 2. the doctor's attention cells (fp64 oracle, chained time), decode rows at a fixed context.
# 3. the full synth 35B's decode step (BF16 GDN state), FP_DEC = 1 / 3.
. "$(dirname "$0")/lib.sh"
dev_init attdec 255 "$@"
UT="$D/tests/test_attn_cuda"
echo "== 1. test_attn_cuda FP_DEC=3 $(el)"
LASTSTAND_FP_DEC=3 LS_ATTN_PLAN_DEFAULT=1 timeout 45 "$UT" >"$OUT/ut3.log" 2>&1
echo "rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]' "$OUT/ut3.log" | tr '\n' ' ')"
grep -E "attn:|FAIL|Failure|error" "$OUT/ut3.log" | head -30
if command -v compute-sanitizer >/dev/null; then
    LASTSTAND_FP_DEC=3 LS_ATTN_PLAN_DEFAULT=1 LS_ATTN_TEST=check timeout 30 compute-sanitizer --tool memcheck \
        --error-exitcode 9 "$UT" >"$OUT/memcheck3.log" 2>&1
    echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|PASSED  \]|FAILED  \]' "$OUT/memcheck3.log" | tr '\n' ' ')"
    grep -E "Invalid|out of bounds|Address" "$OUT/memcheck3.log" | head -6
fi
echo "== pytest test_gpu_attn_graph.py FP_DEC=3 $(el)"
(cd "$(dirname "$D")" && LASTSTAND_FP_DEC=3 timeout -k 3 60 python3 -m pytest -q tests/test_gpu_attn_graph.py 2>&1 | tail -4)
echo "== 2. doctor attention cells $(el)"
for shape in qwen3.5-35b-a3b qwen3-30b-a3b; do
    CTXS=${ATTDEC_CTX:-"1300 4096"}; [ $shape = qwen3-30b-a3b ] && CTXS=${ATTDEC_CTX30:-}
    for ctx in $CTXS; do
        for fd in 1 3; do
            [ "$(left)" -gt 75 ] || { echo "doctor: out of time"; break 3; }
            printf '%-16s ctx %-5s FP_DEC=%s ' "$shape" "$ctx" "$fd"
            LASTSTAND_FP_DEC=$fd LASTSTAND_DOCTOR_ATTN_CTX=$ctx timeout -k 2 40 "$BIN" doctor --device cuda \
                --shapes "$shape" --families attention --backends cuda_flash_prefill --m 1,16,64,128 \
                >"$OUT/d-$shape-$ctx-$fd.txt" 2>"$OUT/d-$shape-$ctx-$fd.err"
            rc=$?
            echo "rc=$rc $(grep -E '^ +(1|16|64|128) ' "$OUT/d-$shape-$ctx-$fd.txt" | awk '{printf "M=%s %s %s %s | ", $1, $2, $3, $4}') $(el)"
        done
    done
done
echo "== 3. decode steps $(el)"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
for b in ${ATTDEC_B:-128 1}; do
    for fd in 3 1; do
        [ "$(left)" -lt 25 ] && break 2
        LASTSTAND_FP_DEC=$fd timeout -k 3 90 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" \
            --max-new-tokens 65 --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" --mamba-ssm-dtype bfloat16 \
            >"$OUT/b$b-$fd.out" 2>"$OUT/b$b-$fd.err"
        echo "B=$b FP_DEC=$fd rc=$? $(grep -oE "decode steps of .*" "$OUT/b$b-$fd.err" | cut -c1-90) $(el)"
    done
done
echo "done $(el)"
