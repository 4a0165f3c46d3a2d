#!/usr/bin/env bash
# device-limit: 90
# bench/device/prefix.sh: automatic prefix caching on the GPU, for the integrator's device
# rounds (notes DEVICE_ROUNDS.md).
#
#   bash bench/device/prefix.sh BIN OUTDIR
#
# Reads the fixture models at dir-of-BIN/fixtures/models (= ../shared/fixtures/models).
# 1. tests/test_gpu_prefix_cache.py against BIN (--device cuda, CUDA graphs on, --prefix-cache
#    on): fixture hits follow transformers' greedy ids and `generate --prefix-cache off`'s; synth
#    Qwen3.5-35B-A3B (8 layers) two-turn conversation in ids, turn 2 against a cache-off server;
#    no page leaks at idle. Its PREFIX_TTFT line: TTFT (latency of a 1-token /generate) of a
#    turn following a 2000-token turn 1 + 40 output tokens, with the cache (hit) and without.
# 2. The start-up log lines of the cache (capacity, snapshot slots and their size).
# 3. (time left) the mean decode step of `generate` (one request) with the cache on and off:
#    what the snapshot copy at every 16th token costs.
# Verdict line: "prefix: GPU test PASS|FAIL".
DEV_CACHE=1
. "$(dirname "$0")/lib.sh"
dev_init prefix 0 "$@"

BUILD="$D" LS_SHARED="$D" timeout 85 python3 -m pytest -q -s -p no:cacheprovider tests/test_gpu_prefix_cache.py \
    > "$OUT/pytest.log" 2>&1
rc=$?
grep -E "PREFIX_TTFT|PREFIX_FIXTURE|passed|failed|skipped|Error|assert" "$OUT/pytest.log" | head -30 | cut -c1-400
if [ $rc -ne 0 ]; then
    echo "== pytest exit $rc; the tail:"
    tail -40 "$OUT/pytest.log" | cut -c1-400
fi
ok=FAIL; [ $rc -eq 0 ] && grep -q " passed" "$OUT/pytest.log" && ok=PASS
echo "prefix: GPU test $ok ($(( $(date +%s) - T0 )) s)"

# 3. (time left) what the decode-time snapshots cost: one request, 512-token prompt + 129 new
#    tokens on synth 35B (8 layers), the mean decode step with the cache on and off
ids=$(python3 -c "print(','.join(str((1000 + i * 7919) % 200000) for i in range(512)))")
for pc in on off; do
    left=$(( 88 - ($(date +%s) - T0) ))
    [ $left -lt 12 ] && { echo "== decode cost: skipped (time)"; break; }
    timeout $left "$BIN" generate --model-path synth:qwen3.5-35b-a3b,layers=8 --device cuda --ids "$ids" \
        --max-new-tokens 129 --prefix-cache $pc > "$OUT/gen-$pc.json" 2> "$OUT/gen-$pc.log"
    echo "== decode, --prefix-cache $pc (exit $?): $(grep -oE '[0-9]+ decode steps.*' "$OUT/gen-$pc.log" | cut -c1-120)"
done
[ -s "$OUT/gen-on.json" ] && [ -s "$OUT/gen-off.json" ] && \
    echo "== decode ids on vs off: $(cmp -s "$OUT/gen-on.json" "$OUT/gen-off.json" && echo same || echo DIFFERENT)"
