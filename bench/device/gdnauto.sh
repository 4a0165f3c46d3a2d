#!/usr/bin/env bash
# device-limit: 240
# bench/device/gdnauto.sh BIN OUTDIR: gd_kernel_p's form chosen by the unit count (S23, LASTSTAND_GDN_PCFG
# unset = auto: form 2 where form 0's grid would give each block two units or more). Checks the
# threshold's neighbourhood (B = 32: 512 units against 528, form 0; B = 48: form 2) against both forms
# forced, the fp32 state at B = 16 and 128, and the GDN GPU tests on auto.
. "$(dirname "$0")/lib.sh"
dev_init gdnauto 235 "$@"
(cd "$(dirname "$D")" && timeout -k 3 100 python3 -m pytest -q tests/test_gpu_bf16_state.py tests/test_gpu_gdn_decode.py 2>&1 | tail -2)
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
step() { # NAME B DTYPE [VAR=VALUE ...]
    local n=$1 b=$2 d=$3
    shift 3
    [ "$(left)" -lt 20 ] && { echo "$n: out of time"; return; }
    env "$@" timeout -k 3 60 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 65 \
        --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" --mamba-ssm-dtype "$d" >"$OUT/$n.out" 2>"$OUT/$n.err"
    echo "$n B=$b $d $* rc=$? $(grep -oE "decode steps of .*" "$OUT/$n.err" | cut -c1-90) $(el)"
}
step b128-auto 128 bfloat16
step b32-c0 32 bfloat16 LASTSTAND_GDN_PCFG=0
step b32-c2 32 bfloat16 LASTSTAND_GDN_PCFG=2
step b48-c0 48 bfloat16 LASTSTAND_GDN_PCFG=0
step b48-c2 48 bfloat16 LASTSTAND_GDN_PCFG=2
step b16f-c0 16 float32 LASTSTAND_GDN_PCFG=0
step b16f-c2 16 float32 LASTSTAND_GDN_PCFG=2
step b1-auto 1 bfloat16
echo "done $(el)"
