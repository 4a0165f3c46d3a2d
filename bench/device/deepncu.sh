#!/usr/bin/env bash
# device-limit: 300
# bench/device/deepncu.sh BIN OUTDIR: where the wide decode step's three biggest kernels spend
# their issue slots, instruction by instruction (S23). ncu --set full with source counters over
# an eager `generate --batch B` of the synth Qwen3.5-35B-A3B at 4 layers (BF16 GDN state, the plans
# serve picks on auto): one launch each of gd_kernel_p (the GDN decode), mv_kernel (the routed
# gate/up) and mvd_kernel (the routed down), taken from a decode step with every sequence in it.
# Leaves OUTDIR/<tag>.details.txt (every section), OUTDIR/<tag>.sass.csv.xz (per SASS instruction:
# executed count, stall samples) for bench/device/deepncu_table.py, which prints the summary here.
# DNCU_B (default 128), DNCU_K ("tag|regex|skip ..."), DNCU_FLAGS (extra generate flags).
. "$(dirname "$0")/lib.sh"
dev_init deepncu 295 "$@"
[ -n "$NCU" ] || { echo "no ncu"; exit 1; }
B=${DNCU_B:-128}
read -ra XF <<<"${DNCU_FLAGS:---mamba-ssm-dtype bfloat16}"
# 4 layers = 3 GDN + 1 attention, 4 MoE: a decode step launches gd_kernel_p 3 times, mv_kernel and
# mvd_kernel 4 times each; skip the first 10 steps' worth (the prompts' prefill chunks first)
read -ra KS <<<"${DNCU_K:-gdp|gd_kernel_p|30 mv|^mv_kernel|40 mvd|^mvd_kernel|40}"
for k in "${KS[@]}"; do
    IFS='|' read -r tag re skip <<<"$k"
    [ "$(left)" -gt 60 ] || { echo "$tag: out of time"; break; }
    echo "== $tag: ncu --set full, kernel $re, launch-skip $skip, B = $B $(el)"
    timeout -k 3 $(( $(left) - 30 )) "$NCU" --set full --import-source no --clock-control none \
        -k regex:"$re" --launch-skip "$skip" --launch-count 1 -o "$OUT/$tag" \
        "$BIN" generate --model-path synth:qwen3.5-35b-a3b,layers=4 --ids "$(ids 512)" --max-new-tokens 24 \
        --ignore-eos --batch "$B" --device cuda --disable-cuda-graph "${DEV_PLANS_AUTO[@]}" "${XF[@]}" \
        >"$OUT/$tag.gen.out" 2>"$OUT/$tag.gen.err"
    echo "rc=$? $(el)"
    if [ -f "$OUT/$tag.ncu-rep" ]; then
        timeout 40 "$NCU" --import "$OUT/$tag.ncu-rep" --page details >"$OUT/$tag.details.txt" 2>&1
        timeout 60 "$NCU" --import "$OUT/$tag.ncu-rep" --page source --csv --print-source sass \
            >"$OUT/$tag.sass.csv" 2>"$OUT/$tag.sass.err"
        timeout 30 python3 bench/device/deepncu_table.py "$OUT/$tag.details.txt" "$OUT/$tag.sass.csv"
        xz -T2 "$OUT/$tag.sass.csv"
        rm -f "$OUT/$tag.ncu-rep"
    else
        grep -E "==ERROR|==PROF|error" "$OUT/$tag.gen.err" | head -5
    fi
done
echo "done $(el)"
