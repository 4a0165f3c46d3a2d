#!/usr/bin/env bash
# bench/device/moegrp.sh: the cuda_grouped_gemm moe backend (src/ops/cuda/moe_grouped.cu)
# on a GPU machine, for the integrator's device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/moegrp.sh BIN OUTDIR
#
# 1. `laststand doctor` on the moe family, cuda_grouped_gemm next to cuda_expert_loop:
#    the Qwen3.5-397B layer shape (M = 1, 8, 64, 512, 1024, 3072) and the 35B one (odd M
#    too: partial tiles); the matrices (verdicts against the fp64 CPU reference, times).
# 2. The MoE fixture models, NVFP4 and BF16 (reads .dev/int/fixtures/models/*, copied from
#    ../shared/fixtures/models): `laststand logits --device cuda --moe-runner-backend X`
#    for X = cuda_grouped_gemm and cuda_expert_loop against `--device cpu`: worst row of
#    max|a-b|/max|b| and argmax agreement. These have I = 48 (the plain NVFP4 loader) and
#    qwen3_moe* have no shared expert. Then the doctor on the BF16 fixture's moe shape.
#    Then the 397B shape with the tile height forced to the other choice (16 / 64).
# 3. compute-sanitizer memcheck on one fixture with cuda_grouped_gemm (if present).
# 4. ncu (if present): durations of the first call's five kernels (top-k, plan, gate/up,
#    down, combine) on the 397B shape at M = 64 and 3072, as time allows.
# Everything is bounded by `timeout`; the whole script stays under 100 s.
set -u
BIN=${1:?usage: moegrp.sh BIN OUTDIR}
OUT=${2:?usage: moegrp.sh BIN OUTDIR}
FIX=${FIX:-.dev/int/fixtures/models}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
nvidia-smi -L 2>&1 | head -2
git log --oneline -1 2>/dev/null

echo "== doctor moe, qwen3.5-397b-a17b"
timeout 45 "$BIN" doctor --device cuda --families moe --shapes qwen3.5-397b-a17b --m 1,8,64,512,1024,3072 \
    --backends cuda_grouped_gemm,cuda_expert_loop,cuda_fused_decode --json "$OUT/doctor397.json" 2>"$OUT/doctor397.err"
echo "rc=$? ($(( $(date +%s) - T0 )) s)"; tail -n 8 "$OUT/doctor397.err"

echo "== doctor moe, qwen3.5-35b-a3b"
timeout 25 "$BIN" doctor --device cuda --families moe --shapes qwen3.5-35b-a3b --m 1,3,64,100,512,3072 \
    --backends cuda_grouped_gemm,cuda_expert_loop --json "$OUT/doctor35.json" 2>"$OUT/doctor35.err"
echo "rc=$? ($(( $(date +%s) - T0 )) s)"; tail -n 8 "$OUT/doctor35.err"

echo "== tile height forced (LASTSTAND_GROUPED_BM), qwen3.5-397b-a17b, cuda_grouped_gemm"
if [ $(( $(date +%s) - T0 )) -lt 50 ]; then
    LASTSTAND_GROUPED_BM=64 timeout 15 "$BIN" doctor --device cuda --families moe --shapes qwen3.5-397b-a17b \
        --m 512,1024 --backends cuda_grouped_gemm 2>/dev/null | grep -E "^ +[0-9]+ " | sed 's/^/BM=64 /'
    LASTSTAND_GROUPED_BM=16 timeout 15 "$BIN" doctor --device cuda --families moe --shapes qwen3.5-397b-a17b \
        --m 1024 --backends cuda_grouped_gemm 2>/dev/null | grep -E "^ +[0-9]+ " | sed 's/^/BM=16 /'
else
    echo "skipped (time)"
fi

echo "== fixtures: logits vs --device cpu"
timeout 35 python3 - "$BIN" "$FIX" "$OUT" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, FIX, OUT = sys.argv[1:4]
for name in sorted(os.listdir(FIX)) if os.path.isdir(FIX) else []:
    d = os.path.join(FIX, name)
    if name not in ("qwen3_5_moe_text-nvfp4", "qwen3_moe-nvfp4", "qwen3_5_moe_text", "qwen3_moe") \
            or not os.path.exists(os.path.join(d, "ref.json")):
        continue
    ids = ",".join(map(str, json.load(open(os.path.join(d, "ref.json")))["input_ids"]))
    res = {}
    for tag, extra in (("cpu", ["--device", "cpu"]),
                       ("grouped", ["--device", "cuda", "--moe-runner-backend", "cuda_grouped_gemm"])):
        try:
            p = subprocess.run([BIN, "logits", "--model-path", d, "--ids", ids, *extra],
                               capture_output=True, text=True, timeout=12)
        except subprocess.TimeoutExpired:
            print(f"{name:24s} {tag}: TIMEOUT"); continue
        if p.returncode:
            print(f"{name:24s} {tag}: rc={p.returncode} {p.stderr.strip()[-400:]}"); continue
        res[tag] = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    if "cpu" not in res:
        continue
    b = res["cpu"]
    for tag in ("grouped",):
        if tag not in res:
            continue
        a = res[tag]
        if a.shape != b.shape:
            print(f"{name:24s} {tag}: shape {a.shape} vs {b.shape}"); continue
        rel = (np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max()
        top2 = np.sort(b, axis=1)[:, -2:]
        sure = (top2[:, 1] - top2[:, 0]) > 0.05
        agree = (a.argmax(1) == b.argmax(1))
        print(f"{name:24s} {tag:8s} worst rel {rel:.3e}  argmax {agree.sum()}/{len(agree)}"
              f"  (margin>0.05: {agree[sure].sum()}/{sure.sum()})  nan={int(np.isnan(a).sum())}")
PY
echo "($(( $(date +%s) - T0 )) s)"
if [ -d "$FIX/qwen3_5_moe_text" ]; then
    echo "== doctor moe, BF16 experts (qwen3_5_moe_text fixture)"
    timeout 15 "$BIN" doctor --device cuda --families moe --model-path "$FIX/qwen3_5_moe_text" --m 1,5,64,300 \
        --backends cuda_grouped_gemm,cuda_expert_loop 2>"$OUT/doctorbf16.err"
    echo "rc=$?"; tail -n 3 "$OUT/doctorbf16.err"
fi

echo "== compute-sanitizer memcheck, cuda_grouped_gemm"
M1=$FIX/qwen3_5_moe_text-nvfp4
if command -v compute-sanitizer >/dev/null && [ -d "$M1" ] && [ $(( $(date +%s) - T0 )) -lt 80 ]; then
    IDS=$(python3 -c "import json;print(','.join(map(str,json.load(open('$M1/ref.json'))['input_ids'])))")
    timeout 12 compute-sanitizer --tool memcheck --print-limit 5 "$BIN" logits --model-path "$M1" --ids "$IDS" \
        --device cuda --moe-runner-backend cuda_grouped_gemm >"$OUT/sanitizer.out" 2>"$OUT/sanitizer.err"
    echo "rc=$?"; grep -E "ERROR SUMMARY|Invalid|out of bounds|at 0x|by thread" "$OUT/sanitizer.out" "$OUT/sanitizer.err" | head -12
else
    echo "skipped (no compute-sanitizer, no fixture or no time left)"
fi
echo "== ncu: the first call's kernels, qwen3.5-397b-a17b, M = 64 and 3072"
if command -v ncu >/dev/null; then
    for m in 64 3072; do
        left=$(( 95 - ($(date +%s) - T0) ))
        [ $left -lt 12 ] && { echo "M=$m skipped (time)"; continue; }
        [ $left -gt 20 ] && left=20
        timeout $left ncu --target-processes all -k regex:mg_ -c 5 --metrics gpu__time_duration.sum --csv \
            "$BIN" doctor --device cuda --families moe --shapes qwen3.5-397b-a17b --m $m \
            --backends cuda_grouped_gemm --trial-timeout 60 >"$OUT/ncu$m.csv" 2>"$OUT/ncu$m.err"
        echo "M=$m rc=$?"
        python3 - "$OUT/ncu$m.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1], errors="replace")) if len(r) > 10]
if not rows:
    print("  no ncu rows"); sys.exit()
h = rows[0]
ki, vi, ui = h.index("Kernel Name"), h.index("Metric Value"), h.index("Metric Unit")
for r in rows[1:]:
    print(f"  {r[ki][:60]:60s} {r[vi]:>12s} {r[ui]}")
PY
    done
else
    echo "skipped (no ncu)"
fi

echo "total $(( $(date +%s) - T0 )) s"
