#!/usr/bin/env bash
# device-limit: 400
# bench/device/fp8k.sh BIN OUTDIR: FP8 weights kept FP8 on the GPU (W_FP8; S16).
# 0. cmocka test_fp8_gemm_cuda (cuda_gemv's FP8 kernel, cuda_cublaslt's dequantize + cuBLASLt and
#    cuda_ref on FP8 weights against fp64);
#    tests/test_fp8_checkpoints.py with LS_TEST_DEVICE=cuda (fixtures staged beside BIN).
# 1. The doctor's gemm family on the shapes of synth:qwen3.5-35b-a3b,quant=nvfp4-fp8 (FP8 attention
#    and GDN projections, BF16 shared expert and router): every backend's verdict, time and GB/s.
# 2. The engine's mean decode step with CUDA graphs (`generate`, 512-token prompt + 129 new
#    tokens, DEV_PLANS_DECODE) of the full synth 35B with FP8 attention / GDN projections: kept FP8
#    (the default now) against LASTSTAND_FP8_DEQUANT=1 (dequantized to BF16 at load, as before),
#    and the plain NVFP4 + BF16 35B; greedy ids compared.
. "$(dirname "$0")/lib.sh"
dev_init fp8k 395 "$@"
PLANS=("${DEV_PLANS_DECODE[@]}")
for t in test_fp8_gemm_cuda; do
    [ -x "$D/tests/$t" ] || { echo "no $t"; continue; }
    echo "== cmocka $t $(el)"
    timeout -k 3 90 "$D/tests/$t" >"$OUT/$t.log" 2>&1
    echo "rc=$? (0: every test passed) $(el)"
    grep -E "^\[  (PASSED|FAILED) \]|FAIL|max err|error" "$OUT/$t.log" | head -30
done
echo "== pytest tests/test_fp8_checkpoints.py, LS_TEST_DEVICE=cuda $(el)"
BUILD=$D LS_SHARED=$D LS_TEST_DEVICE=cuda timeout -k 3 100 python3 -m pytest -q -p no:cacheprovider -rfE \
    tests/test_fp8_checkpoints.py 2>&1 | tail -8

doc() { # tag model
    echo "== doctor gemm: $2 $(el)"
    XDG_CACHE_HOME=$OUT/cache timeout -k 3 150 "$BIN" doctor --device cuda --model-path "$2" --families gemm \
        --m 1,4,16,64 --json "$OUT/doc-$1.json" >"$OUT/doc-$1.txt" 2>"$OUT/doc-$1.err"
    echo "rc=$? $(el)"
    cat "$OUT/doc-$1.txt" | head -80
}
doc f35 "synth:qwen3.5-35b-a3b,quant=nvfp4-fp8"

gen() { # tag preset limit [VAR=V ...]
    local tag=$1 preset=$2 lim=$3
    shift 3
    echo "== gen $tag: synth:$preset, 512 + 129 tokens, CUDA graphs${*:+, env $*} $(el)"
    env "$@" timeout -k 3 "$lim" "$BIN" generate --model-path "synth:$preset" --ids "$(ids 512)" --max-new-tokens 129 \
        --device cuda "${PLANS[@]}" >"$OUT/gen-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -o "[0-9.]* ms each" "$OUT/gen-$tag.out" | head -1
    grep -iE "error" "$OUT/gen-$tag.out" | cut -c1-200 | head -3
    grep -o '"ids": *\[[0-9, ]*\]' "$OUT/gen-$tag.out" | head -1 >"$OUT/ids-$tag"
}
same() { cmp -s "$OUT/ids-$1" "$OUT/ids-$2" && echo "greedy ids $1 == $2" || echo "greedy ids $1 != $2: $(head -c 100 "$OUT/ids-$1") / $(head -c 100 "$OUT/ids-$2")"; }
gen fp8 "qwen3.5-35b-a3b,quant=nvfp4-fp8" 80
gen deq "qwen3.5-35b-a3b,quant=nvfp4-fp8" 80 LASTSTAND_FP8_DEQUANT=1
gen plain "qwen3.5-35b-a3b" 80
same fp8 deq
echo "done $(el)"
