#!/usr/bin/env bash
# bench/device/kern3.sh BIN OUTDIR: the table decode of fp4_gemm's M = 1 GEMV kernel
# (fp4_gemv1t_kernel, nv4_gemv1t_chunk<L> in src/ops/cuda/nvfp4.cuh; since R3 the M = 1
# default with L = 2 of the 4 word pairs per chunk through the shared-memory table, on
# the instances R3 validated) against the byte-permute decode (LASTSTAND_W4A16_LUT=0,
# fp4_gemv1_kernel), same binary, in under 100 s:
#  1. the doctor, cuda_w4a16_mma only (every cell validated against the fp64 CPU oracle /
#     cuda_ref, then timed) on [4096 x 4096], [16384 x 4096], [1024 x 4096], [4096 x 1024]
#     at M = 1, 2, 8: the default, LUT = 0, LUT = 10 (that kernel with no table: its
#     halved x reads alone, to attribute the gain) and LUT = 4 (every word by table);
#     M = 2, 8 are the same kernel in these runs (run-to-run noise); then
#     LASTSTAND_W4A16_LUT8=1 (fp4_w4a16t_kernel, the table at M = 2..8) at M = 2, 4, 8;
#  2. the doctor on the 35B preset's NVFP4 shapes: default and LUT = 0 at M = 1, 2,
#     LUT8=1 at M = 2, 8;
#  3. Nsight Compute at [16384 x 4096]: M = 1 LUT = 0, default, LUT = 10; M = 2 the
#     register kernel and LUT8=1: time, SM clock, DRAM, issue rate, instructions,
#     shared-memory wavefronts, ALU / FMA-heavy / MIO pipe use, top stalls.
# Each ncu step is skipped (and says so) when the 100 s would be passed.
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
run "default" 1,2,8 --shapes qwen3.5-397b-a17b --fp4-shapes $SH        # LUT unset: L = 2 where validated
for L in 0 10 4; do
  LASTSTAND_W4A16_LUT=$L run "LUT=$L" 1,2,8 --shapes qwen3.5-397b-a17b --fp4-shapes $SH
done
LASTSTAND_W4A16_LUT8=1 run "LUT8=1" 2,4,8 --shapes qwen3.5-397b-a17b --fp4-shapes $SH
run "35B:default" 1,2 --shapes qwen3.5-35b-a3b
LASTSTAND_W4A16_LUT=0 run "35B:LUT=0" 1,2 --shapes qwen3.5-35b-a3b
LASTSTAND_W4A16_LUT8=1 run "35B:LUT8=1" 2,8 --shapes qwen3.5-35b-a3b
echo "doctor: $(( $(date +%s) - T0 )) s"
# Nsight Compute at [16384 x 4096]: M = 1 byte permutes (LUT=0), the default (L = 2), no
# table but the halved x reads (LUT=10); M = 2 the register kernel and the table one
NCU_METRICS='regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fmaheavy.avg.pct_of_peak_sustained_active,sm__mio_inst_issued.avg.pct_of_peak_sustained_active'
ncu_one() { # ncu_one LABEL M KERNEL-REGEX ENV... (at least one VAR=VALUE)
  local lab=$1 m=$2 k=$3; shift 3
  [ "$(left 85)" -lt 0 ] && { echo "ncu $lab skipped: time"; return; }
  local f="$OUT/kern3_ncu_$(echo "$lab" | tr '=:' '_-')"
  env "$@" timeout 16 ncu --clock-control none --target-processes all -k "regex:$k" -c 1 \
    --section SpeedOfLight --section SchedulerStats --metrics "$NCU_METRICS" \
    "$BIN" doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm --backends cuda_w4a16_mma \
    --fp4-shapes 16384x4096 --m "$m" --trial-timeout 12 > "$f.txt" 2>&1
  echo "ncu $lab M=$m [16384 x 4096]: $(grep -E '^  [a-z_].*\(' "$f.txt" | head -1 | cut -c3-48)" \
    "$(grep -E ' Duration|SM Frequency|Elapsed Cycles|DRAM Throughput|Issued Warp|inst_executed.sum|wavefronts_mem_shared|pipe_alu|pipe_fmaheavy|mio_inst' "$f.txt" | awk '{print $1, $2, $NF}' | tr '\n' ' ')"
  grep -E 'issue_stalled' "$f.txt" | awk '{print $1, $NF}' | \
    sed 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | sort -k2 -rn | head -6 | tr '\n' ';'; echo
}
if command -v ncu >/dev/null 2>&1; then
  ncu_one "LUT=0" 1 fp4_gemv LASTSTAND_W4A16_LUT=0
  ncu_one "default" 1 fp4_gemv LASTSTAND_KERN3_DEFAULT=1   # (a no-op variable: the default)
  ncu_one "LUT=10" 1 fp4_gemv LASTSTAND_W4A16_LUT=10
  ncu_one "M2:register" 2 fp4_w4a16 LASTSTAND_W4A16_LUT8=0
  ncu_one "M2:LUT8=1" 2 fp4_w4a16 LASTSTAND_W4A16_LUT8=1
  echo "ncu: $(( $(date +%s) - T0 )) s total"
fi
echo "total: $(( $(date +%s) - T0 )) s"
