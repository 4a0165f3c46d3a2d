#!/usr/bin/env bash
# device-limit: 200
# bench/device/genvar.sh BIN OUTDIR: the engine's mean decode step (CUDA graphs, `generate`, a
# 512-token prompt + 129 new tokens, DEV_PLANS_DECODE) of each preset in GENVAR_PRESETS (';'
# separated synth specs, default the 8-layer Qwen3-30B-A3B NVFP4) under each variant in
# GENVAR_VARIANTS (';' separated "tag:VAR=V VAR=V", default none besides "base" = the defaults),
# with the 129 greedy ids of each variant compared with base's. GENVAR_EXTRA: a command run
# first (e.g. a tool probe). For A/B checks of the knobs a change adds.
. "$(dirname "$0")/lib.sh"
dev_init genvar 195 "$@"
PLANS=("${DEV_PLANS_DECODE[@]}")
[ -n "${GENVAR_EXTRA:-}" ] && bash -c "$GENVAR_EXTRA" 2>&1 | head -20
IFS=';' read -r -a presets <<<"${GENVAR_PRESETS:-qwen3-30b-a3b,quant=nvfp4,layers=8}"
IFS=';' read -r -a variants <<<"base:;${GENVAR_VARIANTS:-}"
for p in "${presets[@]}"; do
    for v in "${variants[@]}"; do
        [ -n "$v" ] || continue
        tag=${v%%:*} envs=${v#*:}
        [ "$(left)" -gt 20 ] || { echo "out of time before $p $tag"; break 2; }
        f="$OUT/gen-${p//[^a-z0-9]/_}-$tag.out"
        # shellcheck disable=SC2086
        env $envs timeout -k 3 "$(( $(left) - 5 ))" "$BIN" generate --model-path "synth:$p" --ids "$(ids 512)" \
            --max-new-tokens 129 --device cuda "${PLANS[@]}" >"$f" 2>&1
        rc=$?
        ms=$(grep -o "[0-9.]* ms each" "$f" | head -1)
        grep -o '"ids": *\[[0-9, ]*\]' "$f" | head -1 >"$f.ids"
        [ "$tag" = base ] && base="$f.ids"
        eq=$(cmp -s "$f.ids" "$base" && echo "ids = base" || echo "ids differ from base")
        printf '%-40s %-10s rc=%d %-16s %s %s\n' "$p" "$tag" "$rc" "${ms:-?}" "$eq" "$(el)"
        [ $rc -ne 0 ] && grep -iE "error" "$f" | head -3
    done
done
