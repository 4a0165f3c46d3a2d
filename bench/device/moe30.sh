#!/usr/bin/env bash
# device-limit: 120
# bench/device/moe30.sh BIN OUTDIR: the doctor's moe cells (fp64 verdict, chained µs) of the fused
# decode and the grouped GEMM at the Qwen3-30B-A3B layer (128 experts, top-8, I 768, no shared
# expert, NVFP4) against the Qwen3.5-35B-A3B's, M = 1 .. 64; MOE30_ENV: VAR=V ... for a variant.
. "$(dirname "$0")/lib.sh"
dev_init moe30 115 "$@"
for p in "qwen3-30b-a3b,quant=nvfp4,layers=1" "qwen3.5-35b-a3b,layers=1"; do
    echo "== $p ${MOE30_ENV:-} $(el)"
    env ${MOE30_ENV:-} timeout -k 2 50 "$BIN" doctor --device cuda --model-path "synth:$p" --families moe \
        --backends cuda_fused_decode,cuda_grouped_gemm --m 1,2,4,8,12,16,24,32,64 >"$OUT/d-${p%%,*}.txt" 2>"$OUT/d-${p%%,*}.err"
    echo "rc=$? $(el)"
    grep -E "^moe|^ +[0-9]+ " "$OUT/d-${p%%,*}.txt" | cut -c1-150
done
