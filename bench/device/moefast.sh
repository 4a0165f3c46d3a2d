#!/usr/bin/env bash
# bench/device/moefast.sh: the fused MoE decode path (cuda_fused_decode, src/ops/cuda/moe.cu)
# at M = 1..8 against issue 5's bar (397B layer, M = 1, under 60 us), for the integrator's
# device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/moefast.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe --backends cuda_fused_decode --m 1,2,8` (every cell
#    checked against the fp64 CPU reference) on the 397B and 35B layers, NVFP4 shared
#    expert (`--shapes PRESET`) and BF16 shared expert (`--model-path synth:PRESET,layers=1`),
#    with the default kernels and with each opt-in knob of this round:
#      LASTSTAND_MOE_PDL=1         programmatic dependent launch between the fused kernels
#      LASTSTAND_MOE_FUSED_PAIR=3  the persistent gate/up kernel (cp.async ring over tiles)
#                                  with the cp.async down kernel, M <= 2
#      LASTSTAND_MOE_FUSED_PAIR=4  the same with h through shared memory in the down kernel
# 2. `laststand generate` greedy on synth:qwen3.5-35b-a3b,layers=2 (CUDA graphs replayed):
#    default vs LASTSTAND_MOE_PDL=1 (+ pair 3), the ids must be equal (PDL edges inside
#    captured graphs).
# 3. ncu (--clock-control none, cold caches) per-kernel time, DRAM throughput, achieved
#    occupancy and issue activity of the fused kernels at M = 1 on the 397B layer, per pair.
# Everything is bounded by `timeout`; the whole script stays under 100 s.
set -u
BIN=${1:?usage: moefast.sh BIN OUTDIR}
OUT=${2:?usage: moefast.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
left() { echo $(( 97 - ($(date +%s) - T0) )); }
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null

# doctor TAG ENV PRESET SHARED(nv|bf) MS: one table, rows prefixed with TAG
doctor() {
    local tag=$1 envs=$2 preset=$3 sh=$4 ms=$5 src
    if [ "$sh" = bf ]; then src=(--model-path "synth:$preset,layers=1"); else src=(--shapes "$preset"); fi
    local t=$(left); [ "$t" -gt 20 ] && t=20
    [ "$t" -ge 5 ] || { echo "$tag $preset $sh: skipped (time)"; return; }
    env $envs timeout "$t" "$BIN" doctor --device cuda --families moe "${src[@]}" --m "$ms" \
        --backends cuda_fused_decode >"$OUT/doc-$tag-$preset-$sh.txt" 2>"$OUT/doc-$tag-$preset-$sh.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$OUT/doc-$tag-$preset-$sh.txt" | sed "s/^/$tag ${preset%%-a*} sh=$sh /"
    [ $rc = 0 ] || { echo "$tag $preset $sh: rc=$rc"; grep -iE "error|fail|crash" "$OUT/doc-$tag-$preset-$sh.err" | head -3; }
}

echo "== 1. doctor moe cuda_fused_decode (knob preset shared: M cell)"
for p in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    for sh in nv bf; do doctor default "" $p $sh 1,2,8; done
done
echo "($(el))"
for p in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    for sh in nv bf; do doctor pdl LASTSTAND_MOE_PDL=1 $p $sh 1,2,8; done
done
echo "($(el))"
for p in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    for sh in nv bf; do doctor pair3 LASTSTAND_MOE_FUSED_PAIR=3 $p $sh 1,2; done
done
for p in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    for sh in nv bf; do doctor pair4 LASTSTAND_MOE_FUSED_PAIR=4 $p $sh 1,2; done
done
for sh in nv bf; do doctor pdl+pair3 "LASTSTAND_MOE_PDL=1 LASTSTAND_MOE_FUSED_PAIR=3" qwen3.5-397b-a17b $sh 1,2; done
for sh in nv bf; do doctor pdl+pair4 "LASTSTAND_MOE_PDL=1 LASTSTAND_MOE_FUSED_PAIR=4" qwen3.5-397b-a17b $sh 1,2; done
for sh in nv bf; do doctor pdl+pair2 "LASTSTAND_MOE_PDL=1 LASTSTAND_MOE_FUSED_PAIR=2" qwen3.5-397b-a17b $sh 1; done
echo "($(el))"

echo "== 2. generate greedy, synth:qwen3.5-35b-a3b,layers=2 (CUDA graphs), default vs PDL + pair 3"
for v in default pdl; do
    t=$(left); [ $t -gt 25 ] && t=25
    [ $t -ge 8 ] || { echo "$v: skipped (time)"; continue; }
    envs=""; [ $v = pdl ] && envs="LASTSTAND_MOE_PDL=1 LASTSTAND_MOE_FUSED_PAIR=3"
    env $envs timeout $t "$BIN" generate --device cuda --model-path synth:qwen3.5-35b-a3b,layers=2 --ids 1,2,3,4,5,6,7,8 \
        --max-new-tokens 16 --temperature 0 --moe-runner-backend cuda_fused_decode --sampling-backend device \
        >"$OUT/gen-$v.txt" 2>"$OUT/gen-$v.err"
    echo "$v: rc=$? $(tr '\n' ' ' <"$OUT/gen-$v.txt" | cut -c1-200) ($(el))"
    grep -iE "error|refus|unsupported|nan|CUDA graphs" "$OUT/gen-$v.err" | head -3
done
python3 - "$OUT/gen-default.txt" "$OUT/gen-pdl.txt" <<'PY'
import json, sys
try:
    a, b = (json.loads(open(p).read())["ids"] for p in sys.argv[1:3])
    print(f"default vs pdl: {sum(x == y for x, y in zip(a, b))}/{max(len(a), len(b))} ids equal")
except Exception as ex:
    print(f"default vs pdl: no comparison ({ex})")
PY

echo "== 3. ncu, 397B layer, M = 1, cuda_fused_decode (per kernel; cold caches, clocks not locked)"
MET=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
if command -v ncu >/dev/null; then
    for cfg in "bf:1" "bf:3" "bf:4" "nv:1" "nv:3" "bf:2"; do
        sh=${cfg%%:*}; pair=${cfg#*:}
        t=$(left); [ $t -gt 25 ] && t=25
        [ $t -ge 10 ] || { echo "ncu $cfg: skipped (time)"; continue; }
        if [ "$sh" = bf ]; then src=(--model-path synth:qwen3.5-397b-a17b,layers=1); else src=(--shapes qwen3.5-397b-a17b); fi
        LASTSTAND_MOE_FUSED_PAIR=$pair timeout $t ncu --clock-control none -k regex:moe_ --launch-skip 8 --launch-count 8 \
            --metrics $MET --csv "$BIN" doctor --device cuda --families moe "${src[@]}" --m 1 \
            --backends cuda_fused_decode >"$OUT/ncu-$sh-$pair.csv" 2>"$OUT/ncu-$sh-$pair.err"
        echo "ncu shared=$sh pair=$pair rc=$? ($(el))"
        python3 - "$OUT/ncu-$sh-$pair.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("  (no ncu rows)"); sys.exit()
h = rows[0]; ik, im, iv, iu = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("Metric Unit")
iid = h.index("ID")
by = collections.OrderedDict()
for r in rows[1:]:
    by.setdefault((r[iid], r[ik].split("(")[0].split("<")[0]), {})[r[im]] = (r[iv], r[iu])
for (i, k), m in by.items():
    g = lambda n: m.get(n, ("?", ""))[0]
    print(f"  {k:22s} {g('gpu__time_duration.sum'):>9s} {m.get('gpu__time_duration.sum',('',''))[1]:4s} "
          f"dram {g('dram__throughput.avg.pct_of_peak_sustained_elapsed'):>6s}% "
          f"read {g('dram__bytes_read.sum'):>8s} {m.get('dram__bytes_read.sum',('',''))[1]:5s} "
          f"warps {g('sm__warps_active.avg.pct_of_peak_sustained_active'):>6s}% "
          f"issue {g('smsp__issue_active.avg.pct_of_peak_sustained_active'):>6s}% "
          f"regs {g('launch__registers_per_thread'):>4s} grid {g('launch__grid_size')}")
PY
        grep -iE "error|==ERR" "$OUT/ncu-$sh-$pair.err" | head -3
    done
else
    echo "no ncu"
fi
echo "total $(el)"
