#!/bin/bash
# bench/device/moedec.sh: the fused MoE decode at M = 1..8 (cuda_fused_decode, src/ops/cuda/moe_fused.cu),
# S10 task moedec: the three-launch form (the default at M >= 4 with a BF16 shared expert;
# LASTSTAND_MOE_DEC=0|1 forces it off|on: top-k in the router's last blocks, gate/up in 8-warp
# blocks playing the 16-warp slices, the shared expert's down rows inside the down kernel before
# its wait, expert tables prefetched into L2) against the four-launch chain. (What S10 left
# unmeasured, LASTSTAND_MOE_DEC=3, the four launches with the top-k moved into launch 1, and
# LASTSTAND_MOE_TKF=1, the router blocks' ticket as one release-acquire add, was deleted in S11 with
# this script's variants for them: bench/RESULTS.md, tidy2.)
# device-limit: 100
#
#   bash bench/device/moedec.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe --backends cuda_fused_decode` (fp64 CPU oracle; chained
#    timing) with the BF16 shared expert synth writes, at the 35B layer and the 397B TP-2 rank
#    shape (bench/device/moedec_rank: the 397B config with moe / shared intermediate 512, what
#    model_tp.c gives each of two ranks): old (DEC=0), the defaults, DEC=1.
# 2. `laststand generate` on the full 40-layer synth Qwen3.5-35B-A3B with CUDA graphs (512-token
#    prompt, 129 new tokens): the mean decode step (M = 1) per form, and the 129 greedy ids
#    compared (every form keeps every sum's order: they must be equal).
# 3. pytest tests/test_gpu_moe_fused.py -k DEC (time left).
. "$(dirname "$0")/lib.sh"
dev_init moedec 95 "$@"
RANK=$(cd "$(dirname "$0")" && pwd)/moedec_rank

# doctor TAG "ENV" SRC MS: rows prefixed with TAG
doctor() {
    local tag=$1 envs=$2 src=$3 ms=$4
    local t=$(left); [ "$t" -gt 10 ] && t=10
    [ "$t" -ge 5 ] || { echo "$tag: skipped (time)"; return; }
    local f="$OUT/doc-$tag"
    env $envs XDG_CACHE_HOME="$OUT/cache-$tag" timeout -k 2 "$t" "$BIN" doctor --device cuda --families moe \
        --model-path "$src" --m "$ms" --backends cuda_fused_decode >"$f.txt" 2>"$f.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$f.txt" | cut -c1-100 | sed "s/^/$tag /"
    [ $rc = 0 ] || { echo "$tag: rc=$rc"; grep -iE "error|fail|crash|unsupported|wrong" "$f.err" "$f.txt" | head -4; }
}
S35=synth:qwen3.5-35b-a3b,layers=1
OLD="LASTSTAND_MOE_DEC=0"
echo "== 1. doctor, BF16 shared expert, chained µs per call: old = $OLD, def = defaults, d1 = DEC=1 $(el)"
doctor 35b-old "$OLD" $S35 1,2,4,8
doctor 35b-def "" $S35 1,2,4,8
doctor 35b-d1 "LASTSTAND_MOE_DEC=1" $S35 1,2
doctor rank-old "$OLD" $RANK 1,2,4,8
doctor rank-def "" $RANK 1,2,4,8
echo "$(el)"

PLANS=("${DEV_PLANS_DECODE[@]}")
gen() { # tag "env"
    local t=$(left); [ "$t" -gt 20 ] && t=20
    [ "$t" -ge 12 ] || { echo "  gen $1: skipped (time)"; return; }
    env $2 timeout -k 3 "$t" "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 129 \
        --device cuda "${PLANS[@]}" >"$OUT/gen-$1.out" 2>&1
    local rc=$?
    printf '  %-6s rc=%d %s | %s\n' "$1" $rc "$(grep -oE '[0-9]+ decode steps[^|]*ms each' "$OUT/gen-$1.out" | head -1)" \
        "$(grep -oE '"ids": *\[[0-9, ]{0,40}' "$OUT/gen-$1.out" | head -1)"
    [ $rc = 0 ] || grep -iE "error|fail|fault|mismatch" "$OUT/gen-$1.out" | head -3
}
echo "== 2. decode step, full synth 35B (40 layers), CUDA graphs $(el)"
gen def ""
gen d1 "LASTSTAND_MOE_DEC=1"
a=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-def.out" 2>/dev/null)
for v in d1; do
    b=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$v.out" 2>/dev/null)
    echo "  greedy ids $v == def: $([ -n "$a" ] && [ "$a" = "$b" ] && echo yes || echo NO)"
done

echo "== 3. pytest tests/test_gpu_moe_fused.py -k DEC $(el)"
export BUILD=$D LS_SHARED=$D
t=$(left)
if [ "$t" -ge 15 ]; then
    timeout -k 3 "$t" python3 -m pytest -q -p no:cacheprovider -rA tests/test_gpu_moe_fused.py -k DEC 2>&1 |
        grep -E "PASSED|FAILED|ERROR|passed|failed"
else
    echo "skipped (time)"
fi
echo "total $(el)"
