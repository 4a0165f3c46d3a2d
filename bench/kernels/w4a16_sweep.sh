#!/bin/sh
# w4a16_sweep.sh LASTSTAND OUTDIR: cuda_w4a16_mma at M = 1 and 8 on the acceptance and
# 397B-expert shapes for each split-K width (LASTSTAND_W4A16_KW) and load depth
# (LASTSTAND_W4A16_U); one line per (setting, shape, M): time and GB/s (doctor timings).
LS=${1:-./laststand}; OUT=${2:-.}
for u in 8 4; do for kw in 0 1 2 4 8; do
  LASTSTAND_W4A16_KW=$kw LASTSTAND_W4A16_U=$u $LS doctor --device cuda --shapes qwen3.5-397b-a17b \
    --families fp4_gemm --backends cuda_w4a16_mma --fp4-shapes 4096x4096,16384x4096,1024x4096,4096x1024 \
    --m 1,8 --json $OUT/sweep.json >/dev/null 2>&1
  python3 - "$OUT/sweep.json" "$kw" "$u" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for t in r["tables"]:
    c = t["cells"]["cuda_w4a16_mma"]
    print("KW=%s U=%s %-28s" % (sys.argv[2], sys.argv[3], t["title"].split("  ")[1]),
          " ".join("M=%s %s %.1fus %.0fGB/s" % (m, v["status"], v.get("ms", 0) * 1e3, v.get("gbs", 0)) for m, v in c.items()))
PY
done; done
