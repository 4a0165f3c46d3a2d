#!/usr/bin/env bash
# device-limit: 150
# bench/device/snapin.sh: GDN prefix-cache snapshots inside the prefill step (S9), for the
# integrator's device rounds (notes DEVICE_ROUNDS.md).
#
#   bash bench/device/snapin.sh BIN OUTDIR
#
# Reads the fixture models at dir-of-BIN/fixtures/models (= ../shared/fixtures/models) and the
# cmocka binary dir-of-BIN/tests/test_prefix_cuda.
# 1. test_prefix_cuda (test_in_step_snapshot_on_cuda_equals_the_cut_steps): one prefill step
#    with in-step snapshots at tokens 8 and 13 vs the prefill cut there (synth:demo, synth 35B
#    at 4 layers, the qwen3_next fixture): logits, and each snapshot continued in another slot.
# 2. tests/test_gpu_prefix_cache.py with the defaults (in-step snapshots since S9-R1): fixture
#    hits vs cache off, the synth 35B two-turn conversation, a miss in one prefill step
#    (PREFIX_STEPS).
# 3. TTFT (bench/device/snapin_ttft.py): full synth Qwen3.5-35B-A3B (40 layers), misses and hits
#    at 1024 and 4096 tokens, modes step / off / step_r1 (the gdn pieces over the whole step's
#    rows, as in R1) / cut (as many as the time allows).
# Verdict lines: "snapin: cmocka PASS|FAIL", "snapin: GPU test PASS|FAIL", SNAPIN lines.
. "$(dirname "$0")/lib.sh"
DEV_CACHE=1 dev_init snapin 145 "$@"   # the doctor's and smoke test's verdicts, reused by later starts

# 1. the model-level check on CUDA
LS_SHARED="$D" timeout 40 "$D/tests/test_prefix_cuda" > "$OUT/test_prefix.log" 2>&1
rc=$?
grep -E "vs without|vs from the cut|RUN .*cuda|OK .*cuda|SKIPPED|PASSED|FAILED|ERROR|error" "$OUT/test_prefix.log" | head -20 | cut -c1-300
ok=FAIL; [ $rc -eq 0 ] && grep -q "vs without" "$OUT/test_prefix.log" && ok=PASS
echo "snapin: cmocka $ok (exit $rc) $(el)"

# 2. the GPU prefix-cache tests (in-step snapshots: the default)
BUILD="$D" LS_SHARED="$D" timeout 65 python3 -m pytest -q -s -p no:cacheprovider \
    tests/test_gpu_prefix_cache.py > "$OUT/pytest.log" 2>&1
rc=$?
grep -E "PREFIX_TTFT|PREFIX_FIXTURE|PREFIX_STEPS|passed|failed|skipped|Error|assert" "$OUT/pytest.log" | head -30 | cut -c1-600
if [ $rc -ne 0 ]; then
    echo "== pytest exit $rc; the tail:"
    tail -30 "$OUT/pytest.log" | cut -c1-400
fi
ok=FAIL; [ $rc -eq 0 ] && grep -q " passed" "$OUT/pytest.log" && ok=PASS
echo "snapin: GPU test $ok $(el)"

# 3. TTFT at 40 layers, per mode, while time is left
L=$(left)
if [ "$L" -gt 40 ]; then
    # streamed: the lines of the modes that finished survive a kill at the round's limit
    timeout "$L" python3 -u bench/device/snapin_ttft.py --bin "$BIN" --modes "${SNAPIN_MODES:-step,off,step_r1,cut}" \
        --deadline $(( T0 + DEV_BUDGET )) --need 38 -- --max-running-requests 4 --cuda-graph-max-bs 4 \
        --context-length 16384 2>&1 | tee "$OUT/ttft.log" | grep --line-buffered -E "^SNAPIN |Error|error"
    echo "== TTFT exit ${PIPESTATUS[0]}"
else
    echo "== TTFT: skipped ($L s left)"
fi
echo "snapin: done $(el)"
