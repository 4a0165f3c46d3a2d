#!/usr/bin/env bash
# bench/device/kern2.sh BIN OUTDIR: the fp4_gemm M = 1 GEMV kernel (fp4_gemv1_kernel,
# cuda_w4a16_mma at M = 1) re-measured from main, in under 100 s:
#  1. the doctor on the acceptance weights [4096 x 4096], [16384 x 4096] and the 397B
#     expert shapes at M = 1, 2, 8 (every backend validated against the fp64 CPU oracle /
#     cuda_ref, then timed; issue 5's bar: M = 1 >= 50% of the copy bandwidth);
#  2. the doctor on the 35B preset's NVFP4 shapes at M = 1, 2 (K = 2048 and 512: the
#     4- and 8-warp instances of the kernel);
#  3. cuda_w4a16_mma at M = 1 (validated and timed by the doctor each time) with the GEMV
#     kernel off (LASTSTAND_W4A16_GEMV=0: the cp.async kernel it replaced), its persistent
#     form (LASTSTAND_W4A16_GPERSIST=1), other warp widths (LASTSTAND_W4A16_GKW) and the
#     opt-in bit-placement decode kernel (LASTSTAND_W4A16_GDEC=2, fp4_gemv2_kernel: not yet
#     validated on a GPU; a ✅ here is its validation);
#  4. with ncu: time, issue rate and top stalls of GDEC=1 (default) and GDEC=2 at [16384 x 4096].
# Prints the doctor tables' fp4_gemm rows and one line per variant.
set -u
BIN=${1:?usage: kern2.sh BIN OUTDIR}
OUT=${2:?usage: kern2.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SH=4096x4096,16384x4096,1024x4096,4096x1024
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -1
echo "tree: $(git log -1 --format='%h %s' 2>/dev/null || echo 'no git here')"
t0=$(date +%s)
timeout 50 "$BIN" doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm --fp4-shapes $SH \
  --m 1,2,8 --json "$OUT/kern2_doctor.json" > "$OUT/kern2_doctor.txt" 2>&1
echo "doctor 397B: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
timeout 25 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families fp4_gemm --m 1,2 \
  > "$OUT/kern2_doctor35.txt" 2>&1
echo "doctor 35B: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
grep -E '^(fp4_gemm|measured|laststand doctor| +[0-9]+ |    cuda)' "$OUT/kern2_doctor.txt" "$OUT/kern2_doctor35.txt" | \
  sed 's/^[^:]*://' | cut -c1-200
for cfg in GEMV=0 GPERSIST=1 GKW=16 GKW=8 GKW=4 GDEC=2 GDEC=2:GKW=16 GDEC=2:GKW=8; do
  env $(echo "$cfg" | tr ':' ' ' | sed 's/\([A-Z]*=\)/LASTSTAND_W4A16_\1/g') timeout 15 "$BIN" doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm \
    --backends cuda_w4a16_mma --fp4-shapes $SH --m 1 --json "$OUT/kern2_v.json" > /dev/null 2>&1
  python3 - "$OUT/kern2_v.json" "$cfg" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as ex:
    print("%-20s no report: %s" % (sys.argv[2], ex)); sys.exit(0)
for t in r["tables"]:
    c = t["cells"].get("cuda_w4a16_mma", {})
    print("%-20s %-16s" % (sys.argv[2], t["title"].split("  ")[1]),
          " ".join("M=%s %s %.2fus %.0fGB/s" % (m, v["status"], v.get("ms", 0) * 1e3, v.get("gbs", 0)) for m, v in c.items()))
PY
  rm -f "$OUT/kern2_v.json"
done
echo "variants: $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
# Nsight Compute on the default M = 1 kernel and the bit-placement one at [16384 x 4096]:
# time, issue rate and the leading stall reasons (cycles per issued instruction)
if command -v ncu >/dev/null 2>&1; then
  for v in GDEC=1 GDEC=2; do
    env LASTSTAND_W4A16_$v timeout 25 ncu --clock-control none --target-processes all -k regex:fp4_gemv -c 1 \
      --section SpeedOfLight --section SchedulerStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum \
      "$BIN" doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm --backends cuda_w4a16_mma \
      --fp4-shapes 16384x4096 --m 1 --trial-timeout 20 > "$OUT/kern2_ncu_$v.txt" 2>&1
    echo "ncu $v [16384 x 4096]: $(grep -E '^  [a-z_].*\(' "$OUT/kern2_ncu_$v.txt" | head -1 | cut -c3-40)" \
      "$(grep -E ' Duration|DRAM Throughput|Issued Warp|inst_executed' "$OUT/kern2_ncu_$v.txt" | awk '{print $1, $2, $NF}' | tr '\n' ' ')"
    grep -E 'issue_stalled' "$OUT/kern2_ncu_$v.txt" | awk '{print $1, $NF}' | \
      sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | sort -k2 -rn | head -6 | tr '\n' ';'; echo
  done
  echo "ncu: $(( $(date +%s) - t0 )) s"
fi
