#!/usr/bin/env bash
# device-limit: 150
# bench/device/c16.sh: the decode step at batch 16 (concurrency 16) of synth Qwen3.5-35B-A3B on
# one GPU, for the integrator's device rounds (notes DEVICE_ROUNDS.md, task c16).
#
#   bash bench/device/c16.sh BIN OUTDIR
#
# 1. The doctor's fp64 verdicts and chained per-op times at the synth 35B's shapes (one layer of
#    each kind, BF16 shared expert), M = 1, 8, 16, every family, the served backends; the MoE
#    again with LASTSTAND_MG_DNEARLY=1; the cmocka tests test_gdn_decode_cuda (a 16-sequence
#    decode step by gd_kernel1 equals gd_kernel's bits) and test_gemv_cuda (M = 9, 16).
# 2. ncu (--clock-control none --cache-control none: the card's clocks, caches as the step leaves
#    them) over `serve` of the 8-layer synth 35B (6 GDN + 2 attention layers, the full model's
#    mix), eager (--disable-cuda-graph: one launch per kernel), the served plans named, under
#    `bench` at concurrency 16 (16 prompts of 1024 tokens, 6 tokens out; prefill budget 16384
#    tokens a step: few prefill forwards to profile): c16_table.py picks
#    the last pure-decode forward of 16 rows and prints kernel, µs, DRAM MB, GB/s by layer kind.
# 3. The real step: `serve` of the full 40-layer model with CUDA graphs and the served plans
#    named (--trust-backend), `bench` at concurrency 16, 1024 in / 256 out, 32 prompts (as
#    e2e35.sh): TPOT and the engine's own mean decode step (logged at shutdown: "N decode steps
#    of R sequences on average, X ms each"); then the variants in E2E (gemv16: cuda_gemv serves
#    M <= 16, its grouped launch of the in-projections included; gdnt2: gd_kernel1, at most 128
#    registers, twice the warps an SM of gd_kernel's 255, where gd_kernel needs more than one
#    wave) while time is left.
# 4. (time left) ncu detail (occupancy, issue, stalls) of the MoE mid-batch kernels at M = 16.
# Each step is bounded by `timeout`; the whole script stays under 150 s.
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
left() { echo $(( 145 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1
git log --oneline -1 2>/dev/null | cut -c1-100
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}; nsys: ${NSYS:-none}"
# the plans serve picks on auto (S7-R3's "last backend standing"), named so no doctor runs
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend "${C16_GEMM:-cuda_gemv:8,cuda_cublaslt}"
       --lm-head-backend cuda_cublaslt --trust-backend)
# C16_ENV: extra switches for steps 2 and 3 (e.g. LASTSTAND_X=1)
ENVS=(${C16_ENV:-})

# 1. doctor
echo "== doctor: synth 35B shapes (layers=1), M = 1, 8, 16, served backends $(el)"
timeout -k 3 40 "$BIN" doctor --device cuda --model-path "synth:qwen3.5-35b-a3b,layers=1" --m 1,8,16 \
    --families fp4_gemm,gemm,moe,attention,gdn --backends cuda_w4a16_mma,cuda_gemv,cuda_cublaslt,cuda_fused_decode,cuda_grouped_gemm,cuda_flash_prefill,cuda_decode \
    --json "$OUT/doctor.json" >"$OUT/doctor.txt" 2>"$OUT/doctor.err"
echo "rc=$? $(el)"
grep -E "^(fp4_gemm|gemm|moe|attention|gdn|lm_head) |^ +(1|8|16) |measured device copy" "$OUT/doctor.txt" | cut -c1-150
grep -iE "crash|error|wrong|timeout" "$OUT/doctor.err" | head -5

# 1b. this session's opt-in switches where the doctor sees them: the MoE call at M = 8, 16, 32
# with LASTSTAND_MG_DNEARLY=1 (down's weights before its wait), then also LASTSTAND_MG_MIDGU=2
# (the persistent gate/up, mvq_kernel), then also LASTSTAND_MG_MIDDN=3 (the persistent down,
# mvdq_kernel), against the defaults (fp64 verdicts, chained µs, the rel
# errors: equal rel = very likely equal bits)
echo "== doctor moe (cuda_grouped_gemm) M = 8, 16, 32: defaults, LASTSTAND_MG_DNEARLY=1, + MIDGU=2, + MIDDN=3 $(el)"
for v in "base:" "dnearly:LASTSTAND_MG_DNEARLY=1" "persistgu:LASTSTAND_MG_DNEARLY=1 LASTSTAND_MG_MIDGU=2" "persist:LASTSTAND_MG_DNEARLY=1 LASTSTAND_MG_MIDGU=2 LASTSTAND_MG_MIDDN=3"; do
    env ${v#*:} timeout -k 3 20 "$BIN" doctor --device cuda --model-path "synth:qwen3.5-35b-a3b,layers=1" --m 8,16,32 \
        --families moe --backends cuda_grouped_gemm --trial-timeout 15 --json "$OUT/doctor-moe-${v%%:*}.json" \
        >"$OUT/doctor-moe-${v%%:*}.txt" 2>"$OUT/doctor-moe-${v%%:*}.err"
    echo "${v%%:*} rc=$? $(el)"
    grep -E "^ +(8|16|32) " "$OUT/doctor-moe-${v%%:*}.txt" | cut -c1-100
    python3 -c "import json,sys;t=[t for t in json.load(open(sys.argv[1]))['tables'] if t['family']=='moe'][0];print('  rel_err:',{m:c.get('rel_err') for m,c in t['cells']['cuda_grouped_gemm'].items()})" "$OUT/doctor-moe-${v%%:*}.json" 2>&1 | cut -c1-200
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor-moe-${v%%:*}.err" | head -3
done
# 1c. the GPU tests of what this session touches (beside BIN: tests/)
for t in test_gdn_decode_cuda test_gemv_cuda; do
    echo "== cmocka $t $(el)"
    if [ -x "$D/tests/$t" ]; then
        timeout -k 3 40 "$D/tests/$t" >"$OUT/$t.log" 2>&1
        echo "rc=$? (0: every test passed) $(el)"
        grep -E "PASSED|FAILED|SKIPPED|differs|rror|M=16" "$OUT/$t.log" | head -8
    else
        echo "missing: $D/tests/$t"
    fi
done

# 2. ncu over serve (8 layers, eager) under 16 concurrent requests
PORT=$((33000 + $$ % 2000))
URL=http://127.0.0.1:$PORT
if [ -n "$NCU" ] && [ "$(left)" -gt 80 ]; then
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
        timeout -k 3 50 "$BIN" bench --base-url "$URL" --backend openai --num-prompts 16 --random-input-len 1024 \
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

# 3. the real step: 40 layers, CUDA graphs, c = 16; variants "tag|gemm plan|env" (time allowing)
GEMM0="cuda_gemv:8,cuda_cublaslt"
E2E=("base|$GEMM0|" "gemv16|cuda_gemv:16,cuda_cublaslt|" "gdnt2|$GEMM0|LASTSTAND_GDN_T1=2")
n=0
for v in "${E2E[@]}"; do
    IFS='|' read -r tag gemm venv <<<"$v"
    lim=$(( $(left) - 3 ))
    [ "$lim" -gt 24 ] || { echo "== e2e $tag: skipped (time)"; continue; }
    [ $n -gt 0 ] && [ "$lim" -gt 45 ] && lim=45
    n=$((n + 1))
    P2=("${PLANS[@]}")
    for i in "${!P2[@]}"; do [ "${P2[$i]}" = "${C16_GEMM:-$GEMM0}" ] && P2[$i]=$gemm; done
    np=32; [ $n -gt 1 ] && np=16 # the variants: one wave (compare the engine's decode step and ITL)
    echo "== e2e $tag: serve synth 35B (40 layers), CUDA graphs, gemm $gemm, c = 16, $np x 1024 in / 256 out${C16_ENV:+ $C16_ENV}${venv:+ $venv} $(el)"
    env "${ENVS[@]}" $venv BIN="$BIN" PORT=$((PORT + n)) CONCURRENCY=16 NUM_PROMPTS=$np INPUT_LEN=1024 OUTPUT_LEN=256 \
        WARMUP=1 HEALTH_TIMEOUT=$(( lim - 12 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$tag" qwen3.5-35b-a3b -- \
        --device cuda "${P2[@]}" >"$OUT/e2e-$tag.out" 2>&1
    echo "rc=$? $(el) $(grep -E "startup_s" "$OUT/e2e-$tag/meta.txt" 2>/dev/null)"
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TTFT p50 | TPOT p50 ms | TPOT p99 ms | ITL p50 ms" &&
        grep -E "^\| 16 \|" "$OUT/e2e-$tag/SUMMARY.md" | cut -d'|' -f2,4,6,8,10,11,12 | sed 's/^/  /'
    grep -E "decode steps|CUDA graphs|ERROR|error" "$OUT/e2e-$tag/server.log" 2>/dev/null | cut -c1-200 | tail -4
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] || tail -5 "$OUT/e2e-$tag.out"
done
# 4. (time left) ncu detail of the MoE mid-batch GEMVs at M = 16 (one call each: gate/up mv_kernel, down
# mvd_kernel, the router, top-k, plan, combine) under the doctor's trial: occupancy, issue, stalls
if [ -n "$NCU" ] && [ "$(left)" -gt 22 ]; then
    echo "== ncu detail: doctor moe M = 16 (cuda_grouped_gemm), first call's kernels $(el)"
    timeout -k 3 $(( $(left) - 2 )) "$NCU" --target-processes all --clock-control none --launch-count 8 \
        -k regex:"mv_kernel|mvd_kernel|mvb_kernel|mr_kernel|mg_topk|mg_plan|mg_combine" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis \
        "$BIN" doctor --device cuda --model-path "synth:qwen3.5-35b-a3b,layers=1" --m 16 --families moe \
        --backends cuda_grouped_gemm >"$OUT/ncu-moe.txt" 2>&1
    echo "rc=$? $(el)"
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit (Reg|Shared|Warps)|Issued Warp Per|No Eligible|Warp Cycles Per Issued|Waves Per SM|Grid Size|Stall|stall" \
        "$OUT/ncu-moe.txt" | grep -v "^==" | sed 's/  */ /g' | cut -c1-150 | head -120
fi

echo "total $(( $(date +%s) - T0 )) s"
