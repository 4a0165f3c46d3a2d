#!/usr/bin/env bash
# bench/device/moegrp2.sh: cuda_grouped_gemm (src/ops/cuda/moe_grouped.cu) at batched-decode
# sizes M = 16..256, for the integrator's device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/moegrp2.sh BIN OUTDIR
#
# R4 (final defaults: LASTSTAND_MG_DECODE=place at BM = 16, LASTSTAND_MG_SIDE=1, from R3):
# 1. `laststand doctor --families moe` with the defaults on synth:qwen3.5-35b-a3b,layers=1 and
#    synth:qwen3.5-397b-a17b,layers=1 (NVFP4 experts, BF16 shared expert, as the synth and
#    ModelOpt checkpoints have it), M = 1..1024 (every cell checked against the fp64 CPU
#    reference), and on the --shapes presets (NVFP4 shared expert: one launch per GEMM).
# 2. The R3 default in the same run (LASTSTAND_MG_SIDE=0 LASTSTAND_MG_DECODE=perm): before/after.
# 3. `laststand generate` greedy (CUDA graphs on) with cuda_grouped_gemm, new vs old default:
#    the side stream must be capturable and give the same tokens.
# 4. Opt-in LASTSTAND_MG_DECODE=place32 (the same decode at 32-row tiles: 35B M = 512, 397B
#    M = 1024); ncu per-kernel breakdown of one call, 35B, M = 16 and 64, new default.
# 6. If time is left: tests/test_gpu_moe_grouped.py -k variants (every knob, doctor verdicts).
set -u
BIN=${1:?usage: moegrp2.sh BIN OUTDIR}
OUT=${2:?usage: moegrp2.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
left() { echo $(( 88 - ($(date +%s) - T0) )); }
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null
B35="synth:qwen3.5-35b-a3b,layers=1"
B397="synth:qwen3.5-397b-a17b,layers=1"

# doctor TAG ENVS MODEL MS BACKENDS MAXS: the rows of the table, prefixed by TAG
doctor() {
    local tag=$1 envs=$2 model=$3 ms=$4 be=$5 t=$6 l
    l=$(left); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 5 ] || { echo "$tag: skipped (time)"; return; }
    env $envs timeout "$t" "$BIN" doctor --device cuda --families moe --model-path "$model" --m "$ms" \
        --backends "$be" --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    local rc=$?
    grep -E "^moe|^ +M |^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc"; tail -n 4 "$OUT/doc-$tag.err"; }
    grep -E "❌" "$OUT/doc-$tag.txt" | grep -v "unsupported" | head -3
}

OLD="LASTSTAND_MG_SIDE=0 LASTSTAND_MG_DECODE=perm"
echo "== 1. new default, BF16 shared expert ($(el))"
doctor new35 "" "$B35" 1,8,16,32,64,128,256,512 cuda_grouped_gemm,cuda_fused_decode 14
doctor new397 "" "$B397" 16,32,64,128,256,1024 cuda_grouped_gemm 18
echo "== 1b. new default, NVFP4 shared expert (--shapes) ($(el))"
doctor_shapes() {
    local tag=$1 preset=$2 ms=$3 t=$4 l
    l=$(left); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 5 ] || { echo "$tag: skipped (time)"; return; }
    timeout "$t" "$BIN" doctor --device cuda --families moe --shapes "$preset" --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    local rc=$?
    grep -E "^moe|^ +M |^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc"; tail -n 4 "$OUT/doc-$tag.err"; }
}
doctor_shapes pre35 qwen3.5-35b-a3b 1,16,64,256,3072 9
doctor_shapes pre397 qwen3.5-397b-a17b 16,64,1024,3072 14

echo "== 2. R3 default ($OLD) ($(el))"
doctor old35 "$OLD" "$B35" 16,32,64,128,256 cuda_grouped_gemm 7
doctor old397 "$OLD" "$B397" 16,64,256 cuda_grouped_gemm 10

echo "== 3. generate greedy (CUDA graphs), synth:qwen3.5-35b-a3b,layers=2, cuda_grouped_gemm ($(el))"
for v in "new:" "old:$OLD"; do
    tag=${v%%:*}; envs=${v#*:}
    l=$(left); [ "$l" -gt 15 ] && l=15
    [ "$l" -ge 6 ] || { echo "$tag: skipped (time)"; continue; }
    env $envs timeout "$l" "$BIN" generate --device cuda --model-path synth:qwen3.5-35b-a3b,layers=2 \
        --ids 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20 --max-new-tokens 8 --temperature 0 \
        --moe-runner-backend cuda_grouped_gemm >"$OUT/gen-$tag.txt" 2>"$OUT/gen-$tag.err"
    echo "$tag: rc=$? $(tr '\n' ' ' <"$OUT/gen-$tag.txt" | cut -c1-200) ($(el))"
    grep -iE "error|captured the|refus|nan" "$OUT/gen-$tag.err" | head -3
done

echo "== 4. opt-in place32 (32-row tiles) ($(el))"
doctor p32_35 "LASTSTAND_MG_DECODE=place32" "$B35" 512 cuda_grouped_gemm 6
doctor p32_397 "LASTSTAND_MG_DECODE=place32" "$B397" 1024 cuda_grouped_gemm 8

echo "== 5. ncu per kernel, 35B, one call ($(el))"
# ncu ROW-TAG ENVS M: one call's kernels (router GEMM, top-k, plan, GEMMs, combine)
ncu_call() {
    local tag=$1 envs=$2 m=$3 l
    command -v ncu >/dev/null || { echo "ncu: not found"; return; }
    l=$(left); [ "$l" -gt 16 ] && l=16
    [ "$l" -ge 8 ] || { echo "ncu $tag M=$m: skipped (time)"; return; }
    env $envs timeout "$l" ncu --clock-control none --target-processes all -c 10 --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio \
        "$BIN" doctor --device cuda --families moe --model-path "$B35" --m "$m" --backends cuda_grouped_gemm \
        --trial-timeout 30 >"$OUT/ncu-$tag-$m.csv" 2>"$OUT/ncu-$tag-$m.err"
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
    us = f(k, "gpu__time_duration.sum") / 1e3  # ns -> us
    tot += us
    stalls = {m.split("stalled_")[1].split("_per_issue")[0]: f(k, m) for m in k if "stalled_" in m}
    top = sorted(stalls.items(), key=lambda x: -x[1])[:3]
    print(f"  {k['name'].replace('void ', '')[:56]:56s} {us:8.1f} us  dram {f(k,'dram__bytes_read.sum')/1e6:7.1f} MB "
          f"{f(k,'dram__throughput.avg.pct_of_peak_sustained_elapsed'):5.1f}%  inst {f(k,'smsp__inst_executed.sum')/1e6:6.2f} M "
          f"issue {f(k,'smsp__issue_active.avg.pct_of_peak_sustained_active'):4.1f}%  occ {f(k,'sm__warps_active.avg.pct_of_peak_sustained_active'):4.1f}% "
          f"grid {k.get('launch__grid_size','?')} reg {k.get('launch__registers_per_thread','?')}  "
          + " ".join(f"{a}={b:.2f}" for a, b in top))
print(f"  sum of kernel times {tot:.1f} us")
PY
}
ncu_call new "" 16
ncu_call new "" 64
echo "== 6. pytest tests/test_gpu_moe_grouped.py -k variants ($(el))"
l=$(left)
if [ "$l" -ge 25 ] && python3 -c "import pytest" 2>/dev/null; then
    BUILD=$(dirname "$BIN") timeout "$l" python3 -m pytest -q -x tests/test_gpu_moe_grouped.py -k variants 2>&1 | tail -n 4
else
    echo "skipped (time or no pytest)"
fi
echo "total $(el)"
