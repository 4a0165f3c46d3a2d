#!/usr/bin/env bash
# bench/device/moemix.sh: NVFP4 routed experts next to a BF16 shared expert (the layout
# synth writes and ModelOpt 0.46 produces when it excludes `*.mlp.shared_expert.*`) in
# the cuda_fused_decode moe backend (src/ops/cuda/moe.cu), for the integrator's device
# rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/moemix.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe` on synth:qwen3.5-397b-a17b,layers=1 and
#    synth:qwen3.5-35b-a3b,layers=1 (shapes only: the doctor generates its own random
#    weights, here with a BF16 shared expert; header "(NVFP4 experts, BF16 shared
#    expert)"), every moe backend at M = 1, 2, 8, 64, 512: cuda_fused_decode must be ✅
#    at M <= 8 (the register-staged pair at M = 1, the cp.async pair at M >= 2) and
#    cuda_grouped_gemm ✅ everywhere (both were refused on this layout before).
# 2. The same shapes with an NVFP4 shared expert (`--shapes PRESET`), cuda_fused_decode
#    only at M = 1, 2, 8: the unchanged path still right, and its times to compare with
#    bench/RESULTS.md (~64 us at M = 1 on the 397B layer before this change).
# 3. Each kernel pair forced at M = 1 and 2 (LASTSTAND_MOE_FUSED_PAIR=1/2) with the BF16
#    shared expert on the 35B shape.
# 4. `laststand generate` greedy on synth:qwen3.5-35b-a3b,layers=2 (its real BF16 shared
#    expert): 12 tokens with cuda_fused_decode vs cuda_expert_loop (must be equal, or
#    nearly: BF16 rounding), plus cuda_grouped_gemm's (its shared expert's tiles now run
#    as their own launch with the BF16 loader).
# 5. compute-sanitizer memcheck on one fused doctor job per pair (if present and time left).
# Everything is bounded by `timeout`; the whole script stays under 100 s.
set -u
BIN=${1:?usage: moemix.sh BIN OUTDIR}
OUT=${2:?usage: moemix.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null

# (the 397B layer without cuda_expert_loop: its 5 jobs take ~12 s; the 35B one has all three)
for m in qwen3.5-397b-a17b:cuda_fused_decode,cuda_grouped_gemm qwen3.5-35b-a3b:cuda_fused_decode,cuda_grouped_gemm,cuda_expert_loop; do
    echo "== 1. doctor moe, synth:${m%%:*},layers=1 (BF16 shared expert): ${m#*:}"
    timeout 40 "$BIN" doctor --device cuda --families moe --model-path "synth:${m%%:*},layers=1" --m 1,2,8,64,512 \
        --backends "${m#*:}" --json "$OUT/doctor-bf16sh-${m%%:*}.json" 2>"$OUT/doctor-bf16sh-${m%%:*}.err"
    echo "rc=$? ($(el))"; grep -E "jobs|error|crash" "$OUT/doctor-bf16sh-${m%%:*}.err" | tail -n 6
done

for m in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    echo "== 2. doctor moe, --shapes $m (NVFP4 shared expert), cuda_fused_decode"
    timeout 15 "$BIN" doctor --device cuda --families moe --shapes "$m" --m 1,2,8 \
        --backends cuda_fused_decode 2>"$OUT/doctor-nvsh-$m.err" | grep -vE "^$|^choice|^  moe|^measured|^laststand"
    echo "rc=$? ($(el))"; grep -E "error|crash" "$OUT/doctor-nvsh-$m.err" | tail -n 4
done

echo "== 3. each fused pair forced, synth:qwen3.5-35b-a3b (BF16 shared expert)"
for pair in 1 2; do
    LASTSTAND_MOE_FUSED_PAIR=$pair timeout 12 "$BIN" doctor --device cuda --families moe \
        --model-path synth:qwen3.5-35b-a3b,layers=1 --m 1,2 --backends cuda_fused_decode 2>/dev/null |
        grep -E "^ +[0-9]+ " | sed "s/^/pair=$pair /"
done
echo "($(el))"

echo "== 4. generate greedy, synth:qwen3.5-35b-a3b,layers=2, by moe backend"
for be in cuda_fused_decode cuda_expert_loop cuda_grouped_gemm; do
    left=$(( 96 - ($(date +%s) - T0) )); [ $left -gt 30 ] && left=30
    [ $left -ge 8 ] || { echo "$be: skipped (time)"; continue; }
    timeout $left "$BIN" generate --device cuda --model-path synth:qwen3.5-35b-a3b,layers=2 --ids 1,2,3,4,5,6,7,8 \
        --max-new-tokens 12 --temperature 0 --moe-runner-backend "$be" >"$OUT/gen-$be.txt" 2>"$OUT/gen-$be.err"
    echo "$be: rc=$? $(tr '\n' ' ' <"$OUT/gen-$be.txt" | cut -c1-300) ($(el))"
    grep -iE "error|refus|unsupported|nan" "$OUT/gen-$be.err" | head -3
done
python3 - "$OUT/gen-cuda_fused_decode.txt" "$OUT/gen-cuda_expert_loop.txt" <<'PY'
import json, sys
try:
    a, b = (json.loads(open(p).read())["ids"] for p in sys.argv[1:3])
    same = sum(x == y for x, y in zip(a, b))
    print(f"fused vs expert_loop: {same}/{max(len(a), len(b))} tokens equal, first difference at "
          f"{next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)}")
except Exception as ex:
    print(f"fused vs expert_loop: no comparison ({ex})")
PY

echo "== 5. compute-sanitizer memcheck, cuda_fused_decode, synth:qwen3.5-35b-a3b (BF16 shared expert)"
if command -v compute-sanitizer >/dev/null && [ $(( $(date +%s) - T0 )) -lt 85 ]; then
    timeout $(( 97 - ($(date +%s) - T0) )) compute-sanitizer --tool memcheck --target-processes all \
        --print-limit 5 "$BIN" doctor --device cuda --families moe --model-path synth:qwen3.5-35b-a3b,layers=1 \
        --m 1,2 --backends cuda_fused_decode >"$OUT/memcheck.txt" 2>&1
    echo "rc=$? ($(el))"; grep -E "ERROR SUMMARY|Invalid|^ +[0-9]+ " "$OUT/memcheck.txt" | sort | uniq -c | head -8
else
    echo "skipped (no compute-sanitizer or no time)"
fi
echo "total $(el)"
