#!/usr/bin/env bash
# device-limit: 330
# bench/device/gdnpf.sh BIN OUTDIR: gd_kernel_p with the next task's inputs prefetched into L1
# (S23, LASTSTAND_GDN_PPF, default 1; 0 = as before). S22's timeline: gd_kernel_p ~95 us a GDN layer
# at 110 sequences (BF16 state) against ~56 at copy bandwidth, a block's task ~7 us for ~2-3k
# instructions a warp: each task starts on a dependent DRAM round trip (its v channel's conv window
# and weights, qkv / a / b / z, A_log, dt_bias) and each unit on two more (the sequence table, warp
# 0's q/k windows). Prediction: ~1 us off a task, gd_kernel_p ~95 -> ~65 us a layer, the 128-sequence
# step 14.8 -> ~14.0 ms, B = 64 11.25 -> ~10.8; the same ids (addresses only).
# 1. pytest test_gpu_bf16_state.py, test_gpu_gdn_decode.py (fp64 oracle, every form the same bits)
# 2. the full synth 35B's decode step (generate --batch B, 512-token prompts + 65 tokens, graphs), PPF 1 / 0
. "$(dirname "$0")/lib.sh"
dev_init gdnpf 325 "$@"
echo "== pytest test_gpu_bf16_state.py test_gpu_gdn_decode.py $(el)"
(cd "$(dirname "$D")" && timeout -k 3 150 python3 -m pytest -q tests/test_gpu_bf16_state.py tests/test_gpu_gdn_decode.py 2>&1 | tail -4)
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
step() { # NAME B DTYPE [VAR=VALUE ...]
    local n=$1 b=$2 d=$3
    shift 3
    [ "$(left)" -lt 25 ] && { echo "$n: out of time"; return; }
    env "$@" timeout -k 3 90 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 65 \
        --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" --mamba-ssm-dtype "$d" >"$OUT/$n.out" 2>"$OUT/$n.err"
    echo "$n B=$b $d $* rc=$? $(grep -oE "decode steps of .*" "$OUT/$n.err" | cut -c1-90) $(el)"
}
step b128-pf1 128 bfloat16
step b128-pf0 128 bfloat16 LASTSTAND_GDN_PPF=0
step b64-pf1 64 bfloat16
step b64-pf0 64 bfloat16 LASTSTAND_GDN_PPF=0
step b128-f32-pf1 128 float32
step b128-f32-pf0 128 float32 LASTSTAND_GDN_PPF=0
step b16-pf1 16 bfloat16
step b16-pf0 16 bfloat16 LASTSTAND_GDN_PPF=0
for b in b128 b64 b128-f32 b16; do
    cmp -s "$OUT/$b-pf1.out" "$OUT/$b-pf0.out" && echo "$b ids pf1 == pf0" || echo "$b ids DIFFER"
done
echo "done $(el)"
