#!/usr/bin/env bash
# device-limit: 150
# bench/device/fpshort.sh BIN OUTDIR: cuda_flash_prefill's decode rows at a fixed context
# (LASTSTAND_DOCTOR_ATTN_CTX: M decode rows, one new token each, every row at context C), the
# doctor's fp64 verdict and chained time, with the row plan's short-context chunks (the default,
# up to 16 chunks) and without (LASTSTAND_FP_SHORT=0: 128-key chunks whatever the context), at the
# 35B and 30B shapes, C = 300 / 1300 / 4096, M = 1, 8, 16, 64.
. "$(dirname "$0")/lib.sh"
dev_init fpshort 145 "$@"
for shape in qwen3.5-35b-a3b qwen3-30b-a3b; do
    for ctx in ${FPSHORT_CTX:-300 1300 4096}; do
        for fs in ${FPSHORT_VALUES:-16 0}; do
            [ "$(left)" -gt 10 ] || { echo "out of time"; break 3; }
            printf '%-16s ctx %-5s FP_SHORT=%-3s ' "$shape" "$ctx" "$fs"
            LASTSTAND_FP_SHORT=$fs LASTSTAND_DOCTOR_ATTN_CTX=$ctx timeout -k 2 30 "$BIN" doctor --device cuda \
                --shapes "$shape" --families attention --backends cuda_flash_prefill --m 1,8,16,64 \
                >"$OUT/d-$shape-$ctx-$fs.txt" 2>"$OUT/d-$shape-$ctx-$fs.err"
            rc=$?
            echo "rc=$rc $(grep -E '^ +(1|8|16|64) ' "$OUT/d-$shape-$ctx-$fs.txt" | awk '{printf "M=%s %s %s %s | ", $1, $2, $3, $4}') $(el)"
        done
    done
done
