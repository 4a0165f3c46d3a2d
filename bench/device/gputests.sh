#!/bin/bash
# bench/device/gputests.sh BIN OUTDIR: the GPU tests that CI can only skip, run on the GPU machine.
# - every CUDA cmocka binary staged beside BIN (tests/test_*: test_sample_cuda, test_gemv_cuda,
#   test_ops_device, test_graph_ops ...), one verdict line each;
# - pytest on tests/test_gpu_*.py with the staged binary (BUILD=dir of BIN) and the fixtures
#   staged at dir-of-BIN/fixtures/models (LS_SHARED), per-test limit 90 s.
# GPUTESTS_CMOCKA=0 skips the cmocka binaries; GPUTESTS_FILES (names or globs under tests/,
# space-separated, default test_gpu_*.py) picks the pytest files.
# device-limit: 360 (S9-R3: cut at 260 s, before pytest printed anything)
set -u
BIN=${1:?usage: gputests.sh BIN OUTDIR}
OUT=${2:?usage: gputests.sh BIN OUTDIR}
D=$(cd "$(dirname "$BIN")" && pwd)
mkdir -p "$OUT"
[ "${GPUTESTS_CMOCKA:-1}" = 0 ] || for t in "$D"/tests/test_*; do
    [ -x "$t" ] || continue
    n=$(basename "$t")
    t0=$SECONDS
    LD_LIBRARY_PATH=$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout -k 5 60 "$t" >"$OUT/$n.log" 2>&1
    rc=$?
    printf 'cmocka %-20s rc=%d %3d s  %s\n' "$n" "$rc" $((SECONDS - t0)) \
        "$(grep -E '^\[  (PASSED|FAILED) \]' "$OUT/$n.log" | tr '\n' ' ')"
    [ $rc -ne 0 ] && tail -20 "$OUT/$n.log"
done
export BUILD=$D LS_SHARED=$D
# streamed, not piped through tail: a round that runs out of time still shows every verdict so far
FILES=$(cd tests && for f in ${GPUTESTS_FILES:-test_gpu_*.py}; do echo "tests/$f"; done)
python3 -u -m pytest -v -p no:cacheprovider --timeout 90 -rfEs --durations=15 $FILES 2>&1
