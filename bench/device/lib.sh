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
