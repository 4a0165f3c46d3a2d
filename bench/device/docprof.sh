#!/usr/bin/env bash
# device-limit: 200
# bench/device/docprof.sh BIN OUTDIR: where the doctor's own time goes on the GPU machine (its
# trials' host work: input generation, uploads, CPU references, checks), for issue 5's 120 s bound.
# For each family in DOCPROF_FAMILIES (default gdn,moe,gemm) of synth:DOCPROF_MODEL (default
# qwen3.5-397b-a17b,layers=4): `laststand doctor --families F` (each backend's line says start-up /
# uploads / timing / inputs + checks), under `perf record -g` when perf is installed, then the
# top symbols of its children by self time (perf report --no-children).
. "$(dirname "$0")/lib.sh"
dev_init docprof 195 "$@"
MODEL=${DOCPROF_MODEL:-qwen3.5-397b-a17b,layers=4}
PERF=$(command -v perf || true)
echo "perf: ${PERF:-none}"
for f in $(echo "${DOCPROF_FAMILIES:-gdn,moe,gemm}" | tr , ' '); do
    [ "$(left)" -lt 30 ] && { echo "== $f skipped (time)"; continue; }
    echo "== doctor --families $f, synth:$MODEL $(el)"
    if [ -n "$PERF" ]; then
        timeout -k 3 $(( $(left) - 10 )) "$PERF" record -q -g -o "$OUT/perf-$f.data" -- \
            "$BIN" doctor --device cuda --model-path "synth:$MODEL" --families "$f" >"$OUT/doc-$f.txt" 2>"$OUT/doc-$f.err"
        echo "rc=$? $(el)"
        grep "^doctor:" "$OUT/doc-$f.err"
        timeout 40 "$PERF" report -i "$OUT/perf-$f.data" --no-children --sort comm,symbol 2>/dev/null |
            grep -v '^#' | grep '%' | grep -v '^ *[-|]' | head -30
        rm -f "$OUT/perf-$f.data"
    else
        timeout -k 3 $(( $(left) - 10 )) "$BIN" doctor --device cuda --model-path "synth:$MODEL" --families "$f" \
            >"$OUT/doc-$f.txt" 2>"$OUT/doc-$f.err"
        echo "rc=$? $(el)"
        grep "^doctor:" "$OUT/doc-$f.err"
    fi
done
echo "done $(el)"
