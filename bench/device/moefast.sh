#!/usr/bin/env bash
# bench/device/moefast.sh: the fused MoE decode path (cuda_fused_decode, src/ops/cuda/moe.cu)
# at M = 1..8 against issue 5's bar (397B layer, M = 1, under 60 us), for the integrator's
# device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/moefast.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe --backends cuda_fused_decode` (every cell checked against
#    the fp64 CPU reference) on the 397B and 35B layers, NVFP4 shared expert (`--shapes
#    PRESET`) and BF16 shared expert (`--model-path synth:PRESET,layers=1`): the default
#    choices (kernel pair, PDL, top-k and shared-early per shape, moe.cu), then knobs aimed at
#    the BF16-shared 397B layer at M = 1 (the register pair):
#      LASTSTAND_MOE_PDL=1 / 2        PDL on all launches / not on the down launch
#      LASTSTAND_MOE_SHARED_EARLY=2   the shared expert's gate/up blocks skip the top-k
#                                     wait in the register pair too (1 = cp.async pair only)
#      LASTSTAND_MOE_BC=1             block-column NVFP4 decode (nvfp4.cuh) at M = 1
# 2. `laststand generate` greedy on synth:qwen3.5-35b-a3b,layers=2 with the auto moe choice
#    (CUDA graphs on: the engine's line "CUDA graphs: N steps replayed") with the defaults
#    and with the knobs, against --disable-cuda-graph: the ids must be equal.
# 3. ncu (--clock-control none --cache-control none: warm, as back-to-back calls run) per
#    kernel at M = 1 on the 397B layer, default choices.
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
doctor pdl1 LASTSTAND_MOE_PDL=1 qwen3.5-397b-a17b bf 1
doctor pdl1+early2 "LASTSTAND_MOE_PDL=1 LASTSTAND_MOE_SHARED_EARLY=2" qwen3.5-397b-a17b bf 1
doctor pdl2 LASTSTAND_MOE_PDL=2 qwen3.5-397b-a17b bf 1
doctor pdl2+early2 "LASTSTAND_MOE_PDL=2 LASTSTAND_MOE_SHARED_EARLY=2" qwen3.5-397b-a17b bf 1
doctor bc LASTSTAND_MOE_BC=1 qwen3.5-397b-a17b bf 1
doctor bc+pdl2+early2 "LASTSTAND_MOE_BC=1 LASTSTAND_MOE_PDL=2 LASTSTAND_MOE_SHARED_EARLY=2" qwen3.5-397b-a17b bf 1
doctor pair1 LASTSTAND_MOE_FUSED_PAIR=1 qwen3.5-397b-a17b bf 2,8
doctor early2 LASTSTAND_MOE_SHARED_EARLY=2 qwen3.5-35b-a3b bf 1,2
doctor bc LASTSTAND_MOE_BC=1 qwen3.5-35b-a3b bf 1
doctor bc LASTSTAND_MOE_BC=1 qwen3.5-35b-a3b nv 1
echo "($(el))"

echo "== 2. generate greedy, synth:qwen3.5-35b-a3b,layers=2, auto moe choice: eager vs CUDA graphs (default, knobs)"
for v in eager graph graph-knobs; do
    t=$(left); [ $t -gt 20 ] && t=20
    [ $t -ge 8 ] || { echo "$v: skipped (time)"; continue; }
    envs=""; flags=""
    [ $v = eager ] && flags=--disable-cuda-graph
    [ $v = graph-knobs ] && envs="LASTSTAND_MOE_SHARED_EARLY=2 LASTSTAND_MOE_BC=1"
    env $envs timeout $t "$BIN" generate --device cuda --model-path synth:qwen3.5-35b-a3b,layers=2 --ids 1,2,3,4,5,6,7,8 \
        --max-new-tokens 16 --temperature 0 --sampling-backend device $flags >"$OUT/gen-$v.txt" 2>"$OUT/gen-$v.err"
    echo "$v: rc=$? $(tr '\n' ' ' <"$OUT/gen-$v.txt" | cut -c1-200) ($(el))"
    grep -iE "error|refus|unsupported|nan|CUDA graph" "$OUT/gen-$v.err" | cut -c1-240 | head -4
done
python3 - "$OUT"/gen-eager.txt "$OUT"/gen-graph.txt "$OUT"/gen-graph-knobs.txt <<'PY'
import json, sys
try:
    ids = [json.loads(open(p).read())["ids"] for p in sys.argv[1:4]]
    for name, b in zip(("graph", "graph-knobs"), ids[1:]):
        print(f"eager vs {name}: {sum(x == y for x, y in zip(ids[0], b))}/{max(len(ids[0]), len(b))} ids equal")
except Exception as ex:
    print(f"no comparison ({ex})")
PY

echo "== 3. ncu, 397B layer, M = 1, default choices (per kernel; warm caches, clocks not locked)"
MET=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
if command -v ncu >/dev/null; then
    for cfg in "bf:2:0" "nv:2:0"; do
        sh=${cfg%%:*}; r=${cfg#*:}; tk=${r%%:*}; bc=${r#*:}
        t=$(left); [ $t -gt 20 ] && t=20
        [ $t -ge 8 ] || { echo "ncu $cfg: skipped (time)"; continue; }
        if [ "$sh" = bf ]; then src=(--model-path synth:qwen3.5-397b-a17b,layers=1); else src=(--shapes qwen3.5-397b-a17b); fi
        LASTSTAND_MOE_TOPK=$tk LASTSTAND_MOE_BC=$bc timeout $t ncu --clock-control none --cache-control none -k regex:moe_ --launch-skip 8 \
            --launch-count 4 --metrics $MET --csv "$BIN" doctor --device cuda --families moe "${src[@]}" --m 1 \
            --backends cuda_fused_decode >"$OUT/ncu-$sh-$tk-$bc.csv" 2>"$OUT/ncu-$sh-$tk-$bc.err"
        echo "ncu shared=$sh topk=$tk bc=$bc rc=$? ($(el))"
        python3 - "$OUT/ncu-$sh-$tk-$bc.csv" <<'PY'
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
        grep -iE "error|==ERR" "$OUT/ncu-$sh-$tk-$bc.err" | head -3
    done
else
    echo "no ncu"
fi
echo "total $(el)"
