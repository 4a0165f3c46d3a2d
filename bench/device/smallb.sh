#!/usr/bin/env bash
# device-limit: 300
# bench/device/smallb.sh BIN OUTDIR: the full synth Qwen3.5-35B-A3B's decode step at small batches
# (B = 1, 2, 3, 4, 8: what a verify step of 2-5 tokens and a lightly loaded server run), with the
# plans serve picks on auto (DEV_PLANS_AUTO: MoE fused decode only at M = 1) and with the decode plans
# (DEV_PLANS_DECODE: fused decode and GEMV up to M = 8); then a CUPTI trace of B = 2 under each
# (dectrace.sh), so that the step's extra time over B = 1 is attributed to kernels.
. "$(dirname "$0")/lib.sh"
dev_init smallb 295 "$@"
step() { # name B plans...
    local n=$1 b=$2
    shift 2
    [ "$(left)" -lt 25 ] && { echo "$n: out of time"; return; }
    timeout -k 3 90 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 65 \
        --ignore-eos --batch "$b" --device cuda "$@" >"$OUT/$n.out" 2>"$OUT/$n.err"
    echo "$n B=$b rc=$? $(grep -oE "decode steps of .*" "$OUT/$n.err" | cut -c1-110) $(el)"
}
for b in 1 2 3 4 8; do
    step auto$b $b "${DEV_PLANS_AUTO[@]}"
    step dec$b $b "${DEV_PLANS_DECODE[@]}" --lm-head-backend cuda_cublaslt
done
TRACE_B=2 bash "$(dirname "$0")/dectrace.sh" "$BIN" "$OUT/tr-auto" 2>&1 | tail -60
TRACE_B=2 TRACE_FLAGS="--moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm" \
    bash "$(dirname "$0")/dectrace.sh" "$BIN" "$OUT/tr-dec" 2>&1 | tail -60
echo "done $(el)"
