#!/usr/bin/env bash
# device-limit: 90
# bench/device/oprates.sh BIN OUTDIR: issue rates of the NVFP4 decode's instructions and of two whole
# decoders (bench/kernels/op_rates.cu, built here with nvcc), with the SASS opcode counts of each
# kernel, to decide whether an E4M3 -> f16 decode (F2FP) would cut the routed experts' instructions.
. "$(dirname "$0")/lib.sh"
dev_init oprates 85 "$@"
cd "$(dirname "$D")" || exit 1
nvcc -O3 -std=c++17 -Isrc -gencode arch=compute_90a,code=sm_90a -o "$OUT/op_rates" bench/kernels/op_rates.cu || exit 1
echo "built $(el); clocks.sm now: $(nvidia-smi --query-gpu=clocks.sm,clocks.max.sm --format=csv,noheader)"
"$OUT/op_rates" 1980
CUO=$(command -v cuobjdump || ls /usr/local/cuda*/bin/cuobjdump 2>/dev/null | head -1)
[ -n "$CUO" ] && "$CUO" -sass "$OUT/op_rates" | awk '/Function :/{f=$3; next} /\/\*[0-9a-f]+\*\//{op=$2; if (op ~ /^@/) op=$3; sub(/;$/,"",op); split(op,p,"."); c[f" "p[1]]++} END{for (k in c) print k, c[k]}' | sort | grep -E "rate_kernel|check" | awk '{a[$1]=a[$1]" "$2"="$3} END{for (f in a) print f":"a[f]}' | sort
echo "done $(el)"
