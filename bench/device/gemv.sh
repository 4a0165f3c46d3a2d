#!/usr/bin/env bash
# bench/device/gemv.sh: the gemm backend cuda_gemv (src/ops/cuda/gemv.cu) on a GPU
# machine, for the integrator's device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/gemv.sh BIN OUTDIR
#
# 1. tests/test_gemv_cuda beside BIN (cmocka): fp64 checks on the shapes the doctor
#    does not list (GDN in_proj_ba, partial tiles, K % 32 != 0), accumulate,
#    bitwise reproducibility, CUDA graph replay, refusals.
# 2. `laststand doctor` on the gemm family, cuda_gemv next to cuda_cublaslt (and
#    cuda_ref, the doctor's GPU oracle), for the BF16 shapes of
#    synth:qwen3.5-397b-a17b and synth:qwen3.5-35b-a3b at M = 1..32 (M > 16 is refused).
# 3. The K split forced to 1, 2, 4, 8 (LASTSTAND_GEMV_SPLIT) at M = 1, both models.
# 4. ncu (if present): kernel durations and DRAM bytes of cuda_gemv at M = 1 on the
#    397B shapes, median per grid (one grid per shape; no launch boundary in these); the
#    same for every kernel of the cuda_cublaslt run.
# 5. torch.sum over 1-64 MB, L2-hot vs rotating copies: the cold small-read floor of any kernel.
# Everything is bounded by `timeout`; the whole script stays under 100 s.
set -u
BIN=${1:?usage: gemv.sh BIN OUTDIR}
OUT=${2:?usage: gemv.sh BIN OUTDIR}
mkdir -p "$OUT"
BDIR="$(cd "$(dirname "$BIN")" && pwd)"
export LD_LIBRARY_PATH="$BDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
nvidia-smi -L 2>&1 | head -2
git log --oneline -1 2>/dev/null

echo "== unit test test_gemv_cuda"
TB=""
for c in "$BDIR/tests/test_gemv_cuda" "$BDIR/../tests/test_gemv_cuda" build/tests/test_gemv_cuda; do
    [ -x "$c" ] && { TB=$c; break; }
done
if [ -n "$TB" ]; then
    timeout 40 "$TB" >"$OUT/unit.out" 2>&1
    echo "rc=$? ($(( $(date +%s) - T0 )) s)"
    grep -vE "^\[ RUN|^\[       OK" "$OUT/unit.out" | tail -n 60
else
    echo "no test_gemv_cuda beside $BIN (stage build/tests/test_gemv_cuda into its tests/ folder)"
fi

for model in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    echo "== doctor gemm, synth:$model"
    left=$(( 82 - ($(date +%s) - T0) ))
    [ $left -lt 10 ] && { echo "skipped (time)"; continue; }
    [ $left -gt 40 ] && left=40
    timeout $left "$BIN" doctor --device cuda --families gemm --model-path "synth:$model" --m 1,2,4,8,16,32 \
        --backends cuda_ref,cuda_cublaslt,cuda_gemv --json "$OUT/doctor-$model.json" \
        >"$OUT/doctor-$model.txt" 2>"$OUT/doctor-$model.err"
    echo "rc=$? ($(( $(date +%s) - T0 )) s)"
    tail -n 4 "$OUT/doctor-$model.err"
    cat "$OUT/doctor-$model.txt"
done

for model in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    echo "== the K split forced (LASTSTAND_GEMV_SPLIT), cuda_gemv, synth:$model, M = 1"
    for S in 1 2 4 8; do
        [ $(( $(date +%s) - T0 )) -gt 72 ] && { echo "S=$S skipped (time)"; continue; }
        LASTSTAND_GEMV_SPLIT=$S timeout 10 "$BIN" doctor --device cuda --families gemm \
            --model-path synth:$model --m 1 --backends cuda_gemv 2>/dev/null \
            | grep -E "^gemm |^ +1 " | paste - - | sed -E "s/^/S=$S /; s/ +/ /g" | cut -c1-160
    done
done

echo "== ncu: cuda_gemv kernel time and DRAM bytes at M = 1, synth:qwen3.5-397b-a17b (median per grid)"
if command -v ncu >/dev/null; then
    left=$(( 80 - ($(date +%s) - T0) ))
    [ $left -gt 20 ] && left=20
    if [ $left -gt 8 ]; then
        timeout $left ncu --target-processes all -k regex:gv_kernel -c 400 \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
            "$BIN" doctor --device cuda --families gemm --model-path synth:qwen3.5-397b-a17b --m 1 \
            --backends cuda_gemv --trial-timeout 60 >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
        echo "rc=$?"
        python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys, statistics
from collections import defaultdict
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
if not rows:
    print("  no ncu rows"); sys.exit()
h = rows[0]
gi, mi, vi, ui = h.index("Grid Size"), h.index("Metric Name"), h.index("Metric Value"), h.index("Metric Unit")
by = defaultdict(lambda: defaultdict(list))
unit = {}
for r in rows[1:]:
    try:
        by[r[gi]][r[mi]].append(float(r[vi].replace(",", "")))
        unit[r[mi]] = r[ui]
    except ValueError:
        pass
for g, m in by.items():
    t = statistics.median(m.get("gpu__time_duration.sum", [float("nan")]))
    b = statistics.median(m.get("dram__bytes_read.sum", [float("nan")]))
    tu, bu = unit.get("gpu__time_duration.sum", "?"), unit.get("dram__bytes_read.sum", "?")
    print(f"  grid {g:>14s}  n={len(m.get('gpu__time_duration.sum', [])):3d}  time {t:10.2f} {tu}  dram read {b:12.2f} {bu}")
PY
    else
        echo "skipped (time)"
    fi
else
    echo "skipped (no ncu)"
fi
echo "== ncu: every kernel of the cuda_cublaslt doctor run at M = 1 (median per kernel and grid)"
left=$(( 85 - ($(date +%s) - T0) ))
[ $left -gt 20 ] && left=20
if command -v ncu >/dev/null && [ $left -gt 8 ]; then
    timeout $left ncu --target-processes all -c 150 --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
        "$BIN" doctor --device cuda --families gemm --model-path synth:qwen3.5-397b-a17b --m 1 \
        --backends cuda_cublaslt --trial-timeout 60 >"$OUT/ncu_lt.csv" 2>"$OUT/ncu_lt.err"
    echo "rc=$?"
    python3 - "$OUT/ncu_lt.csv" <<'PY'
import csv, sys, statistics
from collections import defaultdict
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
if not rows:
    print("  no ncu rows"); sys.exit()
h = rows[0]
ki, gi, mi, vi = h.index("Kernel Name"), h.index("Grid Size"), h.index("Metric Name"), h.index("Metric Value")
by = defaultdict(lambda: defaultdict(list))
for r in rows[1:]:
    try:
        by[(r[ki][:48], r[gi])][r[mi]].append(float(r[vi].replace(",", "")))
    except ValueError:
        pass
for (k, g), m in by.items():
    t = statistics.median(m.get("gpu__time_duration.sum", [float("nan")]))
    b = statistics.median(m.get("dram__bytes_read.sum", [float("nan")]))
    print(f"  {k:48s} {g:>14s} n={len(m.get('gpu__time_duration.sum', [])):3d} {t:10.0f} ns {b / 1e6:9.2f} MB")
PY
else
    echo "skipped (no ncu or no time)"
fi

echo "== the small-read floor: torch.sum over a BF16 buffer, L2-hot vs rotating (cold) copies"
left=$(( 97 - ($(date +%s) - T0) ))
[ $left -gt 20 ] && left=20
[ $left -lt 5 ] && left=1
timeout $left python3 - <<'PY' 2>&1 | tail -n 12
import torch, statistics
if not torch.cuda.is_available():
    print("no torch CUDA"); raise SystemExit
dev = torch.device("cuda")
def bench(mb, rotate, reps=40):
    n = int(mb * 2**20 / 2)
    k = max(2, int(400 / mb) + 1) if rotate else 1
    bufs = [torch.randn(n, device=dev, dtype=torch.bfloat16) for _ in range(k)]
    for b in bufs:
        b.sum(dtype=torch.float32)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda._sleep(int(2e8))  # a hold: the calls below queue up and run back to back
    for i in range(reps):
        ev[i][0].record(); bufs[(i + 1) % k].sum(dtype=torch.float32); ev[i][1].record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) * 1e3 for a, b in ev)
for mb in (1, 4, 8, 64):
    h, c = bench(mb, False), bench(mb, True)
    print(f"  {mb:3d} MB  L2-hot {h:7.1f} us   rotating {c:7.1f} us   ({mb * 2**20 / c / 1e3:6.0f} GB/s cold)")
PY
echo "total $(( $(date +%s) - T0 )) s"
