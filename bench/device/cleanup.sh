#!/usr/bin/env bash
# bench/device/cleanup.sh BIN OUTDIR: the GPU tests of what task cleanup moved or deleted
# (device rounds, notes: DEVICE_ROUNDS.md).
# device-limit: 100
#
# - src/ops/cuda/moe_grouped.cu -> moe_mid.cu (the mid-batch GEMVs and router, moved):
#   tests/test_gpu_moe_grouped.py (the doctor against the fp64 CPU reference with every
#   LASTSTAND_MG_* variant, the mid-batch GEMVs at both Qwen3.5 shapes, logits vs the CPU);
# - src/model/model.c -> model_backends.c (the lm_head's selection, the named-backend check):
#   tests/test_gpu_named_backends.py, and the cmocka binaries beside BIN that open models on
#   the GPU (test_ops_device, test_graph_ops, test_gemv_cuda);
# - src/ops/cuda/moe_fused.cu (the one- and three-launch forms deleted; the four launches
#   unchanged): tests/test_gpu_moe_fused.py (every remaining knob);
# - tied embeddings: tests/test_gpu_tied.py (`--device cuda` against the transformers
#   reference with every lm_head plan the doctor may pick) and tests/test_tied_embeddings.py
#   (the CPU bar), on tests/fixtures/tied; while that is not in the tree, on fixtures made here
#   by bench/tied/gen_tied.py (seed 5, as bench/device/tied.sh) into OUTDIR/tied.
# Fixtures: .dev/int/fixtures/models (copied from ../shared/fixtures/models) as LS_SHARED
# (= the folder of BIN, as gputests.sh).
# Each part is bounded by what is left of 95 s; the most important first (moe_fused, checked in
# R1 and unchanged since, last: skipped when under 40 s are left).
set -u
BIN=${1:?usage: cleanup.sh BIN OUTDIR}
OUT=${2:?usage: cleanup.sh BIN OUTDIR}
D=$(cd "$(dirname "$BIN")" && pwd)
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
T0=$(date +%s)
left() { echo $(( 95 - ($(date +%s) - T0) )); }
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null
export BUILD=$D LS_SHARED=$D
run_py() { # name, files...
    local n=$1; shift
    local l; l=$(left)
    if [ "$l" -lt 8 ]; then echo "== $n: skipped (time)"; return; fi
    echo "== $n (limit ${l} s)"
    timeout -k 3 "$l" python3 -m pytest -q -p no:cacheprovider --timeout 60 -rfEs --durations=5 "$@" \
        >"$OUT/$n.log" 2>&1
    echo "rc=$? ($(( $(date +%s) - T0 )) s)"
    grep -E "passed|failed|error|FAILED|ERROR|SKIPPED" "$OUT/$n.log" | tail -25
}
if [ ! -d tests/fixtures/tied ]; then
    echo "== tied fixtures: bench/tied/gen_tied.py $OUT/tied 5"
    timeout 40 python3 bench/tied/gen_tied.py "$OUT/tied" 5 >"$OUT/gen_tied.log" 2>&1
    echo "rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^==|greedy|FAILED|Error" "$OUT/gen_tied.log" | head -8
    export LS_TIED_FIXTURES=$OUT/tied
fi
run_py tied tests/test_gpu_tied.py tests/test_tied_embeddings.py
run_py moe_grouped tests/test_gpu_moe_grouped.py
run_py named_backends tests/test_gpu_named_backends.py
for n in test_ops_device test_graph_ops test_gemv_cuda; do
    t=$D/tests/$n
    [ -x "$t" ] || { echo "cmocka $n: not staged"; continue; }
    l=$(left); [ "$l" -lt 5 ] && { echo "cmocka $n: skipped (time)"; continue; }
    [ "$l" -gt 30 ] && l=30
    t1=$(date +%s)
    timeout -k 2 "$l" "$t" >"$OUT/$n.log" 2>&1
    rc=$?
    printf 'cmocka %-16s rc=%d %3d s  %s\n' "$n" "$rc" $(( $(date +%s) - t1 )) \
        "$(grep -E '^\[  (PASSED|FAILED)' "$OUT/$n.log" | tr '\n' ' ')"
    [ $rc -ne 0 ] && tail -15 "$OUT/$n.log"
done
if [ "$(left)" -ge 40 ]; then run_py moe_fused tests/test_gpu_moe_fused.py; else echo "== moe_fused: skipped (time)"; fi
echo "total $(( $(date +%s) - T0 )) s"
