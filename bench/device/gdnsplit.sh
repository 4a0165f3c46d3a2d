#!/usr/bin/env bash
# device-limit: 420
# bench/device/gdnsplit.sh BIN OUTDIR: a step's GDN decode rows apart from its prompt chunks
# (model_qwen3_next.c, LASTSTAND_GDN_SPLIT). 1. The GPU tests of mixed steps and in-step
# snapshots: test_prefix_cuda, tests/test_gpu_prefix_cache.py. 2. serve on auto + the bench at
# concurrency CONC (default 16,64,128,256; 1024 in / 256 out), with the split (the default) and,
# when SPLIT0=1, without (LASTSTAND_GDN_SPLIT=0).
. "$(dirname "$0")/lib.sh"
dev_init gdnsplit 415 "$@"
export DEV_CACHE=1 XDG_CACHE_HOME="$OUT/cache"
echo "== cmocka test_prefix_cuda $(el)"
timeout -k 3 60 "$D/tests/test_prefix_cuda" >"$OUT/test_prefix_cuda.log" 2>&1
echo "rc=$? $(grep -E '^\[  (PASSED|FAILED) \]' "$OUT/test_prefix_cuda.log" | tr '\n' ' ')"
echo "== pytest tests/test_gpu_prefix_cache.py $(el)"
BUILD=$D LS_SHARED=$D timeout -k 3 120 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_prefix_cache.py 2>&1 | tail -3
bench() { # tag [env]
    local tag=$1
    shift
    echo "== serve on auto + bench ($tag) $(el)"
    env "$@" BIN=$BIN CONCURRENCY=${CONC:-16,64,128,256} NUM_PROMPTS=${NP:-32,128,256,512} \
        INPUT_LEN=1024 OUTPUT_LEN=256 WARMUP=2 HEALTH_TIMEOUT=300 PORT=$((32000 + $$ % 2000)) \
        timeout $(( $(left) - 10 )) bash bench/run_e2e.sh "$OUT/e2e-$tag" qwen3.5-35b-a3b -- --device cuda 2>&1 | grep -E "^\| [0-9]|Headline"
    grep -E "decode steps|graphs:" "$OUT/e2e-$tag/server.log" | cut -c1-200
}
bench split
[ "${SPLIT0:-0}" = 1 ] && bench nosplit LASTSTAND_GDN_SPLIT=0
echo "done $(el)"
