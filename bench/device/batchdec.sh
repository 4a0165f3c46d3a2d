#!/usr/bin/env bash
# device-limit: 560
# bench/device/batchdec.sh BIN OUTDIR: the decode step of the full synth Qwen3.5-35B-A3B at batch
# B (what a server at concurrency B runs between prefills), with the plans serve picks on auto.
# 1. `generate --batch B` (B 512-token prompts, each a rotation of one, 65 new tokens each,
#    --ignore-eos, CUDA graphs): the engine's mean decode step at B = 1, 16, 64, 128, 256, and at
#    B = 64, 256 with the GDN plan before S17 (cuda_decode:16,cuda_chunked).
# 2. ncu (--clock-control none --cache-control none) over an eager 8-layer run at B = BNCU
#    (default 128) of 8192 / B-token prompts (one prefill step: the default budget) + 3 tokens:
#    decprof_table.py tabulates the last forward = a decode step of all B sequences.
. "$(dirname "$0")/lib.sh"
dev_init batchdec 555 "$@"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend "${GDN:-cuda_decode}"
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
P35=${P35:-qwen3.5-35b-a3b}
gen() { # tag B limit [extra flags]
    local tag=$1 b=$2 lim=$3
    shift 3
    echo "== $tag: synth:$P35, batch $b, 512 + 65 tokens, CUDA graphs $* $(el)"
    timeout -k 3 "$lim" "$BIN" generate --model-path "synth:$P35" --ids "$(ids 512)" --max-new-tokens 65 \
        --ignore-eos --batch "$b" --device cuda "${PLANS[@]}" "$@" >"$OUT/gen-$tag.out" 2>"$OUT/gen-$tag.err"
    echo "rc=$? $(el)"
    grep -E "decode steps of|rror" "$OUT/gen-$tag.err" | cut -c1-200 | head -3
}
for b in ${BATCHES:-1 16 64 128 256}; do gen "b$b" "$b" 90; done
for b in ${BATCHES_OLD:-64 256}; do gen "b$b-old" "$b" 90 --gdn-backend cuda_decode:16,cuda_chunked; done
BN=${BNCU:-128}
if [ -n "$NCU" ] && [ "$(left)" -gt 60 ]; then
    NP=$(( 8192 / BN ))
    echo "== ncu: synth:$P35,layers=8 eager, batch $BN, $NP-token prompts + 3 tokens $(el)"
    timeout -k 3 $(( $(left) - 15 )) "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu" \
        "$BIN" generate --model-path "synth:$P35,layers=8" --ids "$(ids $NP)" --max-new-tokens 3 --ignore-eos \
        --batch "$BN" --device cuda --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu.out" 2>&1
    echo "rc=$? $(el)"
    if [ -f "$OUT/ncu.ncu-rep" ]; then
        timeout 30 "$NCU" --import "$OUT/ncu.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu.csv" 2>/dev/null
        timeout 20 python3 bench/device/decprof_table.py "$OUT/ncu.csv" "b$BN"
        rm -f "$OUT/ncu.ncu-rep"
    else
        tail -5 "$OUT/ncu.out"
    fi
fi
echo "done $(el)"
