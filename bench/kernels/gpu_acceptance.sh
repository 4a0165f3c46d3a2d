#!/bin/sh
# gpu_acceptance.sh LASTSTAND OUTDIR: everything the GPU machine is asked for in one call
# (bench/RESULTS.md records its outputs):
#   1. the doctor with the three broken fp4_gemm backends on synth:qwen3.5-397b-a17b,layers=4
#   2. the same on synth:qwen3.5-35b-a3b
#   3. bench/kernels/fp4_gemm_bench.py: fp4_gemm backends at M = 1..8192 vs copy bandwidth
#      and vs torch.matmul BF16, measured in the same run
#   4. with SWEEP=1: the cuda_w4a16_mma kernel-variant sweep (tuning record)
LS=${1:-./laststand}; OUT=${2:-.}; HERE=$(dirname "$0")
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
t0=$(date +%s)
LASTSTAND_TEST_BROKEN_BACKENDS=1 timeout 210 $LS doctor --device cuda --model-path synth:qwen3.5-397b-a17b,layers=4 \
  --json $OUT/doctor-397b.json > $OUT/doctor-397b.txt 2> $OUT/doctor-397b.err
echo "doctor 397b: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
LASTSTAND_TEST_BROKEN_BACKENDS=1 timeout 120 $LS doctor --device cuda --model-path synth:qwen3.5-35b-a3b \
  --json $OUT/doctor-35b.json > $OUT/doctor-35b.txt 2> $OUT/doctor-35b.err
echo "doctor 35b: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
timeout 140 python3 $HERE/fp4_gemm_bench.py --laststand $LS --out $OUT > $OUT/bench.txt 2>&1
echo "bench: exit $? in $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
if [ "${SWEEP:-0}" = 1 ]; then
  timeout 80 sh $HERE/w4a16_sweep.sh $LS $OUT > $OUT/sweep.txt 2>&1
  echo "sweep: exit $? in $(( $(date +%s) - t0 )) s"
fi
cat $OUT/doctor-397b.err >> $OUT/doctor-397b.txt; cat $OUT/doctor-35b.err >> $OUT/doctor-35b.txt
rm -f $OUT/doctor-397b.err $OUT/doctor-35b.err $OUT/sweep.json
grep -A6 '^moe' $OUT/doctor-397b.txt | cut -c1-120; grep -A6 '^moe' $OUT/doctor-35b.txt | cut -c1-120
grep '^doctor: [0-9]' $OUT/doctor-397b.txt $OUT/doctor-35b.txt; tail -4 $OUT/bench.txt
[ -f $OUT/sweep.txt ] && cut -c1-200 $OUT/sweep.txt
