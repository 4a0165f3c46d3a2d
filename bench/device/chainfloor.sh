#!/usr/bin/env bash
# device-limit: 90
# bench/device/chainfloor.sh BIN OUTDIR: the chainfloor session's GPU run (bench/RESULTS.md, "fp4_gemm
# at M = 1: the kernel-to-kernel handoff (S7, chainfloor)"): bench/kernels/gemv_floor.cu built here
# with nvcc and run in its `chain` mode:
#  1. %globaltimer's resolution;
#  2. the no-load chain (launches, handoff, 8 KB of x, one word a block written) split: grid 1 /
#     132 / 256 / 528 blocks (and 256 at 2 blocks an SM as the GEMV) x 128 / 512 / 1024 threads x
#     trigger first / last / none x griddepcontrol.wait / no wait (the incorrect lower bound) / the
#     flag handoff x x read or not, timed as the doctor times (behind a hold) and as a graph, chains
#     of 8 and 32;
#  3. %globaltimer traces of chains of 8: when call i's blocks start and pass their wait relative to
#     the end of call i - 1's last block;
#  4. the flag handoff against griddepcontrol.wait on the pure read of the [4096 x 4096] NVFP4 weight
#     and on the real fp4_gemv1t<16,2,0> skeleton (32 rotating sets > L2);
#  5. exactness: the real GEMV chained on its own output, eager and in graph replays, a producer
#     block delayed 20 us in some calls, bit for bit against the synced run; the no-wait form as the
#     negative control (it must differ).
# R2 adds the LL form (NCCL's LL protocol: x / y also as tagged 8-byte words, data + tag in one
# single-copy-atomic store; no fence, no atomic; each GEMV warp polls only its own x slice) to
# every table, trace and exactness check; R1 measured the flag (release/acquire election) slower.
# R3 adds the LL form with a poll back-off (__nanosleep 128 between polls): R2 measured LL exact and
# no faster, its polls (16 KB of tagged x a block a round) flooding L2. And the persistent GEMV
# (pgv_kernel: C = 8 / 32 calls in one cooperative launch, LL between calls, the next call's weights
# issued during this call's epilogue): what "fewer launches" is worth; exact against the synced run.
# BIN is not used (the bench is standalone); CF_MODE=graph|fp8 runs the older modes instead.
set -u
BIN=${1:?usage: chainfloor.sh BIN OUTDIR}
OUT=${2:?usage: chainfloor.sh BIN OUTDIR}
mkdir -p "$OUT"
: "$BIN"
T0=$(date +%s)
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | head -2
echo "git: $(git rev-parse --short HEAD 2>/dev/null)"
if [ -z "$NVCC" ]; then echo "chainfloor: no nvcc"; exit 1; fi
if ! timeout 60 "$NVCC" -O3 -std=c++17 -Isrc -gencode=arch=compute_90a,code=sm_90a \
     -o "$OUT/gemv_floor" bench/kernels/gemv_floor.cu > "$OUT/floor_build.log" 2>&1; then
  echo "chainfloor: the build failed:"; tail -20 "$OUT/floor_build.log"; exit 1
fi
echo "(built in $(( $(date +%s) - T0 )) s)"
timeout $(( 85 - ($(date +%s) - T0) )) "$OUT/gemv_floor" "${CF_MODE:-chain}" 2>&1
echo "gemv_floor rc=$? ($(( $(date +%s) - T0 )) s)"
