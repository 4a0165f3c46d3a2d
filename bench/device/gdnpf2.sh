#!/usr/bin/env bash
# device-limit: 330
# bench/device/gdnpf2.sh BIN OUTDIR: gd_kernel_p's prefetch of the next task's inputs into L1
# (LASTSTAND_GDN_PPF=1) measured no gain at 119 / 62 / 16 sequences with the BF16 state (S23 call 2;
# fp32 -0.9%), and ncu still put 27% of its stall samples on long-scoreboard waits at the task's
# first use of those inputs: L1 (~28 KB beside two 100 KB shared-memory carve-outs) may not keep
# them. PPF=2 prefetches into L2 with evict-last instead. Steps at B = 128 / 64 (BF16 state) with
# PPF 0 / 1 / 2, then ncu of gd_kernel_p under PPF=0 and PPF=2 (deepncu.sh).
. "$(dirname "$0")/lib.sh"
dev_init gdnpf2 325 "$@"
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
step b128-pf2 128 bfloat16 LASTSTAND_GDN_PPF=2
step b128-pf0 128 bfloat16 LASTSTAND_GDN_PPF=0
step b128-pf1 128 bfloat16 LASTSTAND_GDN_PPF=1
step b64-pf2 64 bfloat16 LASTSTAND_GDN_PPF=2
step b64-pf0 64 bfloat16 LASTSTAND_GDN_PPF=0
cmp -s "$OUT/b128-pf2.out" "$OUT/b128-pf0.out" && echo "b128 ids pf2 == pf0" || echo "b128 ids DIFFER"
for pf in 0 2; do
    [ "$(left)" -gt 70 ] || break
    echo "== ncu gd_kernel_p PPF=$pf $(el)"
    LASTSTAND_GDN_PPF=$pf DNCU_K="gdp$pf|gd_kernel_p|30" timeout $(( $(left) - 10 )) bash "$(dirname "$0")/deepncu.sh" "$BIN" "$OUT/ncu$pf" 2>&1 |
        grep -vE "^NVIDIA|^[0-9a-f]{7} " | head -60
done
echo "done $(el)"
