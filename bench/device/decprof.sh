#!/usr/bin/env bash
# device-limit: 170
# bench/device/decprof.sh: where the time of one decode step goes, synth Qwen3.5-35B-A3B on one
# GPU, for the integrator's device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/decprof.sh BIN OUTDIR
#
# 1. ncu (--clock-control none --cache-control none: the card's own clocks, caches as the step
#    leaves them) over `BIN generate` of synth:qwen3.5-35b-a3b,layers=8, eager (no CUDA graphs,
#    so each kernel is one launch), the serve plans named (no doctor): a 256-token prompt, then
#    3 new tokens = 3 forward passes. Forwards are split at the embedding kernel (sm_embed_*);
#    the last one is a decode step at M = 1 (checked against the one before it). Printed by
#    decprof_table.py: the raw per-kernel table (µs, DRAM MB read + written, GB/s) and an
#    aggregate per kernel name (count, total µs, % of the step's kernel time, GB/s).
# 2. The engine's mean decode step with CUDA graphs (`generate`, 512-token prompt, 128 decode
#    steps; the engine logs "N decode steps ..., X ms each (forward + sampling)"), 8 layers and
#    the full 40. E2E_ENV_<tag>="VAR=V ..." (set below) adds a run with those environment
#    variables: the old behaviour of a knob, for before/after.
# 3. Wall-clock TPOT as a client sees it: `serve` with the same named plans (--trust-backend: no
#    doctor, no smoke children) + `BIN bench` at concurrency 1 and 16, 512 in / 128 out, 8 layers.
# 4. ncu of a 16-token prompt and 1 new token: one forward of M = 16 rows (every GEMM and the MoE
#    as in a batch-16 decode step; attention and GDN as one 16-token sequence; the lm_head on the
#    last row only).
# 5. The doctor's per-op times (chain timing, as in a CUDA graph) of the served backends at the
#    35B shapes, M = 1 and 16, with its fp64 verdicts; then serve + bench on the 40 layers if
#    time is left.
# Each step is bounded by `timeout`; the whole script stays under 170 s.
set -u
BIN=${1:?usage: decprof.sh BIN OUTDIR}
OUT=${2:?usage: decprof.sh BIN OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export LD_LIBRARY_PATH="$(dirname "$BIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
el() { echo "($(( $(date +%s) - T0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -2
git log --oneline -1 2>/dev/null
MODEL8="synth:qwen3.5-35b-a3b,layers=8"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt)
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }

NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() { # tag prompt_len new_tokens timeout
    local tag=$1 np=$2 nt=$3 lim=$4
    echo "== ncu $tag: generate, prompt $np, $nt new tokens, eager $(el)"
    rm -f "$OUT/ncu-$tag.ncu-rep"
    timeout -k 3 "$lim" "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        -o "$OUT/ncu-$tag" "$BIN" generate --model-path "$MODEL8" --ids "$(ids "$np")" --max-new-tokens "$nt" \
        --device cuda --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|==WARNING|error:" "$OUT/ncu-$tag.out" | head -5
    tail -c 300 "$OUT/ncu-$tag.out" | grep -v "^==PROF==" | tail -3
    if [ -f "$OUT/ncu-$tag.ncu-rep" ]; then
        timeout 30 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$tag.csv" 2>"$OUT/ncu-$tag.csv.err"
        timeout 20 python3 bench/device/decprof_table.py "$OUT/ncu-$tag.csv" "$tag" || head -c 400 "$OUT/ncu-$tag.csv.err"
    fi
}
# gen: tag, preset, timeout, env assignments...: the engine's mean decode step with CUDA graphs
gen() {
    local tag=$1 preset=$2 lim=$3
    shift 3
    echo "== gen $tag: generate synth:$preset, 512-token prompt + 129 new tokens, CUDA graphs${*:+, env $*} $(el)"
    env "$@" timeout -k 3 "$lim" "$BIN" generate --model-path "synth:$preset" --ids "$(ids 512)" --max-new-tokens 129 \
        --device cuda "${PLANS[@]}" >"$OUT/gen-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "decode steps of|CUDA graphs|loaded in|rror" "$OUT/gen-$tag.out" | cut -c1-220 | head -5
}
# e2e: tag, preset, timeout, env assignments...: serve + bench, TPOT as a client sees it
e2e() {
    local tag=$1 preset=$2 lim=$3
    shift 3
    echo "== e2e $tag: serve synth:$preset, named plans, CUDA graphs${*:+, env $*} $(el)"
    env "$@" BIN="$BIN" PORT=30777 CONCURRENCY=1,16 NUM_PROMPTS=6,32 INPUT_LEN=512 OUTPUT_LEN=128 WARMUP=2 \
        HEALTH_TIMEOUT=$(( lim - 12 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$tag" "$preset" -- \
        --device cuda "${PLANS[@]}" --trust-backend >"$OUT/e2e-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "startup_s" "$OUT/e2e-$tag/meta.txt" 2>/dev/null
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TPOT p50 ms | TPOT p99 ms | ITL p50 ms" &&
        grep -E "^\| (1|16) \|" "$OUT/e2e-$tag/SUMMARY.md" | cut -d'|' -f2,4,6,10,11,12 | sed 's/^/  /'
    grep -E "CUDA graphs|loaded in|ERROR|error" "$OUT/e2e-$tag/server.log" 2>/dev/null | cut -c1-220 | head -4
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] || tail -5 "$OUT/e2e-$tag.out"
}
left() { echo $(( 165 - ($(date +%s) - T0) )); }

if [ -n "$NCU" ]; then prof m1 256 3 45; else echo "== ncu: not found"; fi
L8="qwen3.5-35b-a3b,layers=8"
gen l8 "$L8" 20
gen l40 qwen3.5-35b-a3b 35
# VARIANTS: the old behaviour of each knob this session added (E2E_ENV_<tag>="VAR=V ..."), same plans
for v in ${!E2E_ENV_*}; do gen "l8-${v#E2E_ENV_}" "$L8" 20 ${!v}; done
[ "$(left)" -gt 40 ] && e2e l8 "$L8" 30
[ -n "$NCU" ] && [ "$(left)" -gt 40 ] && prof m16 16 1 30
if [ "$(left)" -gt 30 ]; then
    echo "== doctor: served backends at the 35B shapes, M = 1, 16 $(el)"
    timeout -k 3 25 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --m 1,16 \
        --backends cuda_w4a16_mma,cuda_gemv,cuda_cublaslt,cuda_fused_decode,cuda_grouped_gemm,cuda_flash_prefill,cuda_decode \
        --json "$OUT/doctor.json" >"$OUT/doctor.txt" 2>"$OUT/doctor.err"
    echo "rc=$? $(el)"
    grep -E "^(fp4_gemm|gemm|moe|attention|gdn) |^ +(1|16) |measured device copy" "$OUT/doctor.txt" | cut -c1-160
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor.err" | head -5
fi
[ "$(left)" -gt 40 ] && e2e l40 qwen3.5-35b-a3b "$(left)"
echo "total $(( $(date +%s) - T0 )) s"
