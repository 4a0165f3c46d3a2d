#!/usr/bin/env bash
# device-limit: 120
# bench/device/moemid.sh: cuda_grouped_gemm (src/ops/cuda/moe_grouped.cu) at 9..64 tokens, the
# MoE of a concurrency-16 decode step, for the integrator's device rounds (DEVICE_ROUNDS.md).
#
#   bash bench/device/moemid.sh BIN OUTDIR
#
# R3 (final): the mid-batch path on by default since R2 (LASTSTAND_MG_MID=1, its parts on:
# mv_kernel gate/up with one barrier, mvd_kernel down, mvb_kernel BF16 shared expert, mr_kernel
# router, block-per-token top-k, PDL):
# 1. `laststand doctor --families moe` with the defaults (every cell checked against the fp64 CPU
#    reference) on synth:qwen3.5-35b-a3b,layers=1 and synth:qwen3.5-397b-a17b,layers=1 (NVFP4
#    experts, BF16 shared expert), M = 1..1024, and the 35B preset (NVFP4 shared expert in the
#    launch), M = 1..3072.
# 2. tests/test_gpu_moe_grouped.py -k "variants or mid" (every knob: the old path, the R2
#    variants, the presets with an NVFP4 shared expert).
# 3. End to end: `serve` of the full 40-layer synth Qwen3.5-35B-A3B with every plan named (no
#    doctor: --trust-backend; CUDA graphs checked against eager steps at start-up) + `bench` at
#    concurrency 16, 1024 in / 256 out, 32 prompts, defaults (R2 ran the old path: 1366 tok/s).
# Each step is bounded by `timeout`; the whole script stays under 120 s.
set -u
BIN=${1:?usage: moemid.sh BIN OUTDIR}
OUT=${2:?usage: moemid.sh BIN OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export LD_LIBRARY_PATH="$(dirname "$BIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
left() { echo $(( 116 - ($(date +%s) - T0) )); }
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null
B35="synth:qwen3.5-35b-a3b,layers=1"
B397="synth:qwen3.5-397b-a17b,layers=1"
OLD="LASTSTAND_MG_MID=0"
NEW="LASTSTAND_MG_MID=1"

# doctor TAG ENVS MODEL MS MAXS: the rows of the table, prefixed by TAG
doctor() {
    local tag=$1 envs=$2 model=$3 ms=$4 t=$5 l src
    l=$(left); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 5 ] || { echo "$tag: skipped (time)"; return; }
    if [ "${model#shapes:}" != "$model" ]; then src="--shapes ${model#shapes:}"; else src="--model-path $model"; fi
    env $envs timeout "$t" "$BIN" doctor --device cuda --families moe $src --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc"; tail -n 4 "$OUT/doc-$tag.err"; }
    grep -E "❌" "$OUT/doc-$tag.txt" | head -3
}

echo "== 1. doctor, the defaults ($(el))"
doctor def35 "" "$B35" 1,8,16,32,64,128,256,512,1024 13
doctor def397 "" "$B397" 16,32,64,256,1024 13
doctor pre35 "" shapes:qwen3.5-35b-a3b 1,3,16,64,100,512,3072 10

echo "== 2. pytest tests/test_gpu_moe_grouped.py -k 'variants or mid' ($(el))"
l=$(left); [ "$l" -gt 30 ] && l=30
if [ "$l" -ge 15 ] && python3 -c "import pytest" 2>/dev/null; then
    BUILD=$(dirname "$BIN") timeout "$l" python3 -m pytest -q tests/test_gpu_moe_grouped.py -k "variants or mid" 2>&1 | tail -n 4
else
    echo "skipped (time or no pytest)"
fi

PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt
       --lm-head-backend cuda_cublaslt)
# e2e TAG ENVS MAXS: serve the full 35B with the plans named + bench at concurrency 16
e2e() {
    local tag=$1 envs=$2 lim=$3 l
    l=$(left); [ "$l" -lt "$lim" ] && lim=$l
    [ "$lim" -ge 20 ] || { echo "e2e $tag: skipped (time)"; return; }
    echo "== 3. e2e $tag: serve synth:qwen3.5-35b-a3b (40 layers), named plans, CUDA graphs, $envs ($(el))"
    env $envs BIN="$BIN" PORT=$((31000 + $$ % 2000)) CONCURRENCY=16 NUM_PROMPTS=32 INPUT_LEN=1024 OUTPUT_LEN=256 \
        WARMUP=2 HEALTH_TIMEOUT=$(( lim - 8 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$tag" \
        qwen3.5-35b-a3b -- --device cuda "${PLANS[@]}" --trust-backend >"$OUT/e2e-$tag.out" 2>&1
    echo "rc=$? ($(el)) $(grep -E "startup_s" "$OUT/e2e-$tag/meta.txt" 2>/dev/null)"
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TTFT p50 ms | TPOT p50 ms | TPOT p99 ms" &&
        grep -E "^\| 16 \|" "$OUT/e2e-$tag/SUMMARY.md" | cut -d'|' -f2,4,6,8,10,11 | sed 's/^/  /'
    grep -E "CUDA graphs captured|ERROR|error|mismatch" "$OUT/e2e-$tag/server.log" 2>/dev/null | cut -c1-200 | head -3
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] || tail -4 "$OUT/e2e-$tag.out"
}
e2e default "" 62

echo "total $(el)"
