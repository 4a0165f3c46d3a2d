#!/bin/bash
# bench/device/accept.sh BIN OUTDIR: issue 5's acceptance runs on the GPU machine.
# device-limit: 420
#   1. the doctor with the three broken fp4_gemm backends on synth:qwen3.5-397b-a17b,layers=4
#      and on synth:qwen3.5-35b-a3b (each must finish in under 120 s, exit 0);
#   2. the end-to-end serving bench (bench/run_e2e.sh) on synth:qwen3.5-35b-a3b,layers=8,
#      512 in / 64 out, concurrency 1, 16, 64 (ACCEPT_E2E=0: not run).
set -u
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUT=$2
mkdir -p "$OUT"
for m in qwen3.5-397b-a17b,layers=4 qwen3.5-35b-a3b; do
    t0=$(date +%s.%N)
    LASTSTAND_TEST_BROKEN_BACKENDS=1 timeout 150 "$BIN" doctor --device cuda --model-path "synth:$m" \
        --json "$OUT/doctor-${m%%,*}.json" > "$OUT/doctor-${m%%,*}.txt" 2>&1
    rc=$?
    echo "== doctor synth:$m: exit $rc in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
    cat "$OUT/doctor-${m%%,*}.txt"
done
[ "${ACCEPT_E2E:-1}" = 0 ] && exit 0
echo "== e2e serve bench"
BIN=$BIN CONCURRENCY=1,16,64 NUM_PROMPTS=8,32,64 INPUT_LEN=512 OUTPUT_LEN=64 WARMUP=2 HEALTH_TIMEOUT=240 \
    timeout 200 bash bench/run_e2e.sh "$OUT/e2e" "qwen3.5-35b-a3b,layers=8" -- --device cuda
echo "e2e exit $?"
grep -i "backend\|standing\|graph\|doctor" "$OUT/e2e/server.log" | head -40
