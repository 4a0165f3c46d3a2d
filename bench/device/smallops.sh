#!/bin/bash
# bench/device/smallops.sh: the row-wise norms one warp a row, persistent warps with the next
# rows' loads in flight during the math (src/ops/cuda/small.cu, "many rows";
# LASTSTAND_SMALL_ROWS=1, the default from 2048 rows) against one block a row (=0), S12:
# 1. tests/test_small_cuda: both forms on the 35B's prefill shapes and odd ones, the same bytes,
#    and the host (its engine-table test also with LASTSTAND_SMALL_ROWS=0); test_gdn_decode_cuda's
#    fused decode norm against small_ops.rmsnorm_gated bit for bit, under both switch values.
# 2. generate greedy, synth 35B 8 layers, a 512-token prompt, 64 new tokens (CUDA graphs, the
#    defaults' plans as prefill8k.sh's): the ids under =1 and =0 must be equal.
# 3. ncu (as prefill8k.sh: --clock-control none --cache-control none, its PLANS flags) over
#    `generate` of synth 35B cut to 4 layers (3 GDN + 1 attention), an 8192-token prompt, 4 new
#    tokens, eager, only the kernels sm_rmsnorm* / sm_qk_*, =1 and =0: µs and GB/s a launch by
#    family (the GDN gated norm, the q/k norm + rope + KV write) and phase (prefill, decode).
# device-limit: 90
. "$(dirname "$0")/lib.sh"
dev_init smallops 88 "$@"
export NCCL_NVLS_ENABLE=0
PLANS=("${DEV_PLANS_PREFILL[@]}")

# 2 first, in the background (its two runs side by side, beside the unit tests; done before ncu)
SYN8="synth:qwen3.5-35b-a3b,layers=8"
for f in 1 0; do
    LASTSTAND_SMALL_ROWS=$f timeout -k 3 40 "$BIN" generate --model-path "$SYN8" --ids "$(ids 512)" --max-new-tokens 64 \
        --device cuda --prefix-cache off "${PLANS[@]}" >"$OUT/gen-$f.json" 2>"$OUT/gen-$f.err" &
done

echo "== 1. test_small_cuda (default; the engine-table test with LASTSTAND_SMALL_ROWS=0), test_gdn_decode_cuda's fused norm vs rmsnorm_gated $(el)"
# tag|env|filter|binary
for c in "small||test_*|test_small_cuda" "small-old|LASTSTAND_SMALL_ROWS=0|test_qk_norm_rope_kv_equals_the_three_ops|test_small_cuda" \
         "gdnnorm||test_fused_norm_equals_the_two_ops|test_gdn_decode_cuda" \
         "gdnnorm-old|LASTSTAND_SMALL_ROWS=0|test_fused_norm_equals_the_two_ops|test_gdn_decode_cuda"; do
    IFS='|' read -r tag ev filt tb <<<"$c"
    env $ev LS_TEST_FILTER="$filt" timeout -k 3 40 "$D/tests/$tb" >"$OUT/test-$tag.log" 2>&1
    rc=$?
    grep -E "^\[ +(FAILED|SKIPPED|PASSED|ERROR)|differs|fp64|host|written" "$OUT/test-$tag.log" | head -6
    grep -q "SKIPPED" "$OUT/test-$tag.log" && rc=77
    [ $rc = 0 ] && echo "PASS $tb $filt ${ev:-default}" || { echo "FAIL $tb $filt ${ev:-default} rc=$rc"; tail -5 "$OUT/test-$tag.log"; }
done

echo "== 2. generate greedy synth 35B 8 layers, 512-token prompt, 64 new tokens: LASTSTAND_SMALL_ROWS=1 vs 0 $(el)"
wait
for f in 0; do
python3 - "$OUT/gen-1.json" "$OUT/gen-$f.json" $f <<'PY'
import json, sys
try:
    a = json.load(open(sys.argv[1]))["ids"]; b = json.load(open(sys.argv[2]))["ids"]
except Exception as ex:
    print(f"FAIL generate: no ids ({ex})"); sys.exit()
first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
ok = a == b and len(a) > 0
print(f"{'PASS' if ok else 'FAIL'} generate ids LASTSTAND_SMALL_ROWS=1 vs ={sys.argv[3]}: {sum(x == y for x, y in zip(a, b))}/{len(b)} equal (rows form {len(a)})"
      + ("" if first is None else f", first different step {first}"))
PY
done
for f in 1 0; do grep -iE "error|fail" "$OUT/gen-$f.err" | head -2; done
if [ -n "$NCU" ]; then
    for f in 1 0; do
        lim=$(( $(left) - 12 ))
        [ $lim -gt 25 ] && lim=25
        [ $lim -lt 8 ] && { echo "== ncu $f: skipped (time)"; continue; }
        echo "== 3. ncu generate synth 35B 4 layers, 8192-token prompt, 4 new tokens, LASTSTAND_SMALL_ROWS=$f (limit $lim s) $(el)"
        LASTSTAND_SMALL_ROWS=$f timeout -k 3 $lim "$NCU" --clock-control none --cache-control none -k regex:"sm_rmsnorm|sm_qk_" \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-$f" \
            "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 8192)" --max-new-tokens 4 \
            --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-$f.out" 2>&1
        echo "rc=$? $(el)"
        grep -E "==ERROR|error:" "$OUT/ncu-$f.out" | head -3
        [ -f "$OUT/ncu-$f.ncu-rep" ] && timeout 20 "$NCU" --import "$OUT/ncu-$f.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$f.csv" 2>"$OUT/ncu-$f.csv.err"
    done
    if [ -s "$OUT/ncu-0.csv" ]; then
        timeout 20 python3 bench/device/smallops_table.py 8192 old="$OUT/ncu-0.csv" rows="$OUT/ncu-1.csv"
    else
        echo "FAIL ncu: no table ($(head -c 300 "$OUT/ncu-1.csv.err" 2>/dev/null))"
    fi
else
    echo "ncu missing"
fi

echo "total $(( $(date +%s) - T0 )) s"
