#!/usr/bin/env bash
# device-limit: 240
# bench/device/dec30.sh BIN OUTDIR: where the decode step of the synth Qwen3-30B-A3B (NVFP4
# experts, 48 attention layers, no shared expert) goes, against the Qwen3.5-35B-A3B's.
# 0. test_moe_plan_cuda (the routing kernels after S13's deletions; not run on a GPU since),
#    test_attn_cuda and tests/test_gpu_attn_graph.py (the row plan's short-context chunks).
# 1. The engine's mean decode step with CUDA graphs (`generate`, 512-token prompt + 129 new
#    tokens, DEV_PLANS_DECODE), the full 30B and the full 35B, and 8-layer versions of both;
#    each also with LASTSTAND_FP_SHORT=0 (attention decode chunks of 128 keys whatever the
#    context, the plan before S14) and the 129 greedy ids compared.
# 2. ncu (--clock-control none --cache-control none) over an eager `generate` of each 8-layer
#    model: 256-token prompt + 3 tokens; decprof_table.py tabulates the last forward (a decode
#    step at M = 1): per kernel µs, DRAM MB, GB/s, and per kernel name.
. "$(dirname "$0")/lib.sh"
dev_init dec30 235 "$@"
PLANS=("${DEV_PLANS_DECODE[@]}")
Q30="qwen3-30b-a3b,quant=nvfp4"
Q35="qwen3.5-35b-a3b"

if [ -x "$D/tests/test_moe_plan_cuda" ]; then
    echo "== cmocka test_moe_plan_cuda $(el)"
    timeout -k 3 60 "$D/tests/test_moe_plan_cuda" >"$OUT/test_moe_plan_cuda.log" 2>&1
    echo "rc=$? (0: every test passed) $(el)"
    grep -E "^\[  (PASSED|FAILED) \]" "$OUT/test_moe_plan_cuda.log" | head -4
fi
for fs in "" 0; do
    echo "== cmocka test_attn_cuda${fs:+ LASTSTAND_FP_SHORT=$fs} $(el)"
    LASTSTAND_FP_SHORT=$fs timeout -k 3 60 "$D/tests/test_attn_cuda" >"$OUT/test_attn_cuda$fs.log" 2>&1
    echo "rc=$? $(el)"
    grep -E "^\[  (PASSED|FAILED) \]|FAIL" "$OUT/test_attn_cuda$fs.log" | head -4
done
echo "== pytest tests/test_gpu_attn_graph.py $(el)"
BUILD=$D LS_SHARED=$D timeout -k 3 80 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_attn_graph.py 2>&1 | tail -3

gen() { # tag preset limit [VAR=V ...]; the greedy ids to OUT/ids-TAG
    local tag=$1 preset=$2 lim=$3
    shift 3
    echo "== gen $tag: synth:$preset, 512 + 129 tokens, CUDA graphs${*:+, env $*} $(el)"
    env "$@" timeout -k 3 "$lim" "$BIN" generate --model-path "synth:$preset" --ids "$(ids 512)" --max-new-tokens 129 \
        --device cuda "${PLANS[@]}" >"$OUT/gen-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "decode steps of|loaded in|rror" "$OUT/gen-$tag.out" | cut -c1-200 | head -4
    grep -o '"ids": *\[[0-9, ]*\]' "$OUT/gen-$tag.out" | head -1 >"$OUT/ids-$tag"
}
same() { cmp -s "$OUT/ids-$1" "$OUT/ids-$2" && echo "greedy ids $1 == $2" || echo "greedy ids $1 != $2: $(head -c 120 "$OUT/ids-$1") / $(head -c 120 "$OUT/ids-$2")"; }
prof() { # tag preset limit
    local tag=$1 preset=$2 lim=$3
    [ -n "$NCU" ] || { echo "no ncu"; return; }
    echo "== ncu $tag: synth:$preset eager, 256-token prompt + 3 tokens $(el)"
    rm -f "$OUT/ncu-$tag.ncu-rep"
    timeout -k 3 "$lim" "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-$tag" \
        "$BIN" generate --model-path "synth:$preset" --ids "$(ids 256)" --max-new-tokens 3 --device cuda \
        --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu-$tag.out" 2>&1
    echo "rc=$? $(el)"
    if [ -f "$OUT/ncu-$tag.ncu-rep" ]; then
        timeout 30 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$tag.csv" 2>/dev/null
        timeout 20 python3 bench/device/decprof_table.py "$OUT/ncu-$tag.csv" "$tag"
    else
        tail -5 "$OUT/ncu-$tag.out"
    fi
}
gen q30-l8 "$Q30,layers=8" 25
gen q30-l8-old "$Q30,layers=8" 25 LASTSTAND_FP_SHORT=0
same q30-l8 q30-l8-old
gen q35-l8 "$Q35,layers=8" 25
gen q35-l8-old "$Q35,layers=8" 25 LASTSTAND_FP_SHORT=0
same q35-l8 q35-l8-old
prof q30-l8 "$Q30,layers=8" 45
[ "$(left)" -gt 50 ] && gen q30 "$Q30" 50
[ "$(left)" -gt 50 ] && gen q30-old "$Q30" 50 LASTSTAND_FP_SHORT=0
[ "$(left)" -gt 40 ] && gen q35 "$Q35" 40
[ "$(left)" -gt 40 ] && gen q35-old "$Q35" 40 LASTSTAND_FP_SHORT=0
echo "done $(el)"
