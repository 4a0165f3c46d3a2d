#!/usr/bin/env bash
# device-limit: 120
# bench/device/moemid.sh: cuda_grouped_gemm (src/ops/cuda/moe_grouped.cu) at 9..64 tokens, the
# MoE of a concurrency-16 decode step, for the integrator's device rounds (DEVICE_ROUNDS.md).
#
#   bash bench/device/moemid.sh BIN OUTDIR
#
# The mid-batch path (LASTSTAND_MG_MID=1: the router, top-k, GEMVs and combine of the 16-row
# tiles) against the grouped GEMM (=0) in the same run:
# 1. `laststand doctor --families moe` (every cell checked against the fp64 CPU reference) on
#    synth:qwen3.5-35b-a3b,layers=1 and synth:qwen3.5-397b-a17b,layers=1 (NVFP4 experts, BF16
#    shared expert, as the synth and ModelOpt checkpoints have them), M = 8..256 and one large M.
# 2. End to end: `serve` of the full 40-layer synth Qwen3.5-35B-A3B with the plans named (no
#    doctor, no smoke children: --trust-backend; CUDA graphs checked against eager steps at
#    start-up) + `bench` at concurrency 16, 1024 in / 256 out, 32 prompts, new then old.
# 3. (time left) ncu: one call's kernels at 35B M = 16, new path with the R2 variants.
# 4. (time left) tests/test_gpu_moe_grouped.py -k mid.
# Each step is bounded by `timeout`; the whole script stays under 120 s.
set -u
BIN=${1:?usage: moemid.sh BIN OUTDIR}
OUT=${2:?usage: moemid.sh BIN OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export LD_LIBRARY_PATH="$(dirname "$BIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
left() { echo $(( 114 - ($(date +%s) - T0) )); }
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null
B35="synth:qwen3.5-35b-a3b,layers=1"
B397="synth:qwen3.5-397b-a17b,layers=1"
OLD="LASTSTAND_MG_MID=0"
NEW="LASTSTAND_MG_MID=1"

# doctor TAG ENVS MODEL MS MAXS: the rows of the table, prefixed by TAG
doctor() {
    local tag=$1 envs=$2 model=$3 ms=$4 t=$5 l
    l=$(left); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 5 ] || { echo "$tag: skipped (time)"; return; }
    env $envs timeout "$t" "$BIN" doctor --device cuda --families moe --model-path "$model" --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 40 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc"; tail -n 4 "$OUT/doc-$tag.err"; }
    grep -E "❌" "$OUT/doc-$tag.txt" | head -3
}

echo "== 1. doctor, new (MG_MID=1) vs old (MG_MID=0) ($(el))"
doctor new35 "$NEW" "$B35" 8,16,32,64,128 9
# a wrong cell with the new path: again with the old router and top-k (R1's GEMVs alone)
grep -q "❌" "$OUT/doc-new35.txt" 2>/dev/null &&
    doctor new35_gemvs "$NEW LASTSTAND_MG_MIDTOPK=0 LASTSTAND_MG_MIDROUTER=0" "$B35" 16,64 7
doctor old35 "$OLD" "$B35" 8,16,32,64,128 9
# the R2 variants together: down with a whole K per warp (MIDDN=2), gate/up with one barrier
# (MIDGU=1), top-k + plan in one launch (MIDFUSE=1), past 4 rows per expert (MIDALL=1);
# each alone when that is wrong somewhere
V2="$NEW LASTSTAND_MG_MIDDN=2 LASTSTAND_MG_MIDGU=1 LASTSTAND_MG_MIDFUSE=1 LASTSTAND_MG_MIDALL=1"
doctor v2_35 "$V2" "$B35" 16,32,64,128,256 9
if grep -q "❌" "$OUT/doc-v2_35.txt" 2>/dev/null; then
    doctor dn35 "$NEW LASTSTAND_MG_MIDDN=2" "$B35" 16,64 6
    doctor gu35 "$NEW LASTSTAND_MG_MIDGU=1" "$B35" 16,64 6
    doctor fuse35 "$NEW LASTSTAND_MG_MIDFUSE=1" "$B35" 16,64 6
fi
doctor nopdl35 "$NEW LASTSTAND_MG_MIDPDL=0" "$B35" 16,64 6
# 397B: the GEMVs off by the rule (router, top-k, BF16 shared expert, combine on); all on
doctor new397 "$NEW" "$B397" 16,64,256 8
doctor all397 "$NEW LASTSTAND_MG_MIDALL=1 LASTSTAND_MG_MIDDN=2 LASTSTAND_MG_MIDFUSE=1" "$B397" 16,64 8

PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt)
# e2e TAG ENVS MAXS: serve the full 35B with the plans named + bench at concurrency 16
e2e() {
    local tag=$1 envs=$2 lim=$3 l
    l=$(left); [ "$l" -lt "$lim" ] && lim=$l
    [ "$lim" -ge 20 ] || { echo "e2e $tag: skipped (time)"; return; }
    echo "== 2. e2e $tag: serve synth:qwen3.5-35b-a3b (40 layers), named plans, CUDA graphs, $envs ($(el))"
    env $envs BIN="$BIN" PORT=$((31000 + $$ % 2000)) CONCURRENCY=16 NUM_PROMPTS=32 INPUT_LEN=1024 OUTPUT_LEN=256 \
        WARMUP=2 HEALTH_TIMEOUT=$(( lim - 8 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$tag" \
        qwen3.5-35b-a3b -- --device cuda "${PLANS[@]}" --trust-backend >"$OUT/e2e-$tag.out" 2>&1
    echo "rc=$? ($(el)) $(grep -E "startup_s" "$OUT/e2e-$tag/meta.txt" 2>/dev/null)"
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TTFT p50 ms | TPOT p50 ms | TPOT p99 ms" &&
        grep -E "^\| 16 \|" "$OUT/e2e-$tag/SUMMARY.md" | cut -d'|' -f2,4,6,8,10,11 | sed 's/^/  /'
    grep -E "CUDA graphs captured|ERROR|error|mismatch" "$OUT/e2e-$tag/server.log" 2>/dev/null | cut -c1-200 | head -3
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] || tail -4 "$OUT/e2e-$tag.out"
}
e2e new "$NEW" 34
e2e old "$OLD" 34

echo "== 3. ncu per kernel, 35B, one call, new ($(el))"
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__registers_per_thread,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio
ncu_call() {
    local tag=$1 envs=$2 m=$3 l
    command -v ncu >/dev/null || { echo "ncu: not found"; return; }
    l=$(left); [ "$l" -gt 14 ] && l=14
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
for i in sorted(ks):
    k = ks[i]
    stalls = {m.split("stalled_")[1].split("_per_issue")[0]: f(k, m) for m in k if "stalled_" in m}
    top = sorted(stalls.items(), key=lambda x: -x[1])[:3]
    print(f"  {k['name'].replace('void ', '')[:44]:44s} {f(k,'gpu__time_duration.sum')/1e3:7.1f} us {f(k,'dram__bytes_read.sum')/1e6:6.1f} MB "
          f"inst {f(k,'smsp__inst_executed.sum')/1e6:5.2f} M iss {f(k,'smsp__issue_active.avg.pct_of_peak_sustained_active'):4.1f}% "
          f"occ {f(k,'sm__warps_active.avg.pct_of_peak_sustained_active'):4.1f}% smact {f(k,'sm__cycles_active.avg.pct_of_peak_sustained_elapsed'):4.1f}% "
          f"g {k.get('launch__grid_size','?')} r {k.get('launch__registers_per_thread','?')} "
          + " ".join(f"{a}={b:.2f}" for a, b in top))
PY
    grep -iE "error|==ERR" "$OUT/ncu-$tag-$m.err" | head -3
}
ncu_call v2 "$V2" 16

echo "== 4. pytest tests/test_gpu_moe_grouped.py -k mid ($(el))"
l=$(left)
if [ "$l" -ge 20 ] && python3 -c "import pytest" 2>/dev/null; then
    BUILD=$(dirname "$BIN") timeout "$l" python3 -m pytest -q tests/test_gpu_moe_grouped.py -k "mid" 2>&1 | tail -n 4
else
    echo "skipped (time or no pytest)"
fi
echo "total $(el)"
