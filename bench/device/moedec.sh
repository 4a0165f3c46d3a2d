#!/usr/bin/env bash
# device-limit: 120
# bench/device/moedec.sh: the fused MoE decode (cuda_fused_decode, src/ops/cuda/moe_fused.cu)
# in one launch (LASTSTAND_MOE_ONE=1: the persistent kernel moe_one_kernel) against the
# four-launch chain (LASTSTAND_MOE_ONE=0), for the integrator's device rounds
# (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/moedec.sh BIN OUTDIR
#
# 1. `laststand doctor --families moe --backends cuda_fused_decode` (every cell checked against
#    the fp64 CPU reference; times: chains of back-to-back calls) on the 35B and 397B layers at
#    M = 1, 2, 4, 8, with the NVFP4 shared expert (`--shapes PRESET`, "nv") and the BF16 one
#    synth writes (`--model-path synth:PRESET,layers=1`, "bf"): the four launches (ONE=0), the
#    one-launch kernel (ONE=1) and the three-launch form (ONE=4) (fused_run; ONE=2 and 3, the
#    one-launch kernel's other grid forms, were timed in R2).
# 1b. LASTSTAND_MOE_ONE_TRACE=1: block 0's clock at the one-launch kernel's stage boundaries.
# 1c. ncu, one call's kernels at the 35B layer, M = 1: old, three launches, one launch.
# 2. `laststand generate` on the full 40-layer synth Qwen3.5-35B-A3B (as decprof.sh: 512-token
#    prompt, 129 new tokens, CUDA graphs, the plans named): the engine's mean decode step
#    ("N decode steps ..., X ms each"), old vs ONE=1 and 4; the greedy ids compared (the new
#    forms' routing and sums are the old path's bit for bit at M = 1; the engine itself checks
#    its CUDA graph against eager steps at start-up).
# 3. pytest tests/test_gpu_moe_fused.py (the default choices and the ONE knobs; the full knob
#    matrix when time is left).
# Every step is bounded by `timeout`; the whole script stays under 120 s.
set -u
BIN=${1:?usage: moedec.sh BIN OUTDIR}
OUT=${2:?usage: moedec.sh BIN OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export LD_LIBRARY_PATH="$(dirname "$BIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
el() { echo "($(( $(date +%s) - T0 )) s)"; }
left() { echo $(( 115 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1
git log --oneline -1 2>/dev/null

# doctor TAG ONE PRESET SHARED(nv|bf) MS: one table, rows prefixed with TAG
doctor() {
    local tag=$1 one=$2 preset=$3 sh=$4 ms=$5 src
    if [ "$sh" = bf ]; then src=(--model-path "synth:$preset,layers=1"); else src=(--shapes "$preset"); fi
    local t=$(left); [ "$t" -gt 12 ] && t=12
    [ "$t" -ge 5 ] || { echo "$tag $preset $sh: skipped (time)"; return; }
    local f="$OUT/doc-$tag-$preset-$sh"
    LASTSTAND_MOE_ONE=$one timeout -k 2 "$t" "$BIN" doctor --device cuda --families moe "${src[@]}" --m "$ms" \
        --backends cuda_fused_decode >"$f.txt" 2>"$f.err"
    local rc=$?
    grep -E "^ +[0-9]+ " "$f.txt" | sed "s/^/$tag ${preset%%-a*} sh=$sh /"
    [ $rc = 0 ] || { echo "$tag $preset $sh: rc=$rc"; grep -iE "error|fail|crash|unsupported|wrong" "$f.err" "$f.txt" | head -4; }
}

echo "== 1. doctor moe cuda_fused_decode, old (ONE=0) vs new (ONE=1: one launch, 64 registers, 2 blocks an SM; 2: 1 an SM, no register cap; 3: 64 registers, 1 an SM; 4: three launches) $(el)"
for p in qwen3.5-35b-a3b qwen3.5-397b-a17b; do
    for one in 0 1 4; do doctor $([ $one = 0 ] && echo old || echo new$one) $one $p bf 1,2,4,8; done
    for one in 0 1 4; do doctor $([ $one = 0 ] && echo old || echo new$one) $one $p nv 1,2,8; done
done
echo "$(el)"

echo "== 1b. block 0's stage times inside the new kernel (LASTSTAND_MOE_ONE_TRACE=1, calls 32-34, bf shared) $(el)"
for pm in qwen3.5-35b-a3b:1 qwen3.5-397b-a17b:1; do
    p=${pm%:*} m=${pm#*:}
    for one in 1; do
        [ "$(left)" -ge 75 ] || continue
        LASTSTAND_MOE_ONE=$one LASTSTAND_MOE_ONE_TRACE=1 timeout -k 2 10 "$BIN" doctor --device cuda --families moe \
            --model-path "synth:$p,layers=1" --m $m --backends cuda_fused_decode >/dev/null 2>"$OUT/trace-$one-$p-$m.err"
        echo "ONE=$one rc=$? $(grep -o 'moe one-launch trace.*' "$OUT/trace-$one-$p-$m.err" | tail -1)"
    done
done
echo "$(el)"

t=$(left)
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$NCU" ] && [ "$t" -ge 60 ]; then
    echo "== 1c. ncu: the kernels of one call, 35B layer, BF16 shared, M = 1: old, three launches, one launch $(el)"
    for one in 0 4 1; do
        LASTSTAND_MOE_ONE=$one timeout -k 2 12 "$NCU" --clock-control none --cache-control none -k regex:moe_ --launch-skip 12 \
            --launch-count 4 --metrics gpu__time_duration.sum --csv \
            "$BIN" doctor --device cuda --families moe --model-path synth:qwen3.5-35b-a3b,layers=1 --m 1 \
            --backends cuda_fused_decode >"$OUT/ncu-$one.csv" 2>"$OUT/ncu-$one.err"
        echo "ONE=$one rc=$?"
        grep -E '^"' "$OUT/ncu-$one.csv" | python3 -c "
import csv, sys
rows = list(csv.reader(sys.stdin))
if rows:
    h = rows[0]; ik, im, iv = h.index('Kernel Name'), h.index('Metric Name'), h.index('Metric Value')
    for r in rows[1:]:
        print('  ', r[ik].split('(')[0][:40], r[im], r[iv])
"
    done
fi

ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt)
# gen TAG ONE LIMIT [flags]: the engine's mean decode step of the full 40-layer model
gen() {
    local tag=$1 one=$2 lim=$3
    shift 3
    local t=$(left); [ "$t" -lt "$lim" ] && lim=$t
    [ "$lim" -ge 10 ] || { echo "gen $tag: skipped (time)"; return; }
    echo "== 2. gen $tag: generate synth:qwen3.5-35b-a3b (40 layers), 512-token prompt + 129 new tokens, LASTSTAND_MOE_ONE=$one $* $(el)"
    LASTSTAND_MOE_ONE=$one timeout -k 3 "$lim" "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" \
        --max-new-tokens 129 --device cuda "${PLANS[@]}" "$@" >"$OUT/gen-$tag.json" 2>"$OUT/gen-$tag.err"
    echo "rc=$? $(el)"
    grep -E "decode steps of|CUDA graphs|rror|mismatch|differ" "$OUT/gen-$tag.err" | cut -c1-220 | head -5
}
gen old 0 20
gen new1 1 20
gen new4 4 20
python3 - "$OUT" <<'PY'
import json, sys
d = sys.argv[1]
def ids(t):
    try:
        return json.load(open(f"{d}/gen-{t}.json"))["ids"]
    except Exception as ex:
        return f"({ex})"
def cmp(a, b):
    if isinstance(a, str) or isinstance(b, str):
        return f"no comparison {a if isinstance(a, str) else ''} {b if isinstance(b, str) else ''}"
    p = 0
    while p < min(len(a), len(b)) and a[p] == b[p]:
        p += 1
    return f"{p}/{max(len(a), len(b))} leading ids equal"
o = ids("old")
for t in ("new1", "new4"):
    print(f"greedy ids old vs {t} (graphs):", cmp(o, ids(t)))
PY

echo "== 3. pytest tests/test_gpu_moe_fused.py $(el)"
export BUILD=$(dirname "$BIN") LS_SHARED=$(dirname "$BIN")
t=$(left)
if [ "$t" -ge 15 ]; then
    timeout -k 3 "$t" python3 -m pytest -q -p no:cacheprovider -rfE -x tests/test_gpu_moe_fused.py -k "default or ONE" 2>&1 | tail -15
fi
t=$(left)
if [ "$t" -ge 25 ]; then
    echo "== 3b. the rest of the knob matrix $(el)"
    timeout -k 3 "$t" python3 -m pytest -q -p no:cacheprovider -rfE tests/test_gpu_moe_fused.py -k "not default and not ONE" 2>&1 | tail -15
fi
echo "total $(( $(date +%s) - T0 )) s"
