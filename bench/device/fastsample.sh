#!/usr/bin/env bash
# device-limit: 90
# bench/device/fastsample.sh: top_k / top_p without the radix descent (sample.cu cl_key_select,
# the cluster form's default since round S7-R2; LASTSTAND_SAMPLE_FAST=0: the descent; task
# fastsample, RESULTS "Sampling: top_k / top_p without the descent (S7)") on the H200, in the
# integrator's device rounds (notes DEVICE_ROUNDS.md).
#
#   bash bench/device/fastsample.sh BIN OUTDIR
#
# 1. test_sample_cuda (beside BIN: tests/): every host-oracle test on each form (one block,
#    cluster, cluster with 16-byte passes, cluster with the wide-digit top_k / top_p), the cluster
#    against the one block on 248320-wide rows, and the wide-digit form against the descent and
#    the host: kept sets (top_k, top_p, both, min_p, k 4096 and >= V, top_p 1e-6 and 0.999999,
#    bans, flat rows, a top_p near-tie), batch 16 of mixed parameters = each row at batch 1.
# 2. test_sample_cuda --bench: µs a call, descent (scalar / 16-byte passes) vs wide-digit (and its
#    test-only variants: 1 / 2 blocks an SM, aggregated histograms, the row in shared memory),
#    batch 1 and 16, greedy, top_p, top_k, both, min_p, no filter, on 248320-wide BF16 rows.
# 3. The engine's mean decode step (`generate`, CUDA graphs, 512-token prompt + 129 tokens) of
#    synth Qwen3.5-35B-A3B, 8 layers, seeded T 0.7 top_k 20 top_p 0.95 (Qwen's
#    generation_config), and T 0.7 top_p 0.9: descent vs wide-digit (LASTSTAND_SAMPLE_FAST=0 / 1):
#    the ids must agree.
set -u
BIN=${1:?usage: fastsample.sh BIN OUTDIR}
OUT=${2:?usage: fastsample.sh BIN OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
D=$(dirname "$BIN")
export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "($(( $(date +%s) - T0 )) s)"; }
left() { echo $(( 86 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1
git log --oneline -1 2>/dev/null | cut -c1-100
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt
       --lm-head-backend cuda_cublaslt)
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }

echo "== test_sample_cuda $(el)"
if [ -x "$D/tests/test_sample_cuda" ]; then
    timeout -k 3 40 "$D/tests/test_sample_cuda" >"$OUT/test_sample_cuda.log" 2>&1
    echo "rc=$? (0: every test passed) $(el)"
    grep -E "^\[==========\] |PASSED|FAILED|SKIPPED|rror|Assert|failure|row [0-9]+:|not in the host" \
        "$OUT/test_sample_cuda.log" | head -40
    grep -E "^  V [0-9]+ " "$OUT/test_sample_cuda.log" | head -60
    echo "== test_sample_cuda --bench $(el)"
    timeout -k 3 25 "$D/tests/test_sample_cuda" --bench >"$OUT/sample_bench.log" 2>&1
    echo "rc=$? $(el)"
    cut -c1-330 "$OUT/sample_bench.log" | tail -40
else
    echo "missing: $D/tests/test_sample_cuda"
fi

# 4. (time left, ncu present) the fast form's warp stall reasons on one row each of top_k 20 +
#    top_p 0.95, top_p 0.9 and no filter (test_sample_cuda --profile: three launches): where a
#    sampled row's time goes, for the next step.
# gen tag timeout args...: mean decode step (the engine's "decode steps" line) and the ids
gen() {
    local tag=$1 lim=$2
    shift 2
    env ${GEN_ENV:-} timeout -k 3 "$lim" "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=8" \
        --ids "$(ids 512)" --max-new-tokens 129 --device cuda "${PLANS[@]}" "$@" >"$OUT/gen-$tag.out" 2>&1
    local rc=$?
    printf '  %-12s rc=%d %s | %s\n' "$tag" $rc "$(grep -oE '[0-9]+ decode steps[^|]*ms each' "$OUT/gen-$tag.out" | head -1)" \
        "$(grep -oE '"ids": *\[[0-9, ]{0,60}' "$OUT/gen-$tag.out" | head -1)"
    [ $rc = 0 ] || grep -iE "error|fail" "$OUT/gen-$tag.out" | head -3
}
same_ids() { # tag tag
    local a b
    a=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$1.out" 2>/dev/null)
    b=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$2.out" 2>/dev/null)
    echo "  ids $1 == $2: $([ -n "$a" ] && [ "$a" = "$b" ] && echo yes || echo NO)"
}
echo "== decode step, synth 35B 8 layers, seeded T 0.7 top_k 20 top_p 0.95: descent vs wide-digit $(el)"
for f in 0 1; do
    [ "$(left)" -gt 12 ] || { echo "  (skipped: time)"; continue; }
    GEN_ENV="LASTSTAND_SAMPLE_FAST=$f" gen "k20p95-f$f" 20 --temperature 0.7 --top-k 20 --top-p 0.95 --seed 7
done
same_ids k20p95-f0 k20p95-f1
for f in 0 1; do
    [ "$(left)" -gt 12 ] || { echo "  (skipped: time)"; continue; }
    GEN_ENV="LASTSTAND_SAMPLE_FAST=$f" gen "p90-f$f" 20 --temperature 0.7 --top-p 0.9 --seed 11
done
same_ids p90-f0 p90-f1
[ "$(left)" -gt 12 ] && gen greedy 20
if command -v ncu >/dev/null 2>&1 && [ -x "$D/tests/test_sample_cuda" ] && [ "$(left)" -gt 30 ]; then
    echo "== ncu: the fast form's stall reasons (k20p95, p90, no filter) $(el)"
    timeout -k 3 $(( $(left) - 3 )) ncu -k regex:smw_row_kernel -c 3 --csv --metrics \
        "gpu__time_duration.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" \
        "$D/tests/test_sample_cuda" --profile >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
    echo "rc=$? $(el)"
    python3 - "$OUT/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
if not rows: print("  (no ncu rows)"); sys.exit()
h = rows[0]; ix = {k: i for i, k in enumerate(h)}
by = {}
for r in rows[1:]:
    by.setdefault(r[ix["ID"]], {})[r[ix["Metric Name"]]] = r[ix["Metric Value"]]
for kid, mt in sorted(by.items(), key=lambda t: int(t[0])):
    st = sorted(((float(v.replace(",", "")), k.split("stalled_")[1].split("_per")[0]) for k, v in mt.items()
                 if "stalled_" in k and v.replace(",", "").replace(".", "").isdigit()), reverse=True)
    print("  launch %s: %s ns, %s warp instructions; stalls per issue: %s" % (kid, mt.get("gpu__time_duration.sum"),
          mt.get("smsp__inst_executed.sum"), ", ".join("%s %.1f" % (n, v) for v, n in st[:7])))
PY
    grep -ihE "error|warn" "$OUT/ncu.err" "$OUT/ncu.csv" | head -3
fi
echo "total $(( $(date +%s) - T0 )) s"
