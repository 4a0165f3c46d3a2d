#!/usr/bin/env bash
# device-limit: 570
# bench/device/family.sh BIN OUTDIR: the other full-size members of the family on one H200, each
# served as a user would start it (every backend flag on auto: the doctor, the depth-limited smoke
# test, the last backend standing table, CUDA graphs), then `laststand bench` (bench/run_e2e.sh)
# at concurrency 1 and 16, 1024 in / 256 out:
#   synth:qwen3.5-122b-a10b (Qwen3.5 GDN + gated attention, 256 experts top-8, H 3072, 48 layers),
#   synth:qwen3-next-80b-a3b,quant=nvfp4 (Qwen3-Next: fused qkvz / ba, 512 experts top-10, NVFP4 experts),
#   synth:qwen3-30b-a3b,quant=nvfp4 (Qwen3-MoE: attention only, 128 experts top-8, no shared expert).
# FAMILY_PRESETS overrides the list; FAMILY_SERVE_FLAGS adds serve flags (e.g. "--tp 2" on a
# 2-GPU machine for FAMILY_PRESETS=qwen3-235b-a22b,quant=nvfp4: ~130 GB of weights); each run is
# bounded by what is left of the budget.
# Per model: start-up time, the chosen backends and anything the smoke test refused, the
# engine's mean decode step, and the bench table.
. "$(dirname "$0")/lib.sh"
dev_init family 565 "$@"
export NCCL_NVLS_ENABLE=0 # multi-GPU runs (FAMILY_SERVE_FLAGS="--tp 2")
PRESETS=(${FAMILY_PRESETS:-qwen3.5-122b-a10b qwen3-next-80b-a3b,quant=nvfp4 qwen3-30b-a3b,quant=nvfp4})
n=${#PRESETS[@]}
i=0
for p in "${PRESETS[@]}"; do
    lim=$(( ($(left) - 5) / (n - i) ))
    i=$((i + 1))
    [ "$lim" -gt 60 ] || { echo "== $p skipped (time)"; continue; }
    echo "== $p: serve (auto) + bench c = 1, 16, limit $lim s $(el)"
    XDG_CACHE_HOME="$OUT/cache" BIN=$BIN CONCURRENCY=1,16 NUM_PROMPTS=${NP:-4,32} INPUT_LEN=1024 OUTPUT_LEN=256 \
        WARMUP=1 HEALTH_TIMEOUT=$((lim - 40)) PORT=$((32000 + $$ % 2000 + i)) \
        timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/$p" "$p" -- --device cuda ${FAMILY_SERVE_FLAGS:-} >"$OUT/$p.out" 2>&1
    echo "rc=$? $(el)"
    tail -4 "$OUT/$p/bench.txt" 2>/dev/null || tail -5 "$OUT/$p.out"
    echo "   start-up: $(grep startup_s "$OUT/$p/meta.txt" 2>/dev/null)"
    grep -E "smoke test|refused|REFUSED|eliminated|error|ERROR" "$OUT/$p/server.log" 2>/dev/null | cut -c1-220 | head -6
    grep -E "^\[.*INFO\]   [a-z0-9_]+ +cuda" "$OUT/$p/server.log" 2>/dev/null | cut -c1-200 | head -8
    grep -E "decode steps|graphs" "$OUT/$p/server.log" 2>/dev/null | tail -2 | cut -c1-200
done
echo "family: done $(el)"
