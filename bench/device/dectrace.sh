#!/usr/bin/env bash
# device-limit: 240
# bench/device/dectrace.sh BIN OUTDIR: the single-stream decode step of the full synth
# Qwen3.5-35B-A3B as the GPU runs it (CUDA graphs, PDL overlaps included), from a CUPTI trace
# with one record per graph node (bench/tools/cutrace.c, injected: the GPU machine has no nsys). `generate` B = 1, 512-token prompt +
# 33 new tokens, the plans serve picks on auto; dectrace_table.py splits the kernels into steps
# at the embedding kernel and attributes the step's time to kernels by how far each moves the
# step's end (end_i - max end before it), averaged over the last steps.
# TRACE_P35 (default qwen3.5-35b-a3b) picks the preset, TRACE_B the batch (generate --batch; above 1
# the same run untraced first, for the engine's step time with its host work), TRACE_ENV="VAR=V ...;VAR=V ..." extra variants,
# TRACE_FLAGS extra generate flags (e.g. "--mamba-ssm-dtype bfloat16").
. "$(dirname "$0")/lib.sh"
dev_init dectrace 235 "$@"
TR=$D/libcutrace.so  # bench/tools/cutrace.c, packed beside BIN with libcupti.so.13 by prep_round.sh
[ -f "$TR" ] || { echo "no $TR"; exit 1; }
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
P35=${TRACE_P35:-qwen3.5-35b-a3b}
B=${TRACE_B:-1}
read -ra XF <<<"${TRACE_FLAGS:-}"
trace() { # tag [VAR=V ...]
    local tag=$1
    shift
    if [ "$B" -gt 1 ]; then # the same run untraced: the engine's step with its host work, for the gap
        env "$@" timeout -k 3 100 "$BIN" generate --model-path "synth:$P35" --ids "$(ids 512)" --max-new-tokens 33 \
            --ignore-eos --batch "$B" --device cuda "${PLANS[@]}" "${XF[@]}" >/dev/null 2>"$OUT/gen-$tag-untraced.err"
        echo "untraced: $(grep -E "decode steps of" "$OUT/gen-$tag-untraced.err" | cut -c1-200)"
    fi
    echo "== $tag: CUPTI trace, synth:$P35, B = $B, 512 + 33 tokens, CUDA graphs $* $(el)"
    env "$@" CUDA_INJECTION64_PATH="$TR" LS_CUTRACE_OUT="$OUT/tr-$tag.csv" timeout -k 3 100 \
        "$BIN" generate --model-path "synth:$P35" --ids "$(ids 512)" --max-new-tokens 33 --ignore-eos \
        --batch "$B" --device cuda "${PLANS[@]}" "${XF[@]}" >"$OUT/gen-$tag.out" 2>"$OUT/gen-$tag.err"
    echo "rc=$? $(el)"
    grep -E "decode steps of|cutrace" "$OUT/gen-$tag.err" | cut -c1-200
    timeout 60 python3 bench/device/dectrace_table.py "$OUT/tr-$tag.csv" "$tag"
    xz -T2 "$OUT/tr-$tag.csv"
}
trace base
# TRACE_ENV: variants separated by ";", each "VAR=V VAR2=V2"
IFS=';' read -ra VARS <<<"${TRACE_ENV:-}"
i=0
for v in "${VARS[@]}"; do
    i=$((i + 1))
    [ "$(left)" -gt 30 ] && trace "var$i" $v
done
echo "done $(el)"
