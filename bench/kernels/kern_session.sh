#!/bin/sh
# kern_session.sh LASTSTAND OUTDIR: the kernel-tuning session's one-call run on the GPU
# machine (bench/RESULTS.md records its outputs): the doctor on the fp4_gemm acceptance
# shapes and the 397B MoE layer at M = 1, 2, 8, the cuda_w4a16_mma variants (env knobs),
# the torch BF16 peer (fp4_gemm_bench.py), and, with NCU=1, Nsight Compute on the M = 1
# kernels plus a SASS instruction histogram of the M <= 8 kernel.
LS=${1:-./laststand}; OUT=${2:-.}; HERE=$(dirname "$0")
export PYTHONUNBUFFERED=1
SH=4096x4096,16384x4096,1024x4096,4096x1024
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
timeout 60 $LS doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm,moe --fp4-shapes $SH \
  --m 1,2,8 --json $OUT/doctor.json > $OUT/doctor.txt 2> $OUT/doctor.err
echo "doctor: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
if [ "${SWEEP:-1}" = 1 ]; then
  # variants of cuda_w4a16_mma at M <= 8 (env knobs, see fp4_gemm.cu): the cp.async kernel with
  # 16 or 8 warps splitting K, and the register-staged kernel it replaced (ASYNC=0)
  for cfg in ${FP4_CFGS-"ASYNC=1:AKW=16" "ASYNC=1:AKW=8" "ASYNC=0:AKW=0"}; do
    cfg=$(echo $cfg | tr ':' ' ')
    env $(echo $cfg | sed 's/\([A-Z]*=\)/LASTSTAND_W4A16_\1/g') timeout 40 $LS doctor --device cuda \
      --shapes qwen3.5-397b-a17b --families fp4_gemm --backends cuda_w4a16_mma \
      --fp4-shapes $SH --m 1,8 --json $OUT/sweep.json >/dev/null 2>&1
    python3 - "$OUT/sweep.json" "$cfg" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for t in r["tables"]:
    c = t["cells"]["cuda_w4a16_mma"]
    print("%-16s %-16s" % (sys.argv[2], t["title"].split("  ")[1]),
          " ".join("M=%s %s %.2fus %.0fGB/s" % (m, v["status"], v.get("ms", 0) * 1e3, v.get("gbs", 0)) for m, v in c.items()))
PY
  done > $OUT/sweep.txt 2>&1
  # the fused MoE decode's two gate/up + down kernel pairs, each forced at every M
  for pair in 1 2; do
    LASTSTAND_MOE_FUSED_PAIR=$pair timeout 40 $LS doctor --device cuda --shapes qwen3.5-397b-a17b --families moe \
      --backends cuda_fused_decode --m 1,2,8 2>/dev/null | grep -E '^ +[0-9]+ ' | sed "s/^/MOE_PAIR$pair /" >> $OUT/sweep.txt
  done
  timeout 40 $LS doctor --device cuda --shapes qwen3.5-35b-a3b --families moe --m 1,2,8 2>/dev/null | \
    grep -E '^(moe| +[0-9]+ )' | sed 's/^/35B /' >> $OUT/sweep.txt
  echo "sweep: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
fi
timeout 60 python3 $HERE/fp4_gemm_bench.py --laststand $LS --out $OUT --shapes $SH --m 1,2,8 > $OUT/bench.txt 2>&1
echo "bench: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
if [ "${NCU:-0}" != 0 ]; then   # NCU=1: fp4_gemm and moe kernels; NCU=moe: the moe kernels only
  JOBS='fp4_gemm:cuda_w4a16_mma:4096x4096:fp4_w4a16:2 fp4_gemm:cuda_w4a16_mma:16384x4096:fp4_w4a16:2 moe:cuda_fused_decode:4096x4096:moe_:4'
  [ "$NCU" = moe ] && JOBS='moe:cuda_fused_decode:4096x4096:moe_:4'
  for job in $JOBS; do
    job=$(echo $job | tr ':' ' ')
    set -- $job
    timeout 60 ncu --clock-control none --target-processes all -k regex:"$4" -c $5 \
      --section SpeedOfLight --section LaunchStats --section Occupancy --section SchedulerStats --section WarpStateStats \
      $LS doctor --device cuda --shapes qwen3.5-397b-a17b --families $1 --backends $2 \
      --fp4-shapes $3 --m 1 --trial-timeout 50 >> $OUT/ncu.txt 2>&1
  done
  echo "ncu: exit $? in $(( $(date +%s) - t0 )) s"
  cuobjdump -sass -fun '_Z22fp4_w4a16_async_kernelILi16ELi2EEviiiPK13__nv_bfloat16PKhS4_fPS0_i' $LS 2>&1 | \
    grep -oE '^ +/\*[0-9a-f]{4}\*/ +[A-Z0-9_.]+' | awk '{print $2}' | sed 's/\..*//' | sort | uniq -c | sort -rn | head -25 > $OUT/sass.txt
fi
cat $OUT/doctor.err >> $OUT/doctor.txt; rm -f $OUT/doctor.err $OUT/sweep.json
grep -E '^(fp4_gemm|moe|doctor:|GPU|  +[0-9]+ )' $OUT/doctor.txt | cut -c1-150
cat $OUT/sweep.txt | cut -c1-150; tail -16 $OUT/bench.txt | cut -c1-150
[ -f $OUT/ncu.txt ] && grep -E '^  [a-z].*\(|Duration|DRAM Throughput|No Eligible|Registers Per|Achieved Occupancy|Stall|SM Frequency' $OUT/ncu.txt | cut -c1-110 | head -60
[ -f $OUT/sass.txt ] && tr '\n' ' ' < $OUT/sass.txt
