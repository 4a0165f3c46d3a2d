#!/bin/bash
# bench/device/moeplan.sh: cuda_grouped_gemm's routing kernels off the mid path (S12, moe_route.cu):
# the multi-block plan (mg_plan_count_kernel + mg_plan_place_kernel, LASTSTAND_MG_PLAN=1, place by
# PDL; 2 without) against the one-block
# mg_plan_kernel (LASTSTAND_MG_PLAN=0), and mg_topk2_kernel
# (LASTSTAND_MG_TOPK=1) against mg_topk_kernel (0).
# device-limit: 90
#
#   bash bench/device/moeplan.sh BIN OUTDIR
#
# 1. tests/unit/test_moe_plan_cuda.c: the plan bitwise against a CPU oracle and the old plan, graph
#    replays, the top-k bitwise against the old kernel, y of whole MoE calls old vs new routing
#    memcmp-equal (M = 1..8192, E = 256 top-8 / 512 top-10, shared expert or not, skewed routing),
#    and old vs new kernel times (events, back to back): "moeplan PASS|FAIL" and "moeplan time" lines.
# 2. doctor moe (fp64 CPU oracle) on synth:qwen3.5-35b-a3b,layers=1 at M = 2048, 8192, new vs old
#    routing (the MoE call's time; old last); the 397B shapes (E = 512, top-10) at 8192.
# 3. ncu (prefill8k.sh's command, -k regex:mg_) over `generate` of the 35B cut to 4 layers with an
#    8192-token prompt: mg_topk / mg_plan* / mg_combine durations, new, old.
# 4. ncu sections of the plan kernels (stall reasons), time permitting.
# (S12's one-launch plan LASTSTAND_MG_PLAN=3 and top-k LASTSTAND_MG_TOPK=2 were deleted in S13.)
. "$(dirname "$0")/lib.sh"
dev_init moeplan 88 "$@"
export NCCL_NVLS_ENABLE=0
OLD="LASTSTAND_MG_PLAN=0 LASTSTAND_MG_TOPK=0"
NEW="LASTSTAND_MG_PLAN=1 LASTSTAND_MG_TOPK=1"

echo "== 1. test_moe_plan_cuda $(el)"
timeout -k 2 25 "$D/tests/test_moe_plan_cuda" >"$OUT/test.txt" 2>&1
rc=$?
grep -E "^moeplan|PASSED|FAILED|SKIPPED|FAIL|rror" "$OUT/test.txt" | head -30 | cut -c1-250
echo "moeplan test rc=$rc $([ $rc = 0 ] && echo PASS || echo FAIL) $(el)"

doctor() { # TAG ENVS SRC PRESET MS LIMIT
    local tag=$1 envs=$2 src=$3 preset=$4 ms=$5 t=$6 l rc
    l=$(( $(left) - 3 )); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 8 ] || { echo "doctor $tag: skipped (time)"; return 1; }
    env $envs timeout -k 2 "$t" "$BIN" doctor --device cuda --families moe $src "$preset" --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 30 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    rc=$?
    grep -E "^moe|^ +M |^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/$tag /"
    [ $rc -ne 0 ] && { echo "$tag rc=$rc"; tail -n 3 "$OUT/doc-$tag.err" | cut -c1-250; }
    if ! grep -q "❌" "$OUT/doc-$tag.txt" && [ $rc -eq 0 ]; then echo "moeplan doctor $tag PASS $(el)"; else echo "moeplan doctor $tag FAIL $(el)"; fi
}
echo "== 2. doctor moe (fp64 oracle), synth 35B 1 layer, M = 2048, 8192 $(el)"
doctor new35 "$NEW" --model-path "synth:qwen3.5-35b-a3b,layers=1" 2048,8192 18
doctor new397 "$NEW" --shapes qwen3.5-397b-a17b 8192 20

PLANS=("${DEV_PLANS_PREFILL[@]}")
for v in "new:$NEW" "old:$OLD"; do
    tag=${v%%:*}; envs=${v#*:}
    [ -n "$NCU" ] || { echo "no ncu"; break; }
    lim=$(( $(left) - 4 )); [ $lim -gt 20 ] && lim=20
    [ $lim -ge 12 ] || { echo "ncu $tag: skipped (time)"; continue; }
    echo "== 3. ncu $tag ($envs): generate synth 35B 4 layers, 8192-token prompt, -k regex:mg_ (limit $lim s) $(el)"
    env $envs timeout -k 2 $lim "$NCU" --clock-control none --cache-control none -k regex:mg_ \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-$tag" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 8192)" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|error:" "$OUT/ncu-$tag.out" | head -3
    [ -f "$OUT/ncu-$tag.ncu-rep" ] || continue
    timeout 10 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
        --print-kernel-base function >"$OUT/ncu-$tag.csv" 2>/dev/null
    python3 - "$OUT/ncu-$tag.csv" "$tag" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
if not rows:
    print("  no ncu rows"); sys.exit()
h = rows[0]
ki, ti = h.index("Kernel Name"), h.index("gpu__time_duration.sum")
ri = h.index("dram__bytes_read.sum") if "dram__bytes_read.sum" in h else None
d = collections.OrderedDict()
for r in rows[1:]:
    num = lambda x: float(x.replace(",", "").strip())
    try:
        t = num(r[ti])
    except (ValueError, IndexError):
        continue
    try:
        b = num(r[ri]) if ri is not None else 0.0
    except ValueError:
        b = 0.0
    d.setdefault(r[ki], []).append((t, b))
tot = 0.0
for k, v in d.items():
    mt = sum(x[0] for x in v) / len(v)
    print(f"  moeplan ncu {sys.argv[2]} {k[:40]:40s} n {len(v):3d}  mean {mt/1e3:8.2f} us  min {min(x[0] for x in v)/1e3:8.2f}  max {max(x[0] for x in v)/1e3:8.2f}  dram read {sum(x[1] for x in v)/len(v)/1e6:7.2f} MB")
    if "plan" in k or "topk" in k:
        tot += mt
print(f"  moeplan ncu {sys.argv[2]} routing (topk + plan kernels) {tot/1e3:.2f} us a layer")
PY
done
doctor old35 "$OLD" --model-path "synth:qwen3.5-35b-a3b,layers=1" 2048,8192 14

# 4. where the plan kernels' time goes: ncu sections (stall reasons, occupancy) of one launch each,
#    at the 8192-token step (the 4th launch: warm-up calls of smaller M come first)
for v in "new:$NEW:mg_plan_(count|place)"; do
    tag=${v%%:*}; rest=${v#*:}; envs=${rest%%:*}; kre=${rest#*:}
    [ -n "$NCU" ] || break
    lim=$(( $(left) - 4 )); [ $lim -gt 20 ] && lim=20
    [ $lim -ge 12 ] || { echo "ncu details $tag: skipped (time)"; continue; }
    echo "== 4. ncu details $tag ($kre) $(el)"
    env $envs timeout -k 2 $lim "$NCU" --clock-control none -k regex:"$kre" --launch-skip 0 --launch-count 4 \
        --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
        --section SchedulerStats -o "$OUT/ncud-$tag" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 8192)" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncud-$tag.out" 2>&1
    echo "rc=$? $(el)"
    [ -f "$OUT/ncud-$tag.ncu-rep" ] || continue
    timeout 10 "$NCU" --import "$OUT/ncud-$tag.ncu-rep" --page details --print-rule-details 2>/dev/null |
        grep -E "mg_plan|Duration|Grid Size|Achieved Occupancy|Warp Cycles Per Issued|Stall|stall|Issued Warp|No Eligible" |
        cut -c1-200 | head -40
done
echo "total $(( $(date +%s) - T0 )) s"
