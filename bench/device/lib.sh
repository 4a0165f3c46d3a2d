# bench/device/lib.sh: the preamble every device script shares (source it, then call dev_init).
#   . "$(dirname "$0")/lib.sh"; dev_init NAME BUDGET_S "$@"
# Sets BIN (absolute), OUT (created, absolute), D (BIN's folder: the .so files and tests/ beside
# it, put on LD_LIBRARY_PATH), T0, NCU (the ncu binary, empty when there is none); defines el
# (elapsed "(N s)") and left (seconds left of BUDGET_S); prints the GPU line and the commit. With
# DEV_CACHE=1 in the environment, the doctor's and smoke test's verdicts are cached under OUT
# (XDG_CACHE_HOME), reused by later starts.
# Also, for the scripts: ids N (N synthetic token ids, comma-separated: generate's --ids; below 151000, inside
# every preset's vocabulary, the smallest being Qwen3's 151936), and the
# plan flags most of them pass to generate / serve, DEV_PLANS_PREFILL (prefill8k.sh's: 16-row
# fused decode and GEMV, cuda_chunked GDN, cuBLASLt LM head) and DEV_PLANS_DECODE (8-row fused
# decode and GEMV, no chunked GDN); a script copies one: PLANS=("${DEV_PLANS_PREFILL[@]}").
DEV_PLANS_PREFILL=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
                   --attention-backend cuda_flash_prefill --gdn-backend cuda_decode:16,cuda_chunked
                   --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
DEV_PLANS_DECODE=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
                  --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt)
# DEV_PLANS_AUTO: the plans serve picks on auto on the H200 (the decode-step scripts' default).
DEV_PLANS_AUTO=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
                --attention-backend cuda_flash_prefill --gdn-backend cuda_decode
                --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
# dev_step NAME B DTYPE [VAR=VALUE ...]: the full synth Qwen3.5-35B-A3B's decode step, `generate --batch B`
# (512-token prompts + 65 tokens, CUDA graphs, DEV_PLANS_AUTO, --mamba-ssm-dtype DTYPE) with the pairs in
# its environment; ids to OUT/NAME.out, the log to OUT/NAME.err; prints the engine's step line. Skipped
# with under 25 s left.
dev_step() {
    local n=$1 b=$2 d=$3
    shift 3
    [ "$(left)" -lt 25 ] && { echo "$n: out of time"; return; }
    env "$@" timeout -k 3 90 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids 512)" --max-new-tokens 65 \
        --ignore-eos --batch "$b" --device cuda "${DEV_PLANS_AUTO[@]}" --mamba-ssm-dtype "$d" >"$OUT/$n.out" 2>"$OUT/$n.err"
    echo "$n B=$b $d $* rc=$? $(grep -oE "decode steps of .*" "$OUT/$n.err" | cut -c1-90) $(el)"
}
# dev_lstep NAME B CTX [VAR=VALUE ...]: dev_step at a CTX-token prompt + 33 tokens (BF16 GDN state), the
# long-context form of fplong.sh / bpsdef.sh; skipped with under 30 s left.
dev_lstep() {
    local n=$1 b=$2 c=$3
    shift 3
    [ "$(left)" -lt 30 ] && { echo "$n: out of time"; return; }
    env "$@" timeout -k 3 100 "$BIN" generate --model-path synth:qwen3.5-35b-a3b --ids "$(ids "$c")" --max-new-tokens 33 \
        --ignore-eos --batch "$b" --device cuda "${DEV_PLANS_AUTO[@]}" --mamba-ssm-dtype bfloat16 >"$OUT/$n.out" 2>"$OUT/$n.err"
    echo "$n B=$b ctx=$c $* rc=$? $(grep -oE "decode steps of .*" "$OUT/$n.err" | cut -c1-90) $(el)"
}
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%150000) for i in range(n)))" "$1"; }
dev_init() {
    local name=$1 budget=$2
    shift 2
    set -u
    BIN=${1:?usage: $name.sh BIN OUTDIR}
    OUT=${2:?usage: $name.sh BIN OUTDIR}
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
    D=$(dirname "$BIN")
    export LD_LIBRARY_PATH="$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    [ "${DEV_CACHE:-0}" = 1 ] && export XDG_CACHE_HOME="$OUT/cache"
    T0=$(date +%s)
    DEV_BUDGET=$budget
    NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -1
    git log --oneline -1 2>/dev/null | cut -c1-100
}
el() { echo "($(( $(date +%s) - T0 )) s)"; }
left() { echo $(( DEV_BUDGET - ($(date +%s) - T0) )); }
# dev_ncu_test OUTFILE LIMIT_S KERNEL_REGEX TEST_FILTER TEST [VAR=VALUE ...]: ncu (--clock-control
# none; caches flushed before each launch, its default) over the cmocka binary TEST, only its tests
# matching TEST_FILTER (LS_TEST_FILTER) and the launches of kernels matching KERNEL_REGEX, with the
# sections bench/device/c16_ncu_gd.py reads, the VAR=VALUE pairs in its environment; the report to
# OUTFILE; prints ncu's exit status and errors.
dev_ncu_test() {
    local out=$1 lim=$2 re=$3 filt=$4 test=$5 ncu=${NCU:-}
    shift 5
    if [ -z "$ncu" ] || [ ! -x "$test" ]; then
        echo "ncu (${ncu:-none}) or $test missing"
        return 1
    fi
    env LS_TEST_FILTER="$filt" "$@" timeout -k 2 "$lim" "$ncu" --clock-control none -k regex:"$re" \
        --section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats \
        --section WarpStateStats "$test" >"$out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|==WARNING.*(not|fail)" "$out" | head -3
}
