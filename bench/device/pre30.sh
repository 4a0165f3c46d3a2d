#!/usr/bin/env bash
# device-limit: 150
# bench/device/pre30.sh BIN OUTDIR: prefill-size cells of the doctor (fp64 verdict, chained µs) at the
# Qwen3-30B-A3B (head_dim 128, NVFP4 experts, I 768) and Qwen3.5-35B-A3B layers: attention as one
# causal prompt of M tokens (LASTSTAND_DOCTOR_ATTN_PREFILL=0), M = 1024, 4096, 8192; moe at M = 1024,
# 8192. Where a family member's prefill leaves the tuned paths. Attention with the wgmma kernel at head_dim
# 128 (the default since S14) and without (LASTSTAND_FP_WG128=0). PRE30_PRESETS, PRE30_NOMOE=1.
. "$(dirname "$0")/lib.sh"
dev_init pre30 145 "$@"
for p in ${PRE30_PRESETS:-"qwen3-30b-a3b,quant=nvfp4" "qwen3.5-35b-a3b"}; do
  for wg in 1 0; do
    f="$OUT/a-${p%%,*}-wg128-$wg"
    echo "== $p attention, one prompt of M tokens, LASTSTAND_FP_WG128=$wg $(el)"
    LASTSTAND_FP_WG128=$wg LASTSTAND_DOCTOR_ATTN_PREFILL=0 timeout -k 2 60 "$BIN" doctor --device cuda \
        --model-path "synth:$p,layers=1" --families attention --backends cuda_flash_prefill --m 1024,4096,8192 \
        >"$f.txt" 2>"$f.err"
    echo "rc=$? $(el)"; grep -E "^attention|^ +[0-9]+ " "$f.txt" | cut -c1-120
  done
  [ -n "${PRE30_NOMOE:-}" ] && continue
    f="$OUT/m-${p%%,*}"
    echo "== $p moe $(el)"
    timeout -k 2 60 "$BIN" doctor --device cuda --model-path "synth:$p,layers=1" --families moe \
        --backends cuda_grouped_gemm --m 1024,8192 >"$f.txt" 2>"$f.err"
    echo "rc=$? $(el)"; grep -E "^moe|^ +[0-9]+ " "$f.txt" | cut -c1-120
done
