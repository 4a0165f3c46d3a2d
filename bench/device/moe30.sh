#!/usr/bin/env bash
# device-limit: 150
# bench/device/moe30.sh BIN OUTDIR: the doctor's moe cells (fp64 verdict, chained µs) of the fused
# decode and the grouped GEMM, M = 1 .. 64, at one layer of each synth preset in MOE30_PRESETS (';'
# separated; default the Qwen3-30B-A3B NVFP4 and the Qwen3.5-35B-A3B), under the defaults and each
# variant in MOE30_VARIANTS (';' separated "tag:VAR=V ..."), e.g. "mid0:LASTSTAND_MG_MID=0".
. "$(dirname "$0")/lib.sh"
dev_init moe30 145 "$@"
IFS=';' read -r -a presets <<<"${MOE30_PRESETS:-qwen3-30b-a3b,quant=nvfp4;qwen3.5-35b-a3b}"
IFS=';' read -r -a variants <<<"base:;${MOE30_VARIANTS:-}"
for p in "${presets[@]}"; do
    for v in "${variants[@]}"; do
        [ -n "$v" ] || continue
        tag=${v%%:*} envs=${v#*:} f="$OUT/d-${p%%,*}-${v%%:*}"
        [ "$(left)" -gt 15 ] || { echo "out of time before $p $tag"; break 2; }
        echo "== $p,layers=1 $tag${envs:+ ($envs)} $(el)"
        # shellcheck disable=SC2086
        env $envs timeout -k 2 $(( $(left) - 5 )) "$BIN" doctor --device cuda --model-path "synth:$p,layers=1" \
            --families moe --backends cuda_fused_decode,cuda_grouped_gemm --m ${MOE30_M:-1,2,4,8,12,16,24,32,64} \
            >"$f.txt" 2>"$f.err"
        echo "rc=$? $(el)"
        grep -E "^moe|^ +[0-9]+ " "$f.txt" | cut -c1-150
        grep -iE "crash|wrong" "$f.err" | head -3
    done
done
