#!/bin/bash
# bench/int/round.sh, copied to .dev/int/round.sh by prep_round.sh; run there as .dev/int/round.sh NAME[:SCRIPT,SCRIPT] ... (on the GPU machine, from the repo root; OUT set):
# unpack .dev/int/NAME.tar.xz into /tmp/r/NAME, stage the fixtures beside its binary when
# .dev/int/fixtures.tar travelled, run bench/device/run_all.sh there for SCRIPTs (default NAME),
# and copy each script's log to $OUT/NAME.SCRIPT.log. DEADLINE (s) bounds the whole round;
# LIMIT_<script> overrides a script's limit (run_all.sh).
set -u
R=$(pwd)
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,clocks.sm --format=csv,noheader
T0=$SECONDS
for spec in "$@"; do
    name=${spec%%:*}; scripts=${spec#*:}; [ "$scripts" = "$spec" ] && scripts=$name
    d=/tmp/r/$name; rm -rf "$d"; mkdir -p "$d"
    tar -xJf "$R/.dev/int/$name.tar.xz" -C "$d" || { echo "round: $name: unpack failed"; continue; }
    [ -f "$R/.dev/int/fixtures.tar" ] && mkdir -p "$d/build/fixtures" && tar -xf "$R/.dev/int/fixtures.tar" -C "$d/build/fixtures"
    left=$(( ${DEADLINE:-580} - (SECONDS - T0) ))
    [ $left -lt 25 ] && { echo "round: $name skipped (deadline)"; continue; }
    echo "=== $name ($scripts) $(date +%T) left $left s"
    (cd "$d" && DEADLINE=$left bash bench/device/run_all.sh build/laststand /tmp/ro/$name ${scripts//,/ })
    for s in ${scripts//,/ }; do cp "/tmp/ro/$name/$s.log" "$OUT/$name.$s.log" 2>/dev/null; done
done
echo "round: done in $((SECONDS - T0)) s"
