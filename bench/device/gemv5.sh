#!/usr/bin/env bash
# bench/device/gemv5.sh BIN OUTDIR: fp4_gemm at M = 1 on [4096 x 4096], the gemv5 session
# (bench/RESULTS.md, "fp4_gemm at M = 1 [4096 x 4096], gemv5 session"), on the
# DEVICE_ROUNDS.md protocol. R1 measured the candidates (an L2 prefetch of the weight by the
# first blocks, LASTSTAND_W4A16_L2PF / L2PFM, one cp.async wait per warp, GWAIT): all lost
# and were deleted. This version (R2) measures:
#  1. the physical floor in the doctor's harness: bench/kernels/gemv_floor.cu (built here
#     with nvcc; a pure cp.async streaming read of exactly the weight's bytes in the GEMV's
#     grid, chained 8 back to back on rotating sets > L2, with / without PDL, 1 / 2 / 4
#     blocks an SM; then a synthetic decode of D dependent ops per 16 B that needs x, with
#     x read after griddepcontrol.wait (as the GEMV must) or before it, from DRAM or a hot
#     L2, and an L2 prefetch by the first 8 blocks; a no-load chain: launches, waits, writes
#     alone); then the real [4096 x 4096] default (a copy of fp4_gemv1t_kernel<16, 2, 0>'s
#     skeleton around nvfp4.cuh's chunk step) chained, cold / hot L2, with x before the wait
#     and without the decode, to split its 5.9 us;
#  2. tests/unit/test_fp4_gemv_cuda (beside BIN in tests/): PDL chains == synced runs ==
#     graph replays bit for bit, fp64 per op, with the default and each decode knob (the
#     GEMV kernels' prologue / epilogue are shared helpers since this session);
#  3. the doctor (fp64 check of every cell, chain8 timing, PDL), cuda_w4a16_mma: the 397B
#     preset's [4096 x 4096] and [16384 x 4096] (M = 1, 2, 8, the default three times: the
#     spread), the other 397B GEMV weights, [8192 x 2048] (fp4_gemv1_kernel's 8 x 2
#     instance) and the 35B shapes, default and LASTSTAND_W4A16_GDEC=1|2 (every GEMV kernel);
#  4. Nsight Compute of the [4096 x 4096] M = 1 GEMV (isolated, --clock-control none).
# device-limit: 150
set -u
BIN=${1:?usage: gemv5.sh BIN OUTDIR}
OUT=${2:?usage: gemv5.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset LASTSTAND_FP4_PDL LASTSTAND_DOCTOR_TIMING LASTSTAND_W4A16_GDEC LASTSTAND_W4A16_M8
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -1
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }  # seconds left before a mark

echo "== 1. floor: streaming read of the weight's bytes in the GEMV grid, chain8 on rotating sets"
FB="$OUT/gemv_floor"
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
if [ -n "$NVCC" ] && timeout 60 "$NVCC" -O3 -std=c++17 -Isrc -gencode=arch=compute_90a,code=sm_90a -o "$FB" bench/kernels/gemv_floor.cu \
     > "$OUT/floor_build.log" 2>&1; then
  timeout 40 "$FB" > "$OUT/floor.txt" 2>&1; echo "floor rc=$?"
  cat "$OUT/floor.txt"
else
  echo "floor: no nvcc or build failed:"; tail -5 "$OUT/floor_build.log" 2>/dev/null
fi
echo "floor: $(( $(date +%s) - T0 )) s"

echo "== 2. unit test_fp4_gemv_cuda (chained == synced == graph replay, fp64), per knob"
UT="$(dirname "$BIN")/tests/test_fp4_gemv_cuda"
if [ -x "$UT" ]; then
  for v in "default|" "GDEC=2|LASTSTAND_W4A16_GDEC=2" "GDEC=1|LASTSTAND_W4A16_GDEC=1"; do
    lab=${v%%|*}; ev=${v#*|}
    [ "$(left 75)" -lt 0 ] && { echo "unit $lab skipped: time"; continue; }
    env $ev timeout 25 "$UT" > "$OUT/ut_$lab.log" 2>&1
    echo "unit $lab rc=$? $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/ut_$lab.log" | head -2 | tr '\n' ' ')"
    grep -E 'differs|fp64|capture|chain M|Failure|error' "$OUT/ut_$lab.log" | head -6
  done
else
  echo "unit test_fp4_gemv_cuda: not found at $UT"
fi
echo "unit: $(( $(date +%s) - T0 )) s"

echo "== 3. doctor, cuda_w4a16_mma, chain8 + PDL"
SH=4096x4096,16384x4096
summary() { # summary JSON LABEL
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as ex:
    print("%-16s no report: %s" % (sys.argv[2], ex)); sys.exit(0)
bw = r.get("device", {}).get("copy_gbs", 0) or 0
for t in r["tables"]:
    c = t["cells"].get("cuda_w4a16_mma", {})
    if not c: continue
    print("%-16s %-12s copy %4.0f GB/s " % (sys.argv[2], t["title"].split("  ")[1][:12], bw),
          "  ".join("M=%s %s %.2fus %.0f%%" % (m, "ok" if v["status"] in ("ok", "✅") else v["status"],
                    v.get("ms", 0) * 1e3, 100 * v.get("gbs", 0) / bw if bw else 0) for m, v in c.items()))
    for m, v in c.items():
        if v.get("status") not in ("ok", "✅") and v.get("detail"):
            print("   M=%s: %s" % (m, v["detail"]))
PY
}
# LABEL|ENV|WHERE, most important first (each later one is skipped past 125 s; a run takes ~1-3 s);
# WHERE: empty = the two weights above, o = the 397B's other GEMV weights [1024 x 4096], [4096 x 1024]
# and [8192 x 2048] (the 8 x 2 instance: fp4_gemv1_kernel), 35b = the 35B preset's NVFP4 shapes
for v in "default||" "397B-other||o" "35B||35b" "GDEC=2|LASTSTAND_W4A16_GDEC=2|" "GDEC=1|LASTSTAND_W4A16_GDEC=1|" \
         "397B-other GDEC=2|LASTSTAND_W4A16_GDEC=2|o" "397B-other GDEC=1|LASTSTAND_W4A16_GDEC=1|o" \
         "35B GDEC=2|LASTSTAND_W4A16_GDEC=2|35b" "35B GDEC=1|LASTSTAND_W4A16_GDEC=1|35b" \
         "no PDL|LASTSTAND_FP4_PDL=0|" "default again||" "default 3rd||"; do
  lab=${v%%|*}; rest=${v#*|}; ev=${rest%%|*}; where=${rest#*|}
  [ "$(left 125)" -lt 0 ] && { echo "$lab skipped: time"; continue; }
  F="$OUT/gemv5_$(echo "$lab" | tr '=:/+ ' '__.p_')"
  case "$where" in
    o) args="--shapes qwen3.5-397b-a17b --fp4-shapes 1024x4096,4096x1024,8192x2048" ;;
    35b) args="--shapes qwen3.5-35b-a3b" ;;
    *) args="--shapes qwen3.5-397b-a17b --fp4-shapes $SH" ;;
  esac
  env $ev timeout 20 "$BIN" doctor --device cuda --families fp4_gemm --backends cuda_w4a16_mma \
    $args --m 1,2,8 --json "$F.json" > "$F.txt" 2>&1
  rc=$?; [ $rc -ne 0 ] && { echo "$lab: doctor exit $rc"; tail -3 "$F.txt"; }
  summary "$F.json" "$lab"
done
echo "doctor: $(( $(date +%s) - T0 )) s"

echo "== 4. ncu, [4096 x 4096] M = 1 (isolated kernel, --clock-control none)"
if command -v ncu >/dev/null 2>&1 && [ "$(left 130)" -ge 0 ]; then
  timeout 15 ncu --clock-control none --target-processes all -k regex:fp4_gemv -c 1 \
    --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section Occupancy \
    "$BIN" doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm --backends cuda_w4a16_mma \
    --fp4-shapes 4096x4096 --m 1 --trial-timeout 10 > "$OUT/ncu_4096.txt" 2>&1
  grep -E '^  [a-z_].*\(|Duration|DRAM Throughput|SM Frequency|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per Issued|Stall' \
    "$OUT/ncu_4096.txt" | head -30
else
  echo "ncu skipped (missing or time)"
fi
echo "total: $(( $(date +%s) - T0 )) s"
