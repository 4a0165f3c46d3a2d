# bench/device/lib.sh: the preamble every device script shares (source it, then call dev_init).
#   . "$(dirname "$0")/lib.sh"; dev_init NAME BUDGET_S "$@"
# Sets BIN (absolute), OUT (created, absolute), D (BIN's folder: the .so files and tests/ beside
# it, put on LD_LIBRARY_PATH), T0; defines el (elapsed "(N s)") and left (seconds left of
# BUDGET_S); prints the GPU line and the commit. With DEV_CACHE=1 in the environment, the doctor's
# and smoke test's verdicts are cached under OUT (XDG_CACHE_HOME), reused by later starts.
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
    local out=$1 lim=$2 re=$3 filt=$4 test=$5 ncu
    shift 5
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
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
