#!/bin/bash
# bench/device/tidy2.sh: task tidy2 (S11), a clean-up with no change in any result: gdn_decode.cu's
# duplicated state-update and m/p loops folded into shared helpers (gs_update_rows, gd_mp4, ...;
# sm_90a SASS byte-identical here), moe_fused.cu split into moe_fused.cu + moe_fused_dec.cu +
# moe_fused_int.cuh (the three-launch form and the kernels it shares moved verbatim). Checks that
# every form still gives the oracle's answer: PASS / FAIL lines.
# device-limit: 80
#
#   bash bench/device/tidy2.sh BIN OUTDIR
#
# 1. doctor, moe family, cuda_fused_decode against the fp64 CPU reference on the synth 35B layer
#    (BF16 shared expert): M = 1 (four launches, launch 1 in rows form, the cp.async pair), 4 and 8
#    (the three launches, moe_fused_dec.cu); LASTSTAND_MOE_DEC=0 at 4, 8 (four launches, m16n8k16
#    shared tiles, the cp.async pair); the NVFP4 shared expert (--shapes) at 1, 4, 8.
# 2. cmocka test_gdn_decode_cuda: gd_kernel_s / gd_kernel_p == gd_kernel bit for bit (every shape,
#    1 / 6 / 0 tokens, fused norm and not, the 16-sequence step).
# 3. pytest tests/test_gpu_gdn_decode.py (doctor fp64 cells, fixtures' logits, graphs == eager).
# 4. pytest tests/test_gpu_moe_fused.py (every knob against the fp64 reference), the BF16 shared
#    expert's and the 397B rank's cells first, then the NVFP4 shared expert's, as far as time goes.
. "$(dirname "$0")/lib.sh"
dev_init tidy2 78 "$@"
S35=synth:qwen3.5-35b-a3b,layers=1

# doctor TAG "ENV" MS SRC...: one PASS / FAIL line per cell (status "ok" from the fp64 oracle)
doctor() {
    local tag=$1 envs=$2 ms=$3
    shift 3
    local t=$(left); [ "$t" -gt 12 ] && t=12
    [ "$t" -ge 5 ] || { echo "SKIP doctor $tag (time)"; return; }
    local f="$OUT/doc-$tag"
    env $envs XDG_CACHE_HOME="$OUT/cache-$tag" timeout -k 2 "$t" "$BIN" doctor --device cuda --families moe \
        --backends cuda_fused_decode --m "$ms" --json "$f.json" "$@" >"$f.txt" 2>"$f.err"
    local rc=$?
    [ -s "$f.json" ] || { echo "FAIL doctor $tag: rc=$rc, no report ($(tail -c 300 "$f.err" | tr '\n' ' '))"; return; }
    timeout 5 python3 - "$f.json" "$tag" "$ms" <<'EOF' || echo "FAIL doctor $tag: unreadable report"
import json, sys
path, tag, ms = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
tab = [t for t in json.load(open(path))["tables"] if t["family"] == "moe"][0]
cells = tab["cells"]["cuda_fused_decode"]
for m in ms:
    c = cells.get(m)
    st = c["status"] if c else "missing"
    us = "%.1f us" % (1000 * c["ms"]) if c and c.get("ms") else ""
    print("%s doctor %s M=%s: %s %s (%s)" % ("PASS" if st == "ok" else "FAIL", tag, m, st, us,
                                            (c or {}).get("detail", "")[:100]))
EOF
}
echo "== 1. doctor cuda_fused_decode vs fp64 $(el)"
doctor bf16-def "" 1,4,8 --model-path "$S35"
doctor bf16-dec0 "LASTSTAND_MOE_DEC=0" 4,8 --model-path "$S35"
doctor nvfp4-def "" 1,4,8 --shapes qwen3.5-35b-a3b

echo "== 2. cmocka test_gdn_decode_cuda (bitwise) $(el)"
if [ -x "$D/tests/test_gdn_decode_cuda" ]; then
    LS_SHARED="$D" timeout -k 3 25 "$D/tests/test_gdn_decode_cuda" >"$OUT/test_gdn_decode_cuda.log" 2>&1
    rc=$?
    grep -E "^\[ +(PASSED|FAILED|OK|SKIPPED) |differs|rror" "$OUT/test_gdn_decode_cuda.log" | head -12
    ok=$([ $rc = 0 ] && ! grep -q SKIPPED "$OUT/test_gdn_decode_cuda.log" && echo PASS || echo FAIL)
    echo "$ok test_gdn_decode_cuda rc=$rc (skipped tests count as FAIL: a GPU is there) $(el)"
else
    echo "FAIL test_gdn_decode_cuda: missing $D/tests/test_gdn_decode_cuda"
fi

# pytest LIMIT FILE [ARGS]: a PASS / FAIL / PART (time ran out, nothing failed) line from the per-test results
pyt() {
    local lim=$1 f=$2 t=$(left)
    shift 2
    [ "$t" -gt "$lim" ] && t=$lim
    [ "$t" -ge 8 ] || { echo "SKIP pytest $f (time)"; return; }
    NPY=$((${NPY:-0} + 1))
    local log="$OUT/pytest$NPY-$(basename "$f" .py).log"
    echo "== pytest $f $* (limit $t s) $(el)"
    BUILD=$D LS_SHARED=$D timeout -k 3 "$t" python3 -u -m pytest -v -p no:cacheprovider -rfE "$f" "$@" >"$log" 2>&1
    local rc=$? np nf ns
    np=$(grep -c " PASSED" "$log"); nf=$(grep -cE " (FAILED|ERROR)" "$log"); ns=$(grep -c " SKIPPED" "$log")
    grep -E "^(FAILED|ERROR) " "$log" | cut -c1-160 | head -6
    local v=FAIL
    [ "$nf" = 0 ] && [ "$np" -gt 0 ] && { [ $rc = 0 ] && v=PASS || v=PART; }
    echo "$v pytest $f: $np passed, $nf failed, $ns skipped, rc=$rc (124: time ran out) $(el)"
}
pyt 25 tests/test_gpu_gdn_decode.py
# the BF16 shared expert's cells first (launch 1's rows form, the three launches: the moved code)
pyt 40 tests/test_gpu_moe_fused.py -k "bf16 or rank"
pyt 20 tests/test_gpu_moe_fused.py -k nvfp4
echo "total $(el)"
