#!/usr/bin/env bash
# device-limit: 200
# bench/device/c16.sh: the decode step at batch 16 (concurrency 16) of synth Qwen3.5-35B-A3B on
# one GPU, for the integrator's device rounds (notes DEVICE_ROUNDS.md, task c16).
#
#   bash bench/device/c16.sh BIN OUTDIR
#
# R1 (08:00Z) profiled the step, R2 (08:45Z) timed the candidates: bench/RESULTS.md "Decode at
# batch 16 (S8)". This is R3's (main as frozen at 09:15, the session's defaults):
# 1. The doctor at the synth 35B's shapes, M = 1, 8, 16 (every family but lm_head): ✅; the MoE
#    call at M = 8, 16, 32 with the defaults (gate/up at 4 blocks an SM, down's early weights)
#    and with both off (LASTSTAND_MG_MIDGU=1 LASTSTAND_MG_DNEARLY=0); the cmocka tests
#    test_gdn_decode_cuda (a 16-sequence decode step: 8-warp blocks, == 2-warp blocks' bits,
#    == gd_kernel's) and test_gemv_cuda; pytest tests/test_gpu_moe_grouped.py -k variants.
# 1d. gd_kernel on a 16-sequence decode step under ncu (test_gdn_decode_cuda): the defaults
#    (8-warp blocks) against LASTSTAND_GDN_NW=1 (the 2-warp blocks before).
# 2. The real step: `serve` of the full 40-layer synth 35B with CUDA graphs and the plans auto
#    picks named, c = 16 (32 x 1024 in / 256 out), the defaults and "old" (this session's kernel
#    switches off: MIDGU=1 DNEARLY=0 NW=1; the gemm plan cuda_gemv:16 kept), then c = 1 (8 prompts).
# 3. (time left) Fixture models (dir-of-BIN/fixtures/models): 12 greedy tokens with CUDA graphs
#    == eager, defaults == old switches.
# Each step is bounded by `timeout`; the whole script stays under 200 s.
. "$(dirname "$0")/lib.sh"
dev_init c16 192 "$@"
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}; nsys: ${NSYS:-none}"
# the plans serve picks on auto (S7-R3's "last backend standing"; gemm cuda_gemv:16 since S8-R1's
# bucket 16), named so no doctor runs
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend "${C16_GEMM:-cuda_gemv:16,cuda_cublaslt}"
       --lm-head-backend cuda_cublaslt --trust-backend)
PORT=$((33000 + $$ % 2000))

# 1. the doctor, every family but lm_head, defaults
echo "== doctor: synth 35B shapes (layers=1), M = 1, 8, 16, served backends, defaults $(el)"
timeout -k 3 40 "$BIN" doctor --device cuda --model-path "synth:qwen3.5-35b-a3b,layers=1" --m 1,8,16 \
    --families fp4_gemm,gemm,moe,attention,gdn \
    --backends cuda_w4a16_mma,cuda_gemv,cuda_cublaslt,cuda_fused_decode,cuda_grouped_gemm,cuda_flash_prefill,cuda_decode \
    --json "$OUT/doctor.json" >"$OUT/doctor.txt" 2>"$OUT/doctor.err"
echo "rc=$? $(el)"
grep -E "^(fp4_gemm|gemm|moe|attention|gdn) |^ +(16) " "$OUT/doctor.txt" | cut -c1-130
echo "  cells not ✅: $(grep -cE '^ +[0-9]+ .*(❌ wrong|crash|⚠)' "$OUT/doctor.txt")"
grep -iE "crash|error|wrong|timeout" "$OUT/doctor.err" | head -3
# 1b. the MoE call (doctor, chained, fp64-checked) at M = 8, 16, 32: the defaults (gate/up at 4
# blocks an SM, down's early weights) and R1's (LASTSTAND_MG_MIDGU=1 LASTSTAND_MG_DNEARLY=0);
# rel_err equal = the same bits
echo "== doctor moe (cuda_grouped_gemm) M = 8, 16, 32: defaults, old (MIDGU=1 DNEARLY=0) $(el)"
for v in "defaults:" "old:LASTSTAND_MG_MIDGU=1 LASTSTAND_MG_DNEARLY=0"; do
    env ${v#*:} timeout -k 3 20 "$BIN" doctor --device cuda --model-path "synth:qwen3.5-35b-a3b,layers=1" --m 8,16,32 \
        --families moe --backends cuda_grouped_gemm --trial-timeout 15 --json "$OUT/doctor-moe-${v%%:*}.json" \
        >"$OUT/doctor-moe-${v%%:*}.txt" 2>"$OUT/doctor-moe-${v%%:*}.err"
    echo "${v%%:*} rc=$? $(el)"
    grep -E "^ +(8|16|32) " "$OUT/doctor-moe-${v%%:*}.txt" | cut -c1-100
    python3 -c "import json,sys;t=[t for t in json.load(open(sys.argv[1]))['tables'] if t['family']=='moe'][0];print('  rel_err:',{m:c.get('rel_err') for m,c in t['cells']['cuda_grouped_gemm'].items()})" "$OUT/doctor-moe-${v%%:*}.json" 2>&1 | cut -c1-200
done
# 1c. the GPU tests of what this session touches (beside BIN: tests/)
for t in test_gdn_decode_cuda test_gemv_cuda; do
    echo "== cmocka $t $(el)"
    if [ -x "$D/tests/$t" ]; then
        timeout -k 3 40 "$D/tests/$t" >"$OUT/$t.log" 2>&1
        echo "rc=$? (0: every test passed) $(el)"
        grep -E "PASSED|FAILED|SKIPPED|differs|rror" "$OUT/$t.log" | head -6
    else
        echo "missing: $D/tests/$t"
    fi
done

if python3 -c "import pytest" 2>/dev/null; then
    echo "== pytest tests/test_gpu_moe_grouped.py -k variants $(el)"
    BUILD=$D LS_SHARED=$D timeout -k 3 45 python3 -m pytest -q -p no:cacheprovider tests/test_gpu_moe_grouped.py \
        -k variants 2>&1 | tail -3
    echo "$(el)"
fi
# 1d. gd_kernel / gd_kernel1 on a 16-sequence decode step (the 35B and 397B GDN shapes, grid y =
# 16) in test_gdn_decode_cuda's wide-step test, under ncu (one launch each, caches flushed: the
# state comes from DRAM as in a 40-layer step): duration, occupancy, issue, stalls, per config
if [ -n "$NCU" ] && [ -x "$D/tests/test_gdn_decode_cuda" ]; then
    for v in "defaults:LASTSTAND_GDN_T1=0" "nw1:LASTSTAND_GDN_T1=0 LASTSTAND_GDN_NW=1"; do
        [ "$(left)" -gt 110 ] || break
        echo "== ncu gd ${v%%:*} (${v#*:}) $(el)"
        env ${v#*:} timeout -k 2 20 "$NCU" --clock-control none -k regex:"gd_kernel" --launch-count 30 \
            --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
            --section WarpStateStats "$D/tests/test_gdn_decode_cuda" >"$OUT/ncu-gd-${v%%:*}.txt" 2>&1
        echo "rc=$? $(el)"
        python3 bench/device/c16_ncu_gd.py "$OUT/ncu-gd-${v%%:*}.txt" 16
    done
fi

# 2. the real step: 40 layers, CUDA graphs; variants "tag|gemm plan|env|concurrency|prompts"
GEMM0="cuda_gemv:16,cuda_cublaslt"
E2E=("defaults|$GEMM0||16|32" "old|$GEMM0|LASTSTAND_MG_MIDGU=1 LASTSTAND_MG_DNEARLY=0 LASTSTAND_GDN_NW=1|16|32"
     "c1|$GEMM0||1|8")
n=0
for v in "${E2E[@]}"; do
    IFS='|' read -r tag gemm venv conc np <<<"$v"
    lim=$(( $(left) - 3 ))
    [ "$lim" -gt 24 ] || { echo "== e2e $tag: skipped (time)"; continue; }
    [ "$lim" -gt 40 ] && lim=40
    n=$((n + 1))
    P2=("${PLANS[@]}")
    for i in "${!P2[@]}"; do [ "${P2[$i]}" = "${C16_GEMM:-$GEMM0}" ] && P2[$i]=$gemm; done
    echo "== e2e $tag: serve synth 35B (40 layers), CUDA graphs, gemm $gemm, c = $conc, $np x 1024 in / 256 out${venv:+, $venv} $(el)"
    env $venv BIN="$BIN" PORT=$((PORT + n)) CONCURRENCY=$conc NUM_PROMPTS=$np INPUT_LEN=1024 OUTPUT_LEN=256 \
        WARMUP=1 HEALTH_TIMEOUT=$(( lim - 12 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$tag" qwen3.5-35b-a3b -- \
        --device cuda "${P2[@]}" >"$OUT/e2e-$tag.out" 2>&1
    echo "rc=$? $(el) $(grep -E "startup_s" "$OUT/e2e-$tag/meta.txt" 2>/dev/null)"
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TTFT p50 | TPOT p50 ms | TPOT p99 ms | ITL p50 ms" &&
        grep -E "^\| $conc \|" "$OUT/e2e-$tag/SUMMARY.md" | cut -d'|' -f2,4,6,8,10,11,12 | sed 's/^/  /'
    grep -E "decode steps|checked against|ERROR|error" "$OUT/e2e-$tag/server.log" 2>/dev/null | cut -c1-200 | tail -3
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] || tail -5 "$OUT/e2e-$tag.out"
done

# 3. fixtures: greedy tokens with CUDA graphs == eager, defaults == the old switches (time left)
FIX=$D/fixtures/models
if [ "$(left)" -gt 20 ]; then
    echo "== fixtures: 12 greedy tokens, CUDA graphs == eager, defaults == old switches $(el)"
    timeout $(( $(left) - 2 )) python3 - "$BIN" "$FIX" <<'PY'
import json, os, subprocess, sys
BIN, FIX = sys.argv[1], sys.argv[2]
OLD = dict(os.environ, LASTSTAND_MG_MIDGU="1", LASTSTAND_MG_DNEARLY="0", LASTSTAND_GDN_NW="1")
def run(args, env=None, t=10):
    try:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=t, env=env)
    except subprocess.TimeoutExpired:
        return None
for name in ("qwen3_5_moe_text", "qwen3_next", "qwen3_5_moe_text-nvfp4"):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        print(f"{name}: no fixture at {d}"); continue
    ids = ",".join(map(str, json.load(open(os.path.join(d, "ref.json")))["input_ids"][:16]))
    common = ["--model-path", d, "--ids", ids, "--device", "cuda", "--gemm-backend", "cuda_gemv:16,cuda_cublaslt",
              "--moe-runner-backend", "cuda_grouped_gemm", "--max-new-tokens", "12"]
    def greedy(env, eager):
        p = run(["generate", *common, *(["--disable-cuda-graph"] if eager else [])], env)
        return json.loads(p.stdout)["ids"] if p is not None and p.returncode == 0 else "ERR " + ("TIMEOUT" if p is None else p.stderr[-200:])
    g, e, o = greedy(None, False), greedy(None, True), greedy(OLD, False)
    print(f"  {name:24s} graphs == eager: {'yes' if g == e else 'NO'}; defaults == old switches: {'yes' if g == o else 'NO'}; {str(g)[:70]}")
PY
    echo "rc=$? $(el)"
fi
echo "total $(( $(date +%s) - T0 )) s"
