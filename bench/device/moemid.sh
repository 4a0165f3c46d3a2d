#!/usr/bin/env bash
# device-limit: 120
# bench/device/moemid.sh: cuda_grouped_gemm (src/ops/cuda/moe_grouped.cu) at 9..64 tokens, the
# MoE of a concurrency-16 decode step, for the integrator's device rounds (DEVICE_ROUNDS.md).
#
#   bash bench/device/moemid.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe` (every cell checked against the fp64 CPU reference) on
#    synth:qwen3.5-35b-a3b,layers=1 and synth:qwen3.5-397b-a17b,layers=1 (NVFP4 experts, BF16
#    shared expert, as the synth and ModelOpt checkpoints have them), M = 8..128 and one large
#    M, old path (LASTSTAND_MG_MID=0) against the new one (=1) in the same run; then the
#    --shapes presets (NVFP4 shared expert) with the new path.
# 2. ncu: one call's kernels (router, top-k, plan, GEMMs, combine) at 35B M = 16, old and new:
#    time, DRAM bytes, instructions, issue, pipe use, SM activity (the tail), top stalls.
# 3. tests/test_gpu_moe_grouped.py -k mid (the new path's doctor verdicts: BF16 shared expert on a
#    side stream, NVFP4 shared expert in the launch, both shapes).
# 4. (when time is left) `generate` greedy with CUDA graphs, old vs new: same tokens.
# Each step is bounded by `timeout`; the whole script stays under 120 s.
set -u
BIN=${1:?usage: moemid.sh BIN OUTDIR}
OUT=${2:?usage: moemid.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
left() { echo $(( 112 - ($(date +%s) - T0) )); }
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null
B35="synth:qwen3.5-35b-a3b,layers=1"
B397="synth:qwen3.5-397b-a17b,layers=1"
OLD="LASTSTAND_MG_MID=0"
NEW="LASTSTAND_MG_MID=1"

# doctor TAG ENVS MODEL MS MAXS: the rows of the table, prefixed by TAG (MODEL "shapes:P" = --shapes P)
doctor() {
    local tag=$1 envs=$2 model=$3 ms=$4 t=$5 l src
    l=$(left); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 5 ] || { echo "$tag: skipped (time)"; return; }
    if [ "${model#shapes:}" != "$model" ]; then src="--shapes ${model#shapes:}"; else src="--model-path $model"; fi
    env $envs timeout "$t" "$BIN" doctor --device cuda --families moe $src --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc"; tail -n 4 "$OUT/doc-$tag.err"; }
    grep -E "❌" "$OUT/doc-$tag.txt" | head -3
}

echo "== 1. doctor, BF16 shared expert: old (MG_MID=0) vs new (MG_MID=1) ($(el))"
doctor new35 "$NEW" "$B35" 8,16,32,64,128,256,1024 12
# a wrong cell with the new path: again with its old router and top-k (the GEMVs alone)
grep -q "❌" "$OUT/doc-new35.txt" 2>/dev/null &&
    doctor new35_gemvs "$NEW LASTSTAND_MG_MIDTOPK=0 LASTSTAND_MG_MIDROUTER=0" "$B35" 16,64 8
doctor old35 "$OLD" "$B35" 8,16,32,64,128,256,1024 12
doctor new397 "$NEW" "$B397" 16,32,64,128,1024 16
doctor old397 "$OLD" "$B397" 16,32,64,128,1024 16
echo "== 1a. new path, the other down instance at I = 512 (LASTSTAND_MG_MIDDN=1) ($(el))"
doctor dn35 "$NEW LASTSTAND_MG_MIDDN=1" "$B35" 16,32,64 7
echo "== 1b. doctor, NVFP4 shared expert (--shapes), new ($(el))"
doctor pre35 "$NEW" shapes:qwen3.5-35b-a3b 1,8,16,64,3072 10
doctor pre397 "$NEW" shapes:qwen3.5-397b-a17b 16,64 10

echo "== 2. ncu per kernel, 35B, one call ($(el))"
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio
ncu_call() {
    local tag=$1 envs=$2 m=$3 l
    command -v ncu >/dev/null || { echo "ncu: not found"; return; }
    l=$(left); [ "$l" -gt 16 ] && l=16
    [ "$l" -ge 8 ] || { echo "ncu $tag M=$m: skipped (time)"; return; }
    env $envs timeout "$l" ncu --clock-control none --target-processes all -c 9 --csv --print-units base \
        --metrics "$METRICS" "$BIN" doctor --device cuda --families moe --model-path "$B35" --m "$m" \
        --backends cuda_grouped_gemm --trial-timeout 30 >"$OUT/ncu-$tag-$m.csv" 2>"$OUT/ncu-$tag-$m.err"
    echo "ncu $tag M=$m rc=$? ($(el))"
    python3 - "$OUT/ncu-$tag-$m.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
if not rows:
    print("  no ncu rows"); sys.exit()
h = rows[0]
ki, ii, ni, vi, pi = h.index("Kernel Name"), h.index("ID"), h.index("Metric Name"), h.index("Metric Value"), h.index("Process ID")
ks = {}
for r in rows[1:]:
    k = ks.setdefault((int(r[pi]), int(r[ii])), {"name": r[ki]})
    k[r[ni]] = r[vi].replace(",", "")
def f(k, m, d=0.0):
    try: return float(k.get(m, d))
    except ValueError: return d
tot = 0.0
for i in sorted(ks):
    k = ks[i]
    us = f(k, "gpu__time_duration.sum") / 1e3
    tot += us
    stalls = {m.split("stalled_")[1].split("_per_issue")[0]: f(k, m) for m in k if "stalled_" in m}
    top = sorted(stalls.items(), key=lambda x: -x[1])[:3]
    print(f"  {k['name'].replace('void ', '')[:44]:44s} {us:7.1f} us {f(k,'dram__bytes_read.sum')/1e6:6.1f} MB "
          f"inst {f(k,'smsp__inst_executed.sum')/1e6:5.2f} M iss {f(k,'smsp__issue_active.avg.pct_of_peak_sustained_active'):4.1f}% "
          f"occ {f(k,'sm__warps_active.avg.pct_of_peak_sustained_active'):4.1f}% smact {f(k,'sm__cycles_active.avg.pct_of_peak_sustained_elapsed'):4.1f}% "
          f"alu {f(k,'sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active'):4.1f}% fma {f(k,'sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active'):4.1f}% "
          f"g {k.get('launch__grid_size','?')} r {k.get('launch__registers_per_thread','?')} "
          + " ".join(f"{a}={b:.2f}" for a, b in top))
print(f"  sum of kernel times {tot:.1f} us (the first call's kernels and the next call's first ones)")
PY
    grep -iE "error|==ERR" "$OUT/ncu-$tag-$m.err" | head -3
}
ncu_call new "$NEW" 16
ncu_call old "$OLD" 16

echo "== 3. pytest tests/test_gpu_moe_grouped.py ($(el))"
l=$(left)
if [ "$l" -ge 25 ] && python3 -c "import pytest" 2>/dev/null; then
    BUILD=$(dirname "$BIN") timeout "$l" python3 -m pytest -q tests/test_gpu_moe_grouped.py -k "mid" 2>&1 | tail -n 6
else
    echo "skipped (time or no pytest)"
fi

echo "== 4. generate greedy (CUDA graphs), synth:qwen3.5-35b-a3b,layers=2, 16 prompts' worth ($(el))"
for v in "old:$OLD" "new:$NEW"; do
    tag=${v%%:*}; envs=${v#*:}
    l=$(left); [ "$l" -gt 15 ] && l=15
    [ "$l" -ge 8 ] || { echo "$tag: skipped (time)"; continue; }
    env $envs timeout "$l" "$BIN" generate --device cuda --model-path synth:qwen3.5-35b-a3b,layers=2 \
        --ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 --max-new-tokens 8 --temperature 0 \
        --moe-runner-backend cuda_grouped_gemm >"$OUT/gen-$tag.txt" 2>"$OUT/gen-$tag.err"
    echo "$tag: rc=$? $(tr '\n' ' ' <"$OUT/gen-$tag.txt" | cut -c1-160) ($(el))"
    grep -iE "error|refus|nan" "$OUT/gen-$tag.err" | head -3
done
echo "total $(el)"
