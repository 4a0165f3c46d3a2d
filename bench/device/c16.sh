#!/usr/bin/env bash
# device-limit: 200
# bench/device/c16.sh: the decode step at batch 16 (concurrency 16) of synth Qwen3.5-35B-A3B on
# one GPU, for the integrator's device rounds (notes DEVICE_ROUNDS.md, task c16).
#
#   bash bench/device/c16.sh BIN OUTDIR
#
# R1 (08:00Z) profiled the step: bench/RESULTS.md "Decode at batch 16 (S8)". This is R2's:
# 1. The doctor's gemm cells at M = 1, 8, 16, 64 (serve's CUDA buckets now carry 16: the plan
#    cuda_gemv:16,cuda_cublaslt?), its MoE call at M = 8, 16, 32 with LASTSTAND_MG_DNEARLY=1 and
#    LASTSTAND_MG_MIDGU=2 (gate/up at 4 blocks an SM), and the cmocka tests test_gdn_decode_cuda (a 16-sequence decode
#    step by gd_kernel1 equals gd_kernel's bits) and test_gemv_cuda (M = 9, 16, grouped at 16).
# 2. The real step: `serve` of the full 40-layer synth 35B with CUDA graphs and the served plans
#    named (--trust-backend; gemm cuda_gemv:16 as serve's doctor now picks), `bench` at
#    concurrency 16, 1024 in / 256 out, 32 prompts (as e2e35.sh): TPOT, ITL and the engine's
#    own mean decode step (logged at shutdown: "N decode steps of R sequences on average, X ms
#    each"), same prompts for every variant: new (the defaults), t1 (LASTSTAND_GDN_T1=2),
#    dnearly (LASTSTAND_MG_DNEARLY=1), c1 (concurrency 1, 8 prompts: c = 1 must not be slower
#    than 2.43 ms). Before them (1d): gd_kernel / gd_kernel1 of a 16-sequence decode step
#    under ncu in test_gdn_decode_cuda, per config (T1 0 / 2, LASTSTAND_GDN_NW=8: clusters of
#    2 blocks of 8 warps instead of 8 of 2, LASTSTAND_GDN_NORM=0).
# 3. (time left) ncu (--clock-control none --cache-control none) over `serve` of the 8-layer
#    synth 35B, eager, LASTSTAND_GDN_T1=2, under `bench` at concurrency 16 (16 x 1024 in / 6
#    out, one prefill step): c16_table.py's kernel list of one 16-row decode step.
# Each step is bounded by `timeout`; the whole script stays under 200 s.
set -u
BIN=${1:?usage: c16.sh BIN OUTDIR}
OUT=${2:?usage: c16.sh BIN OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
D=$(dirname "$BIN")
export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
el() { echo "($(( $(date +%s) - T0 )) s)"; }
left() { echo $(( 192 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1
git log --oneline -1 2>/dev/null | cut -c1-100
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}; nsys: ${NSYS:-none}"
# the plans serve picks on auto (S7-R3's "last backend standing"; gemm cuda_gemv:16 since S8-R1's
# bucket 16), named so no doctor runs
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend "${C16_GEMM:-cuda_gemv:16,cuda_cublaslt}"
       --lm-head-backend cuda_cublaslt --trust-backend)
# C16_ENV: extra switches for the ncu profile (step 3); default: gd_kernel1 (LASTSTAND_GDN_T1=2)
ENVS=(${C16_ENV-LASTSTAND_GDN_T1=2})
PORT=$((33000 + $$ % 2000))
URL=http://127.0.0.1:$PORT

# 1. the plan serve's doctor makes now (buckets 1,8,16,64: cuda_gemv up to 16?), gemm family
echo "== doctor gemm: synth 35B shapes, M = 1, 8, 16, 64 (serve's CUDA buckets up to 64) $(el)"
timeout -k 3 30 "$BIN" doctor --device cuda --model-path "synth:qwen3.5-35b-a3b,layers=1" --m 1,8,16,64 \
    --families gemm --backends cuda_gemv,cuda_cublaslt --json "$OUT/doctor.json" >"$OUT/doctor.txt" 2>"$OUT/doctor.err"
echo "rc=$? $(el)"
grep -E "^gemm |^ +(16) |plan|choice|per-bucket" "$OUT/doctor.txt" | cut -c1-150 | head -24
python3 - "$OUT/doctor.json" <<'PY' 2>&1 | head -3
import json, sys
r = json.load(open(sys.argv[1]))
t = [t for t in r["tables"] if t["family"] == "gemm"]
for m in ("1", "8", "16", "64"):
    s = {b: sum(x["cells"][b][m].get("ms", 0) for x in t if m in x["cells"].get(b, {}) and x["cells"][b][m]["status"] == "ok") for b in ("cuda_gemv", "cuda_cublaslt")}
    print(f"  M={m}: sum over the gemm shapes (ms): " + ", ".join(f"{b} {v:.4f}" for b, v in s.items()))
PY
# 1b. the MoE call (doctor, chained, fp64-checked) at M = 8, 16, 32: defaults, LASTSTAND_MG_DNEARLY=1,
# LASTSTAND_MG_MIDGU=2 (gate/up at 4 blocks an SM, <= 64 registers), both (rel_err equal = same bits)
echo "== doctor moe (cuda_grouped_gemm) M = 8, 16, 32: defaults, DNEARLY=1, MIDGU=2, both $(el)"
for v in "base:" "dnearly:LASTSTAND_MG_DNEARLY=1" "gu4:LASTSTAND_MG_MIDGU=2" "gu4early:LASTSTAND_MG_MIDGU=2 LASTSTAND_MG_DNEARLY=1"; do
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

# 1d. gd_kernel / gd_kernel1 on a 16-sequence decode step (the 35B and 397B GDN shapes, grid y =
# 16) in test_gdn_decode_cuda's wide-step test, under ncu (one launch each, caches flushed: the
# state comes from DRAM as in a 40-layer step): duration, occupancy, issue, stalls, per config
if [ -n "$NCU" ] && [ -x "$D/tests/test_gdn_decode_cuda" ]; then
    for v in "t0:LASTSTAND_GDN_T1=0" "t2:LASTSTAND_GDN_T1=2" "t0nw8:LASTSTAND_GDN_T1=0 LASTSTAND_GDN_NW=8" \
             "t2nw8:LASTSTAND_GDN_T1=2 LASTSTAND_GDN_NW=8" "t2norm0:LASTSTAND_GDN_T1=2 LASTSTAND_GDN_NORM=0"; do
        [ "$(left)" -gt 120 ] || break
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
E2E=("new|$GEMM0||16|32" "t1|$GEMM0|LASTSTAND_GDN_T1=2|16|32" "dnearly|$GEMM0|LASTSTAND_MG_DNEARLY=1|16|32"
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

# 3. ncu over serve (8 layers, eager) under 16 concurrent requests (C16_ENV: gd_kernel1)
if [ -n "$NCU" ] && [ "$(left)" -gt 48 ]; then
    echo "== ncu: serve synth 35B 8 layers, eager, bench c = 16 (16 x 1024 in / 6 out)${C16_ENV:+, env $C16_ENV} $(el)"
    env "${ENVS[@]}" "$NCU" --target-processes all --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu16" \
        "$BIN" serve --model-path "synth:qwen3.5-35b-a3b,layers=8" --host 127.0.0.1 --port $PORT \
        --max-running-requests 16 --chunked-prefill-size 16384 --disable-cuda-graph --device cuda "${PLANS[@]}" \
        >"$OUT/ncu16.log" 2>&1 &
    NPID=$!
    ok=0
    for _ in $(seq 60); do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && { ok=1; break; }
        kill -0 $NPID 2>/dev/null || break
        sleep 1
    done
    echo "healthy: $ok $(el)"
    if [ $ok = 1 ]; then
        timeout -k 3 $(( $(left) - 12 )) "$BIN" bench --base-url "$URL" --backend openai --num-prompts 16 --random-input-len 1024 \
            --random-output-len 6 --random-range-ratio 1.0 --max-concurrency 16 --warmup-requests 0 \
            --extra-request-body '{"logprobs":0}' >"$OUT/ncu16-bench.txt" 2>&1
        echo "bench rc=$? $(el)"
    fi
    # stop the server (ncu's child) so that ncu writes its report
    # (the serve process under ncu: its command line holds this run's port; ncu itself is left alone)
    for p in $(ps -eo pid=,args= | awk -v port="--port $PORT " -v me="$NPID" 'index($0, port) && $1 != me && /laststand serve|\/laststand serve| serve --model-path/ {print $1}'); do
        [ "$p" != "$$" ] && kill -TERM "$p" 2>/dev/null
    done
    for _ in $(seq 40); do kill -0 $NPID 2>/dev/null || break; sleep 0.5; done
    kill -0 $NPID 2>/dev/null && { kill -TERM $NPID; sleep 2; kill -KILL $NPID 2>/dev/null; }
    wait $NPID 2>/dev/null
    grep -E "==ERROR|error" "$OUT/ncu16.log" | head -3
    grep -E "decode steps" "$OUT/ncu16.log" | cut -c1-160
    if [ -f "$OUT/ncu16.ncu-rep" ]; then
        timeout 25 "$NCU" --import "$OUT/ncu16.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu16.csv" 2>"$OUT/ncu16.csv.err"
        timeout 15 python3 bench/device/c16_table.py "$OUT/ncu16.csv" m16 16 || head -c 400 "$OUT/ncu16.csv.err"
    else
        echo "no ncu report"; tail -5 "$OUT/ncu16.log"
    fi
fi

echo "total $(( $(date +%s) - T0 )) s"
