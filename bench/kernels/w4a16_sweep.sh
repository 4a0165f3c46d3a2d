#!/bin/sh
# w4a16_sweep.sh LASTSTAND OUTDIR: cuda_w4a16_mma at M = 1 and 8 on the acceptance and
# 397B-expert shapes: the persistent pipelined kernel against the register-staged one-tile-per-block
# kernel at its automatic and best recorded split (LASTSTAND_W4A16_PERSIST=0, _KW, _U), the cp.async
# kernel (the M = 1 default since 2026-11-29) kept out with LASTSTAND_W4A16_ASYNC=0 (kern_session.sh
# sweeps that one);
# one line per (setting, shape): time and GB/s (doctor timings: CUDA events, rotating buffers).
LS=${1:-./laststand}; OUT=${2:-.}
for cfg in "1 0 4" "0 0 4" "0 8 4" "0 4 8"; do
  set -- $cfg
  LASTSTAND_W4A16_ASYNC=0 LASTSTAND_W4A16_PERSIST=$1 LASTSTAND_W4A16_KW=$2 LASTSTAND_W4A16_U=$3 $LS doctor --device cuda \
    --shapes qwen3.5-397b-a17b --families fp4_gemm --backends cuda_w4a16_mma \
    --fp4-shapes 4096x4096,16384x4096,1024x4096,4096x1024,4096x8192 --m 1,8 --json $OUT/sweep.json >/dev/null 2>&1
  python3 - "$OUT/sweep.json" "persist=$1 KW=$2 U=$3" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for t in r["tables"]:
    c = t["cells"]["cuda_w4a16_mma"]
    print("%-22s %-16s" % (sys.argv[2], t["title"].split("  ")[1]),
          " ".join("M=%s %s %.1fus %.0fGB/s" % (m, v["status"], v.get("ms", 0) * 1e3, v.get("gbs", 0)) for m, v in c.items()))
PY
done
