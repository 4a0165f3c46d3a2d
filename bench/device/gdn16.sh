#!/usr/bin/env bash
# device-limit: 150
# bench/device/gdn16.sh: the GDN decode kernel at batch 16 (task gdn16, notes DEVICE_ROUNDS.md):
# gd_kernel (S over 255 registers, 8-warp blocks on wide grids) against gd_kernel_s, the streamed
# form (a v head a block, its state brought into shared memory by bulk copies, 3 blocks an SM:
# LASTSTAND_GDN_STREAM=1 every call, 4 wide decode steps: R1's default) and gd_kernel_p, its
# persistent form (a block an SM, 3 states in flight: =2 wide decode steps, the default since R2;
# =3 every decode step); =0 never. src/ops/cuda/gdn_decode.cu.
#
#   bash bench/device/gdn16.sh BIN OUTDIR
#
# 1. cmocka test_gdn_decode_cuda (beside BIN in tests/): gd_kernel_s bitwise equal to gd_kernel at
#    the 35B / 397B / dk 64 / fixture shapes (tokens 1, 6, 0; fused norm and not), the 16-sequence
#    decode step (streamed under STREAM=2) equal to a mixed call and a 3-sequence call.
# 2. ncu (caches flushed: the state comes from DRAM as in a 40-layer step) on that test's wide step:
#    the 16-sequence launches (grid y = 16; gd_kernel_p's grid 132 x 1) of gd_kernel
#    (LASTSTAND_GDN_T1=0: 8-warp blocks), gd_kernel_s and gd_kernel_p, 35B then 397B shapes:
#    duration, occupancy, issue, stalls, DRAM %.
# 3. the doctor's gdn cells (fp64 reference), 35B and 397B shapes, M = 1, 8, 16, 64, cuda_decode
#    with LASTSTAND_GDN_STREAM=0, =1 (every call streamed; the doctor's M > 1 mixes decode rows
#    with prompt chunks) and =3 (M = 1: gd_kernel_p).
# 4. the engine's decode step: serve of the 40-layer synth 35B (CUDA graphs, the plans auto picks
#    named, 1024 in / 256 out), c = 16 (32 prompts) with STREAM=0 and the default, c = 1 (8 prompts)
#    with the default (one sequence: gd_kernel as before; S8: 2.39 ms).
# 5. fixtures (dir-of-BIN/fixtures/models): 12 greedy tokens, STREAM=1 and 3 == STREAM=0, graphs == eager.
# 6. (time left) compute-sanitizer memcheck / racecheck on the streamed test.
. "$(dirname "$0")/lib.sh"
dev_init gdn16 145 "$@"
TEST=$D/tests/test_gdn_decode_cuda

# 1. the bitwise tests
echo "== cmocka test_gdn_decode_cuda $(el)"
if [ -x "$TEST" ]; then
    timeout -k 3 30 "$TEST" >"$OUT/test.log" 2>&1
    echo "rc=$? (0: every test passed) $(el)"
    grep -E "PASSED|FAILED|SKIPPED|differs|rror|OK \]|FAIL" "$OUT/test.log" | head -14
else
    echo "missing: $TEST"
fi

# 2. gd_kernel vs gd_kernel_s on the 16-sequence decode step, under ncu
echo "== ncu: the wide-step test (LASTSTAND_GDN_T1=0), launches of grid y = 16 $(el)"
dev_ncu_test "$OUT/ncu-gd.txt" 40 gd_kernel test_wide_decode_step_equals_the_group_kernel "$TEST" LASTSTAND_GDN_T1=0 &&
    python3 bench/device/c16_ncu_gd.py "$OUT/ncu-gd.txt" | grep -A1 -E "x16 x|132x1 x" | grep -v "^--"

# 3. the doctor's gdn cells, fp64-checked
for shape in qwen3.5-35b-a3b qwen3.5-397b-a17b; do
    for v in 0 1 3; do
        echo "== doctor gdn $shape, LASTSTAND_GDN_STREAM=$v $(el)"
        LASTSTAND_GDN_STREAM=$v timeout -k 3 25 "$BIN" doctor --device cuda --families gdn --shapes $shape \
            --m 1,8,16,64 --backends cuda_decode --json "$OUT/doctor-$shape-$v.json" \
            >"$OUT/doctor-$shape-$v.txt" 2>"$OUT/doctor-$shape-$v.err"
        echo "rc=$? $(el)"
        grep -E "^ +[0-9]+ " "$OUT/doctor-$shape-$v.txt" | cut -c1-60
        grep -iE "crash|error|wrong|timeout" "$OUT/doctor-$shape-$v.err" | head -3
    done
done

# 4. the engine's decode step at c = 16 (40 layers, CUDA graphs)
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:16,cuda_cublaslt
       --lm-head-backend cuda_cublaslt --trust-backend)
PORT=$((35000 + $$ % 2000))
n=0
for vc in "0:16:32" "default:16:32" "default:1:8"; do
    IFS=: read -r v conc np <<<"$vc"
    lim=$(( $(left) - 3 ))
    [ "$lim" -gt 24 ] || { echo "== e2e STREAM=$v c = $conc: skipped (time)"; continue; }
    [ "$lim" -gt 30 ] && lim=30
    n=$((n + 1))
    echo "== e2e LASTSTAND_GDN_STREAM=$v: serve synth 35B (40 layers), CUDA graphs, c = $conc, $np x 1024 in / 256 out $(el)"
    ( [ "$v" = default ] && unset LASTSTAND_GDN_STREAM || export LASTSTAND_GDN_STREAM=$v
      BIN="$BIN" PORT=$((PORT + n)) CONCURRENCY=$conc NUM_PROMPTS=$np INPUT_LEN=1024 OUTPUT_LEN=256 \
        WARMUP=1 HEALTH_TIMEOUT=$(( lim - 12 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$v-$conc" qwen3.5-35b-a3b -- \
        --device cuda "${PLANS[@]}" >"$OUT/e2e-$v-$conc.out" 2>&1 )
    echo "rc=$? $(el) $(grep -E "startup_s" "$OUT/e2e-$v-$conc/meta.txt" 2>/dev/null)"
    E=$OUT/e2e-$v-$conc
    [ -f "$E/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TTFT p50 | TPOT p50 ms | TPOT p99 ms | ITL p50 ms" &&
        grep -E "^\| $conc \|" "$E/SUMMARY.md" | cut -d'|' -f2,4,6,8,10,11,12 | sed 's/^/  /'
    grep -E "decode steps of|checked against|ERROR|error" "$E/server.log" 2>/dev/null | cut -c1-200 | tail -3
    [ -f "$E/SUMMARY.md" ] || tail -5 "$E.out"
done

# 5. fixtures: greedy tokens, the streamed form everywhere == gd_kernel, graphs == eager
FIX=$D/fixtures/models
if [ "$(left)" -gt 15 ]; then
    echo "== fixtures: 12 greedy tokens, STREAM=1 and 3 == STREAM=0, graphs == eager $(el)"
    timeout $(( $(left) - 2 )) python3 - "$BIN" "$FIX" <<'PY'
import json, os, subprocess, sys
BIN, FIX = sys.argv[1], sys.argv[2]
def run(args, v, t=10):
    try:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=t,
                              env=dict(os.environ, LASTSTAND_GDN_STREAM=v))
    except subprocess.TimeoutExpired:
        return None
for name in ("qwen3_5_moe_text", "qwen3_next"):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        print(f"{name}: no fixture at {d}"); continue
    ids = ",".join(map(str, json.load(open(os.path.join(d, "ref.json")))["input_ids"][:16]))
    common = ["--model-path", d, "--ids", ids, "--device", "cuda", "--gdn-backend", "cuda_decode", "--max-new-tokens", "12"]
    def greedy(v, eager):
        p = run(["generate", *common, *(["--disable-cuda-graph"] if eager else [])], v)
        return json.loads(p.stdout)["ids"] if p is not None and p.returncode == 0 else "ERR " + ("TIMEOUT" if p is None else p.stderr[-200:])
    g0, g1, e1, g3 = greedy("0", False), greedy("1", False), greedy("1", True), greedy("3", False)
    print(f"  {name:18s} STREAM=1 == 0: {'yes' if g0 == g1 else 'NO'}; 3 == 0: {'yes' if g0 == g3 else 'NO'}; "
          f"graphs == eager (1): {'yes' if g1 == e1 else 'NO'}; {str(g1)[:60]}")
PY
    echo "rc=$? $(el)"
fi

# 6. compute-sanitizer on the streamed form (the bitwise test of gd_kernel_s, filtered)
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ] && [ -x "$TEST" ]; then
    for tool in memcheck racecheck synccheck; do
        lim=$(( $(left) - 2 ))
        [ "$lim" -gt 8 ] || { echo "== compute-sanitizer $tool: skipped (time)"; continue; }
        echo "== compute-sanitizer $tool: test_streamed_equals_the_group_kernel $(el)"
        LS_TEST_FILTER=test_streamed_equals_the_group_kernel timeout -k 2 "$lim" "$SAN" --tool $tool --print-limit 5 \
            "$TEST" >"$OUT/san-$tool.out" 2>&1
        echo "rc=$? $(el)"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|out of bounds|hazard|rror|PASSED|FAILED" "$OUT/san-$tool.out" | head -6
    done
fi
echo "total $(( $(date +%s) - T0 )) s"
