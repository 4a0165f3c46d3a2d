#!/usr/bin/env bash
# bench/device/moe60.sh: the fused MoE decode path (cuda_fused_decode, src/ops/cuda/moe_fused.cu)
# against issue 5's bar (Qwen3.5-397B layer, M = 1, under 60 us) with the flagship checkpoint's
# BF16 shared expert, for the integrator's device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/moe60.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe --backends cuda_fused_decode` (every cell checked against
#    the fp64 CPU reference) on the 397B and 35B layers at M = 1, 2, 8 with the BF16 shared
#    expert (`--model-path synth:PRESET,layers=1`, "bf"): the defaults (SHARED_ROUTE=2 at
#    M <= 2, 1 above) and each LASTSTAND_MOE_SHARED_ROUTE forced (1: the shared expert as
#    m16n8k16 tiles inside the router and top-k launches; 2: there one warp a row); the
#    397B M = 1 default also timed call by call (LASTSTAND_DOCTOR_TIMING=isolated; the
#    doctor's default is chains of back-to-back calls).
# 2. ncu (--clock-control none --cache-control none: warm caches, clocks not locked) per
#    kernel, 397B layer, BF16 shared, M = 1 and 8, defaults.
# 3. `laststand generate` greedy on synth:qwen3.5-35b-a3b,layers=2 (BF16 shared expert):
#    cuda_fused_decode (CUDA graphs and eager) against cuda_expert_loop: the ids must be
#    equal (or nearly: BF16 rounding).
# 4. More doctor cells: the NVFP4 shared expert (`--shapes PRESET`, "nv") with the defaults,
#    the register pair (LASTSTAND_MOE_FUSED_PAIR=1) and PDL off with the BF16 shared expert.
# 5. The MoE fixture (reads .dev/int/fixtures/models/qwen3_5_moe_text-nvfp4, copied from
#    ../shared/fixtures/models): `laststand logits` with cuda_fused_decode (first 8 ids) vs
#    --device cpu; the fixture's tiny shapes (I = 48) are outside the fused path, so the
#    refusal is what it shows.
# 6. ncu stall reasons (per issued instruction) of the four kernels, defaults, M = 1.
# Everything is bounded by `timeout`; the whole script stays under 100 s.
set -u
BIN=${1:?usage: moe60.sh BIN OUTDIR}
OUT=${2:?usage: moe60.sh BIN OUTDIR}
FIX=${FIX:-.dev/int/fixtures/models}
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
    [ $rc = 0 ] || { echo "$tag $preset $sh: rc=$rc"; grep -iE "error|fail|crash|unsupported" "$OUT/doc-$tag-$preset-$sh.err" "$OUT/doc-$tag-$preset-$sh.txt" | head -3; }
}

echo "== 1. doctor moe cuda_fused_decode, BF16 shared expert (variant preset shared: M cell)"
doctor default "" qwen3.5-397b-a17b bf 1,2,8
doctor sr1 LASTSTAND_MOE_SHARED_ROUTE=1 qwen3.5-397b-a17b bf 1,2
doctor sr2 LASTSTAND_MOE_SHARED_ROUTE=2 qwen3.5-397b-a17b bf 8
doctor isolated LASTSTAND_DOCTOR_TIMING=isolated qwen3.5-397b-a17b bf 1
doctor default "" qwen3.5-35b-a3b bf 1,2,8
doctor sr1 LASTSTAND_MOE_SHARED_ROUTE=1 qwen3.5-35b-a3b bf 1,2
doctor sr2 LASTSTAND_MOE_SHARED_ROUTE=2 qwen3.5-35b-a3b bf 8
echo "($(el))"

echo "== 2. ncu, 397B layer, BF16 shared, defaults, M = 1 and 8 (per kernel; warm caches, clocks not locked)"
MET=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size
if command -v ncu >/dev/null; then
    for v in m1 m8; do
        t=$(left); [ $t -gt 15 ] && t=15
        [ $t -ge 8 ] || { echo "ncu $v: skipped (time)"; continue; }
        envs=""
        env $envs timeout $t ncu --clock-control none --cache-control none -k regex:moe_ --launch-skip 8 \
            --launch-count 4 --metrics $MET --csv "$BIN" doctor --device cuda --families moe \
            --model-path synth:qwen3.5-397b-a17b,layers=1 --m ${v#m} --backends cuda_fused_decode \
            >"$OUT/ncu-$v.csv" 2>"$OUT/ncu-$v.err"
        echo "ncu $v rc=$? ($(el))"
        python3 - "$OUT/ncu-$v.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("  (no ncu rows)"); sys.exit()
h = rows[0]; ik, im, iv, iu = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("Metric Unit")
iid = h.index("ID")
by = collections.OrderedDict()
for r in rows[1:]:
    by.setdefault((r[iid], r[ik].split("(")[0].split("<")[0]), {})[r[im]] = (r[iv], r[iu])
tot = 0.0
for (i, k), m in by.items():
    g = lambda n: m.get(n, ("?", ""))[0]
    try:
        tot += float(g('gpu__time_duration.sum').replace(',', '')) * (1e3 if m['gpu__time_duration.sum'][1] == 'us' else 1)
    except Exception:
        pass
    print(f"  {k:26s} {g('gpu__time_duration.sum'):>9s} {m.get('gpu__time_duration.sum',('',''))[1]:4s} "
          f"dram {g('dram__throughput.avg.pct_of_peak_sustained_elapsed'):>6s}% "
          f"read {g('dram__bytes_read.sum'):>8s} {m.get('dram__bytes_read.sum',('',''))[1]:5s} "
          f"warps {g('sm__warps_active.avg.pct_of_peak_sustained_active'):>6s}% "
          f"issue {g('smsp__issue_active.avg.pct_of_peak_sustained_active'):>6s}% "
          f"regs {g('launch__registers_per_thread'):>4s} grid {g('launch__grid_size')}")
print(f"  sum of the kernels: {tot / 1e3:.1f} us")
PY
        grep -iE "error|==ERR" "$OUT/ncu-$v.err" | head -3
    done
else
    echo "no ncu"
fi

echo "== 3. generate greedy, synth:qwen3.5-35b-a3b,layers=2 (BF16 shared expert), by moe choice"
for v in loop fused fused-eager; do
    t=$(left); [ $t -gt 12 ] && t=12
    [ $t -ge 6 ] || { echo "$v: skipped (time)"; continue; }
    flags=(--moe-runner-backend cuda_fused_decode)
    [ $v = loop ] && flags=(--moe-runner-backend cuda_expert_loop --disable-cuda-graph)
    [ $v = fused-eager ] && flags+=(--disable-cuda-graph)
    timeout $t "$BIN" generate --device cuda --model-path synth:qwen3.5-35b-a3b,layers=2 --ids 1,2,3,4,5,6,7,8 \
        --max-new-tokens 16 --temperature 0 --sampling-backend device "${flags[@]}" >"$OUT/gen-$v.txt" 2>"$OUT/gen-$v.err"
    echo "$v: rc=$? $(tr '\n' ' ' <"$OUT/gen-$v.txt" | cut -c1-160) ($(el))"
    grep -iE "error|refus|unsupported|nan|graphs captured|graphs:" "$OUT/gen-$v.err" | cut -c1-200 | head -3
done
python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
try:
    ids = {v: json.loads(open(f"{o}/gen-{v}.txt").read())["ids"] for v in ("loop", "fused", "fused-eager")}
except Exception as ex:
    print(f"no comparison ({ex})"); sys.exit()
for a, b in (("loop", "fused"), ("fused-eager", "fused")):
    x, y = ids[a], ids[b]
    print(f"{a} vs {b}: {sum(p == q for p, q in zip(x, y))}/{max(len(x), len(y))} ids equal")
PY

echo "== 4. doctor moe cuda_fused_decode: NVFP4 shared expert (defaults) and more variants"
for p in qwen3.5-397b-a17b qwen3.5-35b-a3b; do doctor default "" $p nv 1,2,8; done
doctor pair1 LASTSTAND_MOE_FUSED_PAIR=1 qwen3.5-397b-a17b bf 1,2
doctor pdl0 LASTSTAND_MOE_PDL=0 qwen3.5-397b-a17b bf 1
echo "($(el))"

echo "== 5. fixture qwen3_5_moe_text-nvfp4: logits cuda_fused_decode vs cpu"
M1=$FIX/qwen3_5_moe_text-nvfp4
if [ -f "$M1/ref.json" ] && [ $(left) -gt 20 ]; then
    IDS=$(python3 -c "import json;print(','.join(map(str,json.load(open('$M1/ref.json'))['input_ids'][:8])))")
    for v in cpu fused; do
        envs=""; flags=(--device cuda --moe-runner-backend cuda_fused_decode)
        [ $v = cpu ] && flags=(--device cpu)
        env $envs timeout 10 "$BIN" logits --model-path "$M1" --ids "$IDS" "${flags[@]}" >"$OUT/fix-$v.json" 2>"$OUT/fix-$v.err"
        echo "$v: rc=$? $(grep -iE "error|unsupported|refus|moe" "$OUT/fix-$v.err" | head -2 | cut -c1-220 | tr '\n' ' ')"
    done
    python3 - "$OUT" <<'PY'
import json, sys
import numpy as np
o = sys.argv[1]
try:
    b = np.array(json.load(open(f"{o}/fix-cpu.json"))["logits"], dtype=np.float64)
except Exception as ex:
    print(f"no cpu logits ({ex})"); sys.exit()
for v in ("fused",):
    try:
        a = np.array(json.load(open(f"{o}/fix-{v}.json"))["logits"], dtype=np.float64)
    except Exception:
        print(f"{v}: no logits"); continue
    rel = (np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max()
    print(f"{v}: worst rel {rel:.3e}, argmax {(a.argmax(1) == b.argmax(1)).sum()}/{len(b)}")
PY
else
    echo "skipped (no fixture at $M1 or no time)"
fi
echo "($(el))"


echo "== 6. ncu stall reasons"
if command -v ncu >/dev/null; then
    # where the warps of the four kernels wait (defaults, M = 1): stall reasons per issued
    # instruction, as ncu's WarpStateStats section reports them
    t=$(left); [ $t -gt 14 ] && t=14
    if [ $t -ge 8 ]; then
        ST=smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio
        timeout $t ncu --clock-control none --cache-control none -k regex:moe_ \
            --launch-skip 8 --launch-count 4 --metrics $ST --csv "$BIN" doctor --device cuda --families moe \
            --model-path synth:qwen3.5-397b-a17b,layers=1 --m 1 --backends cuda_fused_decode \
            >"$OUT/ncu-stall.csv" 2>"$OUT/ncu-stall.err"
        echo "ncu stalls rc=$? ($(el))"
        python3 - "$OUT/ncu-stall.csv" <<'PY'
import csv, sys, collections
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"'))]
if not rows:
    print("  (no ncu rows)"); sys.exit()
h = rows[0]; ik, im, iv, iid = h.index("Kernel Name"), h.index("Metric Name"), h.index("Metric Value"), h.index("ID")
by = collections.OrderedDict()
for r in rows[1:]:
    by.setdefault((r[iid], r[ik].split("(")[0].split("<")[0]), {})[r[im]] = r[iv]
for (i, k), m in by.items():
    st = sorted(((float(v.replace(",", "")) if v.replace(",", "").replace(".", "").isdigit() else 0.0,
                  n.split("stalled_")[1].split("_per")[0]) for n, v in m.items()), reverse=True)
    print(f"  {k:22s} " + " ".join(f"{n} {v:.2f}" for v, n in st[:7]))
PY
        grep -iE "error|==ERR" "$OUT/ncu-stall.err" | head -3
    fi
fi
echo "total $(el)"
