#!/bin/bash
# bench/device/mtpdbg.sh BIN OUTDIR: the MTP head's forward on the synth 35B shapes under the CLI's
# default backends and under the plans serve picks, to find what failed (S28 call 3: a cuBLASLt
# "unsupported value" in `logits --mtp` on synth:qwen3.5-35b-a3b,layers=1,mtp=chain).
# device-limit: 120
. "$(dirname "$0")/lib.sh"
dev_init mtpdbg 115 "$@"
t() { echo "== $*"; timeout 60 "$BIN" logits --device cuda --ids 0,5,77 "$@" 2>"$OUT/err" | head -c 120; echo; grep -E "error|warn" "$OUT/err" | cut -c1-300 | tail -3; }
M1=synth:qwen3.5-35b-a3b,layers=1,mtp=chain
t --model-path $M1
t --model-path $M1 --mtp
t --model-path synth:qwen3.5-35b-a3b,layers=4,mtp=chain --mtp
t --model-path $M1 --mtp "${DEV_PLANS_AUTO[@]}"
t --model-path $M1 --mtp --moe-runner-backend cuda_fused_decode
t --model-path $M1 --mtp --fp4-gemm-backend cuda_w4a16_mma
t --model-path $M1 --mtp --gemm-backend cuda_gemv
t --model-path $M1 --mtp --moe-runner-backend cuda_grouped_gemm
t --model-path synth:demo,mtp=chain --mtp
echo "done $(el)"
