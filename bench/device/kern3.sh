#!/usr/bin/env bash
# bench/device/kern3.sh BIN OUTDIR: the table decode of the fp4_gemm M = 1 GEMV kernel
# (fp4_gemv1t_kernel, nv4_gemv1t_chunk<L> in src/ops/cuda/nvfp4.cuh; opt-in by
# LASTSTAND_W4A16_LUT=L, L = 1, 2 or 4 of the 4 word pairs per chunk decoded through a
# shared-memory table, 12 = L 2 with the codes loaded into registers instead of through
# shared memory) against the byte-permute decode (LUT=0, the default), same binary, in
# under 100 s:
#  1. the doctor, cuda_w4a16_mma only (every cell validated against the fp64 CPU oracle /
#     cuda_ref, then timed) on [4096 x 4096], [16384 x 4096], [1024 x 4096], [4096 x 1024]
#     at M = 1, 2, 8 for LUT = 0, 1, 2, 4, 12 (the table applies at M = 1 only: M = 2, 8 are
#     the same kernel in every run and show the run-to-run noise);
#     Then LASTSTAND_W4A16_LUT8=1 (fp4_w4a16t_kernel: the table at M = 2..8) at M = 2, 8;
#  2. the doctor on the 35B preset's NVFP4 shapes at M = 1 with LUT = 2, 12, 4 (K = 2048
#     and 512: the 16- and 4-warp instances);
#  3. Nsight Compute at [16384 x 4096] M = 1 for LUT = 0, 12, 4, 2: time, DRAM, issue rate,
#     instructions, shared-memory wavefronts, ALU / FMA-heavy / MIO pipe use, top stalls;
#  4. if time is left, LUT = 2, 4 with 16 warps per tile (LASTSTAND_W4A16_GKW=16).
# Each step is skipped (and says so) when the 100 s would be passed.
# Prints one line per (variant, weight): status, time and GB/s per M; a ❌ names the cell.
# device-limit: 100
set -u
BIN=${1:?usage: kern3.sh BIN OUTDIR}
OUT=${2:?usage: kern3.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
SH=4096x4096,16384x4096,1024x4096,4096x1024
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -1
echo "tree: $(git log -1 --format='%h %s' 2>/dev/null || echo 'no git here')"
T0=$(date +%s)
report() { # report JSON LABEL
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as ex:
    print("%-14s no report: %s" % (sys.argv[2], ex)); sys.exit(0)
for t in r["tables"]:
    c = t["cells"].get("cuda_w4a16_mma", {})
    print("%-14s %-16s" % (sys.argv[2], t["title"].split("  ")[1]),
          "  ".join("M=%s %s %.2fus %.0fGB/s" % (m, "ok" if v["status"] in ("ok", "✅") else v["status"],
                                                 v.get("ms", 0) * 1e3, v.get("gbs", 0)) for m, v in c.items()))
    for m, v in c.items():
        if v.get("status") not in ("ok", "✅") and v.get("detail"):
            print("   M=%s: %s" % (m, v["detail"]))
PY
}
run() { # run LABEL MLIST SHAPES-ARGS... (env already set by the caller)
  local lab=$1 ms=$2; shift 2
  local f="$OUT/kern3_$(echo "$lab" | tr '=:' '_-')"
  timeout 20 "$BIN" doctor --device cuda --families fp4_gemm --backends cuda_w4a16_mma --m "$ms" \
    --json "$f.json" "$@" > "$f.txt" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && { echo "$lab: doctor exit $rc"; tail -3 "$f.txt"; }
  report "$f.json" "$lab"
}
left() { echo $(( $1 - ($(date +%s) - T0) )); }  # seconds left before a mark
for L in 0 1 2 4 12; do
  LASTSTAND_W4A16_LUT=$L run "LUT=$L" 1,2,8 --shapes qwen3.5-397b-a17b --fp4-shapes $SH
done
[ "$(left 45)" -lt 0 ] && echo "LUT8=1 skipped: time" || \
  LASTSTAND_W4A16_LUT8=1 run "LUT8=1" 2,8 --shapes qwen3.5-397b-a17b --fp4-shapes $SH
for L in 2 12 4; do
  [ "$(left 55)" -lt 0 ] && { echo "35B:LUT=$L skipped: time"; continue; }
  LASTSTAND_W4A16_LUT=$L run "35B:LUT=$L" 1 --shapes qwen3.5-35b-a3b
done
echo "doctor: $(( $(date +%s) - T0 )) s"
# Nsight Compute on the M = 1 kernel at [16384 x 4096]: the byte-permute decode and the table
if command -v ncu >/dev/null 2>&1; then
  for L in 0 12 4 2; do
    [ "$(left 80)" -lt 0 ] && { echo "ncu LUT=$L skipped: time"; continue; }
    LASTSTAND_W4A16_LUT=$L timeout 16 ncu --clock-control none --target-processes all -k regex:fp4_gemv -c 1 \
      --section SpeedOfLight --section SchedulerStats \
      --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__mio_inst_issued.avg.pct_of_peak_sustained_active \
      "$BIN" doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm --backends cuda_w4a16_mma \
      --fp4-shapes 16384x4096 --m 1 --trial-timeout 12 > "$OUT/kern3_ncu_$L.txt" 2>&1
    echo "ncu LUT=$L [16384 x 4096]: $(grep -E '^  [a-z_].*\(' "$OUT/kern3_ncu_$L.txt" | head -1 | cut -c3-44)" \
      "$(grep -E ' Duration|SM Frequency|Elapsed Cycles|DRAM Throughput|Issued Warp|inst_executed.sum|wavefronts_mem_shared|pipe_alu|pipe_fmaheavy|mio_inst' "$OUT/kern3_ncu_$L.txt" | awk '{print $1, $2, $NF}' | tr '\n' ' ')"
    grep -E 'issue_stalled' "$OUT/kern3_ncu_$L.txt" | awk '{print $1, $NF}' | \
      sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | sort -k2 -rn | head -6 | tr '\n' ';'; echo
  done
  echo "ncu: $(( $(date +%s) - T0 )) s total"
fi
# 16 warps per tile (more warps share the block's table), if time is left
for L in 2 4; do
  [ "$(left 88)" -lt 0 ] && { echo "LUT=$L:GKW=16 skipped: time"; continue; }
  LASTSTAND_W4A16_LUT=$L LASTSTAND_W4A16_GKW=16 run "LUT=$L:GKW=16" 1 --shapes qwen3.5-397b-a17b --fp4-shapes $SH
done
echo "total: $(( $(date +%s) - T0 )) s"
