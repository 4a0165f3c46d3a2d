#!/bin/bash
# bench/device/moedec.sh: the fused MoE decode at M = 1..8 (cuda_fused_decode, src/ops/cuda/moe_fused.cu),
# S10 task moedec: the three-launch form (the default at M >= 4 with a BF16 shared expert;
# LASTSTAND_MOE_DEC=0|1 forces it off|on: top-k in the router's last blocks, gate/up in 8-warp
# blocks playing the 16-warp slices, the shared expert's down rows inside the down kernel before
# its wait, expert tables prefetched into L2) against the four-launch chain, and what S10 left
# unmeasured: LASTSTAND_MOE_DEC=3 (four launches, the top-k moved into launch 1) and
# LASTSTAND_MOE_TKF=1 (the router blocks' ticket as one release-acquire add).
# device-limit: 100
#
#   bash bench/device/moedec.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe --backends cuda_fused_decode` (fp64 CPU oracle; chained
#    timing) with the BF16 shared expert synth writes, at the 35B layer and the 397B TP-2 rank
#    shape (bench/device/moedec_rank: the 397B config with moe / shared intermediate 512, what
#    model_tp.c gives each of two ranks): old (DEC=0), the defaults, the opt-in forms.
# 2. `laststand generate` on the full 40-layer synth Qwen3.5-35B-A3B with CUDA graphs (512-token
#    prompt, 129 new tokens): the mean decode step (M = 1) per form, and the 129 greedy ids
#    compared (every form keeps every sum's order: they must be equal).
# 3. ncu (warm caches, clocks not locked): per kernel time, DRAM, occupancy, issue, stall reasons,
#    35B, M = 1, DEC=3 with the release-acquire ticket.
# 4. pytest tests/test_gpu_moe_fused.py -k DEC (time left).
. "$(dirname "$0")/lib.sh"
dev_init moedec 95 "$@"
RANK=$(cd "$(dirname "$0")" && pwd)/moedec_rank
TAB=$(cd "$(dirname "$0")" && pwd)/moedec_tab.py

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
D3="LASTSTAND_MOE_DEC=3 LASTSTAND_MOE_TKF=1"
echo "== 1. doctor, BF16 shared expert, chained µs per call: old = $OLD, def = defaults, d1 = DEC=1, d3 = $D3 $(el)"
doctor 35b-old "$OLD" $S35 1,2,4,8
doctor 35b-def "" $S35 1,2,4,8
doctor 35b-d1 "LASTSTAND_MOE_DEC=1" $S35 1,2
doctor 35b-d1tkf "LASTSTAND_MOE_DEC=1 LASTSTAND_MOE_TKF=1" $S35 1,2
doctor 35b-d3 "$D3" $S35 1,2
doctor rank-old "$OLD" $RANK 1,2,4,8
doctor rank-def "" $RANK 1,2,4,8
doctor rank-d3 "$D3" $RANK 1,2
echo "$(el)"

ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt)
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
gen d1tkf "LASTSTAND_MOE_DEC=1 LASTSTAND_MOE_TKF=1"
gen d3 "$D3"
a=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-def.out" 2>/dev/null)
for v in d1 d1tkf d3; do
    b=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$v.out" 2>/dev/null)
    echo "  greedy ids $v == def: $([ -n "$a" ] && [ "$a" = "$b" ] && echo yes || echo NO)"
done

MET=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
for s in long_scoreboard barrier lg_throttle wait short_scoreboard mio_throttle math_pipe_throttle no_instruction drain not_selected selected dispatch_stall membar sleeping branch_resolving; do
    MET=$MET,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
if command -v ncu >/dev/null; then
    for c in 35b-d3; do
        t=$(left); [ "$t" -gt 20 ] && t=20
        [ "$t" -ge 12 ] || { echo "ncu $c: skipped (time)"; continue; }
        echo "== 3. ncu $c, M = 1 (warm caches, clocks not locked) $(el)"
        env $D3 XDG_CACHE_HOME="$OUT/cache-ncu" timeout -k 2 "$t" ncu --clock-control none --cache-control none \
            -k regex:moe_ --launch-skip 12 --launch-count 4 --metrics "$MET" --csv "$BIN" doctor --device cuda \
            --families moe --model-path "$S35" --m 1 --backends cuda_fused_decode >"$OUT/ncu-$c.csv" 2>"$OUT/ncu-$c.err"
        echo "  rc=$?"
        timeout 15 python3 "$TAB" ncu "$OUT/ncu-$c.csv"
        grep -iE "==ERR|error" "$OUT/ncu-$c.err" | head -3
    done
fi

echo "== 4. pytest tests/test_gpu_moe_fused.py -k DEC $(el)"
export BUILD=$D LS_SHARED=$D
t=$(left)
if [ "$t" -ge 15 ]; then
    timeout -k 3 "$t" python3 -m pytest -q -p no:cacheprovider -rA tests/test_gpu_moe_fused.py -k DEC 2>&1 |
        grep -E "PASSED|FAILED|ERROR|passed|failed"
else
    echo "skipped (time)"
fi
echo "total $(el)"
