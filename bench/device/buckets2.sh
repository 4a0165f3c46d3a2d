#!/bin/bash
# bench/device/buckets2.sh BIN OUTDIR: serve on auto with the doctor's default buckets (since S28
# 1,2,4,8,16,64,512,2048) against the old ones (1,8,16,64,512,2048) on the full synth 35B, end to end
# at concurrency 2 and 4 (bench/device/e2e35.sh; 1024 in / 256 out), and the MoE plan each picked.
# device-limit: 330
set -u
D=$(dirname "$0")
CONC=2,4 NP=10,16 bash "$D/e2e35.sh" "$1" "$2/new" 2>&1 | grep -vE "^\[.*INFO\]"
grep -E "moe +cuda|per-bucket plan|doctor decision" "$2/new/e2e/server.log" | cut -c1-240 | head -8
CONC=2,4 NP=10,16 E2E_EXTRA="--doctor-buckets 1,8,16,64,512,2048" bash "$D/e2e35.sh" "$1" "$2/old" 2>&1 |
    grep -vE "^\[.*INFO\]"
grep -E "moe +cuda|per-bucket plan|doctor decision" "$2/old/e2e/server.log" | cut -c1-240 | head -8
