#!/bin/bash
# bench/device/run_all.sh: one batched GPU-machine round over every device check.
#   bash bench/device/run_all.sh BIN OUTDIR [NAME ...]
# Runs each bench/device/NAME.sh (all but this one when no NAME is given) as
# `bash bench/device/NAME.sh BIN OUTDIR/NAME` with a 150 s limit (or the script's `# device-limit: N` line, or $LIMIT_<NAME>), its stdout and
# stderr in OUTDIR/NAME.log, and prints one status line per check.
set -u
BIN=${1:?usage: run_all.sh BIN OUTDIR [NAME ...]}
OUT=${2:?usage: run_all.sh BIN OUTDIR [NAME ...]}
shift 2
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
    for f in bench/device/*.sh; do
        n=$(basename "$f" .sh)
        [ "$n" = run_all ] || names+=("$n")
    done
fi
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
for n in "${names[@]}"; do
    mkdir -p "$OUT/$n"
    t0=$(date +%s.%N)
    lim=$(sed -n 's/^# device-limit: *\([0-9]*\).*/\1/p' "bench/device/$n.sh" | head -1)
    v=LIMIT_$n; [ -n "${!v:-}" ] && lim=${!v}   # LIMIT_<name> overrides
    lim=${lim:-${LIMIT:-150}}
    if [ -n "${DEADLINE:-}" ]; then                # whole-round budget in seconds
        left=$(( DEADLINE - SECONDS ))
        if [ "$left" -lt 20 ]; then echo "device check $n skipped: the round's deadline"; continue; fi
        [ "$lim" -gt "$left" ] && lim=$left
    fi
    timeout -k 5 "${lim:-${LIMIT:-150}}" bash "bench/device/$n.sh" "$BIN" "$OUT/$n" >"$OUT/$n.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    printf 'device check %-10s rc=%-3d %6.1f s\n' "$n" "$rc" "$(awk -v a="$t0" -v b="$t1" 'BEGIN{print b-a}')"
done
