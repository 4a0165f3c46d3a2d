#!/usr/bin/env bash
# device-limit: 230
# bench/device/s21final.sh BIN OUTDIR: S21's closing GPU check of the early shared expert
# (cuda_grouped_gemm, LASTSTAND_MG_SHEARLY): pytest tests/test_gpu_moe_grouped.py (all) and
# tests/test_gpu_family_shapes.py, then dectrace.sh at B = 16 (the step's kernels on the timeline).
. "$(dirname "$0")/lib.sh"
dev_init s21final 225 "$@"
for t in test_gpu_moe_grouped test_gpu_family_shapes; do
    echo "== pytest $t $(el)"
    (cd "$(dirname "$D")" && timeout -k 3 100 python3 -m pytest -q tests/$t.py 2>&1 | tail -4)
done
if [ "$(left)" -gt 35 ]; then
    TRACE_B=16 timeout -k 3 $(( $(left) - 5 )) bash bench/device/dectrace.sh "$BIN" "$OUT/trace16" 2>&1 |
        grep -vE "^ +[0-9]+ " | head -32
fi
echo "done $(el)"
