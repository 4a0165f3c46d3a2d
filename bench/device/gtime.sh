#!/usr/bin/env bash
# device-limit: 170
# bench/device/gtime.sh BIN OUTDIR: the gtime session's GPU checks (bench/RESULTS.md, "fp4_gemm at
# M = 1 [4096 x 4096]: the floor behind a hold and in CUDA graphs (S6)"):
#  1. bench/kernels/gemv_floor.cu built here and run in its `graph` mode: the no-load chain, the
#     pure read and the real default GEMV at [4096 x 4096], each timed three ways (stream, stream
#     behind a hold kernel as the doctor times, a captured CUDA graph behind a hold), chains of 8
#     and 32 on 32 rotating sets; 8 x 4 / 4 x 8 variants at their natural occupancy (only with
#     GT_FLOOR=1: recorded already; GT_FLOOR=fp8 runs the FP8 split-x prototype instead);
#  2. tests/test_gpu_named_backends.py: a backend named on the command line that cannot run the
#     model is refused at load (exit 2, the flag, plan, layer and reason), not at a decode step;
#  3. the doctor at M = 1 and 16 on the synth 35B shapes, every family (what a concurrency-16
#     decode step spends per op).
set -u
BIN=${1:?usage: gtime.sh BIN OUTDIR}
OUT=${2:?usage: gtime.sh BIN OUTDIR}
mkdir -p "$OUT"
D=$(cd "$(dirname "$BIN")" && pwd)
export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
echo "== 1. gemv_floor graph"
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [ "${GT_FLOOR:-0}" = 0 ]; then
  echo "floor: skipped (GT_FLOOR=1 runs it)"
elif [ -n "$NVCC" ] && timeout 60 "$NVCC" -O3 -std=c++17 -Isrc -gencode=arch=compute_90a,code=sm_90a \
     -o "$OUT/gemv_floor" bench/kernels/gemv_floor.cu > "$OUT/floor_build.log" 2>&1; then
  mode=graph; [ "$GT_FLOOR" = fp8 ] && mode=fp8
  timeout 30 "$OUT/gemv_floor" $mode 2>&1; echo "floor rc=$?"
else
  echo "floor: no nvcc or the build failed:"; tail -5 "$OUT/floor_build.log" 2>/dev/null
fi
echo "($(( $(date +%s) - T0 )) s)"
echo "== 2. tests/test_gpu_named_backends.py"
BUILD=$D LS_SHARED=$D timeout 60 python3 -m pytest -q -p no:cacheprovider -rfEs tests/test_gpu_named_backends.py 2>&1 | tail -30
echo "($(( $(date +%s) - T0 )) s)"
echo "== 3. the decode step's ops at M = 1 and 16 (concurrency 16), synth 35B shapes, every family (attention: decode rows at context 1100)"
LASTSTAND_DOCTOR_ATTN_CTX=1100 XDG_CACHE_HOME=$OUT/cache timeout 100 "$BIN" doctor --device cuda \
  --model-path synth:qwen3.5-35b-a3b --m 1,16 --json "$OUT/doc16.json" 2>"$OUT/doc16.err" | grep -v "^$" | head -80
echo "doctor rc=${PIPESTATUS[0]} ($(( $(date +%s) - T0 )) s)"; tail -3 "$OUT/doc16.err"
