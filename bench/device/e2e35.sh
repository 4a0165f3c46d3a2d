#!/bin/bash
# bench/device/e2e35.sh BIN OUTDIR: end-to-end serving of the full-size synth Qwen3.5-35B-A3B
# (all 40 layers, random weights, NVFP4 experts) on the GPU: `serve` with every backend flag on
# auto (the doctor, the depth-limited smoke test, the last backend standing table), then
# bench/run_e2e.sh at concurrency 1 and 16 (1024 in / 256 out). Prints the bench table, the
# server's start-up time, the table of chosen backends and any backend the smoke test refused.
# E2E_EXTRA="..." adds serve flags (e.g. --mamba-ssm-dtype bfloat16).
# device-limit: 260
set -u
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUT=$2
mkdir -p "$OUT"
XDG_CACHE_HOME="$OUT/cache" BIN=$BIN CONCURRENCY=${CONC:-1,16} NUM_PROMPTS=${NP:-8,32} INPUT_LEN=1024 OUTPUT_LEN=256 \
    WARMUP=2 HEALTH_TIMEOUT=200 PORT=$((32000 + $$ % 2000)) \
    timeout 240 bash bench/run_e2e.sh "$OUT/e2e" qwen3.5-35b-a3b -- --device cuda ${E2E_EXTRA:-} 2>&1 | tail -8
echo "== start-up: $(grep startup_s "$OUT/e2e/meta.txt" 2>/dev/null)"
echo "== smoke test and the last backend standing"
grep -E "smoke test|standing|^\[.*INFO\]   [a-z0-9_]+ +cuda|refused|REFUSED|eliminated" "$OUT/e2e/server.log" | cut -c1-260
grep -E "decode steps|graphs" "$OUT/e2e/server.log" | tail -3 | cut -c1-200
