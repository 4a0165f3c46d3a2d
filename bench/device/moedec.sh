#!/bin/bash
# bench/device/moedec.sh: the fused MoE decode at M = 1..8 (cuda_fused_decode, src/ops/cuda/moe_fused.cu),
# S10 task moedec: the three-launch form (LASTSTAND_MOE_DEC=1: top-k in the router's last block,
# gate/up in 8-warp blocks playing the 16-warp slices, the BF16 shared expert's down rows inside the
# down kernel before its wait; expert tables prefetched into L2; DEC=2: the shared gate/up rows moved
# from launch 1 into launch 2's first blocks, no wait) against the four-launch chain (the default),
# for the integrator's device rounds.
# device-limit: 240
#
#   bash bench/device/moedec.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe --backends cuda_fused_decode` (fp64 CPU oracle; chained
#    timing) with the BF16 shared expert synth writes, at the 35B layer, the 397B TP-2 rank shape
#    (bench/device/moedec_rank: the 397B config with moe / shared intermediate 512, what
#    model_tp.c gives each of two ranks) and the full 397B layer; old vs new and the parts.
# 2. `laststand generate` on the full 40-layer synth Qwen3.5-35B-A3B with CUDA graphs (512-token
#    prompt, 129 new tokens): the mean decode step, old vs new, and the 129 greedy ids compared
#    (the new form keeps every sum's order: they must be equal).
# 3. nsys: the chain of one call (each kernel's start / end relative to the call's start), 35B, M = 1.
# 4. ncu (warm caches, clocks not locked): per kernel time, DRAM, occupancy, issue, stall reasons,
#    35B and rank shape, M = 1, old and new.
# 5. pytest tests/test_gpu_moe_fused.py (the default and the DEC knobs).
. "$(dirname "$0")/lib.sh"
dev_init moedec 235 "$@"
RANK=$(cd "$(dirname "$0")" && pwd)/moedec_rank
TAB=$(cd "$(dirname "$0")" && pwd)/moedec_tab.py

# doctor TAG "ENV" SRC MS: rows prefixed with TAG
doctor() {
    local tag=$1 envs=$2 src=$3 ms=$4
    local t=$(left); [ "$t" -gt 15 ] && t=15
    [ "$t" -ge 6 ] || { echo "$tag: skipped (time)"; return; }
    local f="$OUT/doc-$tag"
    env $envs XDG_CACHE_HOME="$OUT/cache-$tag" timeout -k 2 "$t" "$BIN" doctor --device cuda --families moe \
        --model-path "$src" --m "$ms" --backends cuda_fused_decode >"$f.txt" 2>"$f.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$f.txt" | cut -c1-100 | sed "s/^/$tag /"
    [ $rc = 0 ] || { echo "$tag: rc=$rc"; grep -iE "error|fail|crash|unsupported|wrong" "$f.err" "$f.txt" | head -4; }
}
S35=synth:qwen3.5-35b-a3b,layers=1
S397=synth:qwen3.5-397b-a17b,layers=1
NEW="LASTSTAND_MOE_DEC=1"
echo "== 1. doctor, BF16 shared expert, chained µs per call; old = defaults, new = $NEW, new2 = DEC=2 $(el)"
doctor 35b-old "" $S35 1,2,4,8
doctor 35b-new "$NEW" $S35 1,2,4,8
doctor 35b-new2 "LASTSTAND_MOE_DEC=2" $S35 1,2,4,8
doctor rank-old "" $RANK 1,2,4,8
doctor rank-new "$NEW" $RANK 1,2,4,8
doctor rank-new2 "LASTSTAND_MOE_DEC=2" $RANK 1,2,4,8
echo "$(el)"

ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt)
gen() { # tag "env"
    local t=$(left); [ "$t" -gt 30 ] && t=30
    [ "$t" -ge 15 ] || { echo "  gen $1: skipped (time)"; return; }
    env $2 timeout -k 3 "$t" "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 129 \
        --device cuda "${PLANS[@]}" >"$OUT/gen-$1.out" 2>&1
    local rc=$?
    printf '  %-6s rc=%d %s | %s\n' "$1" $rc "$(grep -oE '[0-9]+ decode steps[^|]*ms each' "$OUT/gen-$1.out" | head -1)" \
        "$(grep -oE '"ids": *\[[0-9, ]{0,40}' "$OUT/gen-$1.out" | head -1)"
    [ $rc = 0 ] || grep -iE "error|fail|fault|mismatch" "$OUT/gen-$1.out" | head -3
}
echo "== 2. decode step, full synth 35B (40 layers), CUDA graphs, old vs new $(el)"
gen old ""
gen new "$NEW"
gen new2 "LASTSTAND_MOE_DEC=2"
a=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-old.out" 2>/dev/null)
for v in new new2; do
    b=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$v.out" 2>/dev/null)
    echo "  greedy ids $v == old: $([ -n "$a" ] && [ "$a" = "$b" ] && echo yes || echo NO)"
done

echo "== 1b. doctor: the parts, the full 397B layer $(el)"
doctor 35b-new-v1 "$NEW LASTSTAND_MOE_GU_V=1" $S35 1,2
doctor 35b-new-pf0 "$NEW LASTSTAND_MOE_PF=0" $S35 1,2
doctor 35b-old-v2pf "LASTSTAND_MOE_GU_V=2 LASTSTAND_MOE_PF=1" $S35 1,2
doctor 397b-old "" $S397 1,2,8
doctor 397b-new "$NEW" $S397 1,2,8
doctor 397b-new2 "LASTSTAND_MOE_DEC=2" $S397 1,2,8

if command -v nsys >/dev/null && [ "$(left)" -gt 70 ]; then
    echo "== 3. nsys: the chain of one call, 35B, BF16 shared, M = 1 (doctor's chained calls) $(el)"
    for v in old new new2; do
        envs=""; [ $v = new ] && envs=$NEW; [ $v = new2 ] && envs=LASTSTAND_MOE_DEC=2
        env $envs XDG_CACHE_HOME="$OUT/cache-nsys" timeout -k 2 25 nsys profile -t cuda -o "$OUT/nsys-$v" -f true \
            "$BIN" doctor --device cuda --families moe --model-path $S35 --m 1 --backends cuda_fused_decode \
            >"$OUT/nsys-$v.log" 2>&1
        echo "  $v: nsys rc=$?"
        timeout -k 2 20 nsys stats -q --report cuda_gpu_trace --format csv -o "$OUT/nsys-$v" "$OUT/nsys-$v.nsys-rep" \
            >/dev/null 2>"$OUT/nsys-$v.stats.err"
        f=$(ls "$OUT"/nsys-$v*cuda_gpu_trace*.csv 2>/dev/null | head -1)
        [ -n "$f" ] && timeout 20 python3 "$TAB" nsys "$f" || { echo "  (no trace)"; head -c 300 "$OUT/nsys-$v.stats.err"; }
        rm -f "$OUT/nsys-$v.nsys-rep" "$OUT/nsys-$v.sqlite"
    done
fi

MET=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
for s in long_scoreboard barrier lg_throttle wait short_scoreboard mio_throttle math_pipe_throttle no_instruction drain not_selected selected dispatch_stall membar sleeping branch_resolving; do
    MET=$MET,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio
done
if command -v ncu >/dev/null; then
    for c in 35b-old 35b-new 35b-new2 rank-old rank-new; do
        t=$(left); [ "$t" -gt 25 ] && t=25
        [ "$t" -ge 12 ] || { echo "ncu $c: skipped (time)"; continue; }
        envs=""; [ "${c#*-}" = new ] && envs=$NEW; [ "${c#*-}" = new2 ] && envs=LASTSTAND_MOE_DEC=2
        src=$S35; [ "${c%-*}" = rank ] && src=$RANK
        echo "== 4. ncu $c, M = 1 (warm caches, clocks not locked) $(el)"
        env $envs XDG_CACHE_HOME="$OUT/cache-ncu" timeout -k 2 "$t" ncu --clock-control none --cache-control none \
            -k regex:moe_ --launch-skip 12 --launch-count 4 --metrics "$MET" --csv "$BIN" doctor --device cuda \
            --families moe --model-path "$src" --m 1 --backends cuda_fused_decode >"$OUT/ncu-$c.csv" 2>"$OUT/ncu-$c.err"
        echo "  rc=$?"
        timeout 15 python3 "$TAB" ncu "$OUT/ncu-$c.csv"
        grep -iE "==ERR|error" "$OUT/ncu-$c.err" | head -3
    done
fi

echo "== 5. pytest tests/test_gpu_moe_fused.py -k 'default or DEC' $(el)"
export BUILD=$D LS_SHARED=$D
t=$(left)
if [ "$t" -ge 15 ]; then
    timeout -k 3 "$t" python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_moe_fused.py -k "default or DEC" 2>&1 | tail -8
else
    echo "skipped (time)"
fi
echo "total $(el)"
