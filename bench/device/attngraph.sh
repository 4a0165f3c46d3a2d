#!/usr/bin/env bash
# bench/device/attngraph.sh: CUDA-graph replay vs eager with every attention backend, and
# small-batch attention decode latency (DEVICE_ROUNDS.md protocol; under 100 s).
#
#   bash bench/device/attngraph.sh BIN OUTDIR
#
# 1. `laststand generate` greedy, synth:qwen3.5-35b-a3b,layers=4 (as graph.sh's synth rows), 136
#    tokens, CUDA graphs (--sampling-backend device) vs eager (--disable-cuda-graph), attention
#    auto (cuda_flash_prefill), side by side on the GPU: the old round plan
#    (LASTSTAND_FP_PLAN=round: graph.sh's 19/136 row in R1, R2), both plannings forced to 64
#    round-robin splits (LASTSTAND_FP_PLAN=64), the defaults (row plan, fp_dec_kernel, PDL 2, 4
#    stages at M = 1), the row plan on fp_kernel, the defaults with 2 stages (the pipeline depth
#    must not change a bit). Prints tokens equal and the first divergent step: forced-equal plans
#    agreeing where the old plan does not = plan-dependent rounding, not a replay reading stale or
#    out-of-range data. Beside them, compute-sanitizer memcheck of a generate run replaying the
#    graph (defaults). (graph.sh has the cuda_flash_decode control.)
# 2. the doctor's attention cells (cuda_flash_prefill vs its fp64 reference), 397B and 35B presets:
#    its mixed batches at M = 1, 8, 64; pure decode steps at contexts 512 / 4096 / 16384
#    (LASTSTAND_DOCTOR_ATTN_CTX): the defaults against the old round plan.
# 3. the cmocka GPU test test_attn_cuda, when staged beside BIN (tests/): op-level graph replay at
#    other contexts vs eager bits and vs an fp64 reference, decode timings per backend,
#    compute-sanitizer memcheck of those replays; time left permitting.
set -u
BIN=${1:?usage: attngraph.sh BIN OUTDIR}
OUT=${2:?usage: attngraph.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export XDG_CACHE_HOME="$OUT/cache"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 ))s"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1

SYN="synth:qwen3.5-35b-a3b,layers=4"
IDS=$(python3 -c "import numpy as np; print(','.join(str(int(x)) for x in np.random.default_rng(9).integers(3, 248000, size=32)))")
gen() { # $1 tag, rest: extra flags; env from caller
    local tag=$1; shift
    timeout 70 "$BIN" generate --model-path "$SYN" --device cuda --ids "$IDS" --max-new-tokens 136 \
        --sampling-backend device "$@" > "$OUT/gen-$tag.json" 2> "$OUT/gen-$tag.err"
    local rc=$?
    [ $rc -ne 0 ] && echo "   generate $tag rc=$rc: $(tail -c 400 "$OUT/gen-$tag.err")"
    return $rc
}
cmp_ids() { # $1 graph tag, $2 eager tag, $3 label
    python3 - "$OUT/gen-$1.json" "$OUT/gen-$2.json" "$3" "$OUT/gen-$1.err" <<'PY'
import json, sys
try:
    g = json.load(open(sys.argv[1]))["ids"]; e = json.load(open(sys.argv[2]))["ids"]
except Exception as ex:
    print(f"  {sys.argv[3]:<44} ERROR {ex}"); sys.exit()
same = sum(a == b for a, b in zip(g, e))
first = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), None)
chk = [l.strip()[-120:] for l in open(sys.argv[4]) if "checked against" in l or "disagree" in l or "eagerly" in l]
print(f"  {sys.argv[3]:<44} {'SAME' if same == len(e) else 'DIFF'} {same}/{len(e)} tokens equal"
      + ("" if first is None else f", first divergent step {first} (graph {g[first:first+3]} eager {e[first:first+3]})"))
for l in chk[:2]: print("     graph log:", l)
PY
}
echo "== 1. generate greedy, graph vs eager, $SYN, 136 tokens ($(el))"
# the 8 runs side by side on the one GPU (each is small; the results do not depend on it).
# Configs (env): the old round plan (graph.sh's 19/136 row), both plannings forced to 64 round-robin
# splits (plan-dependent rounding vs a replay bug), the defaults (row plan, fp_dec_kernel, PDL 2),
# the row plan on fp_kernel.
CFGS=("round|LASTSTAND_FP_PLAN=round" "forced64|LASTSTAND_FP_PLAN=64" "default|" \
      "rows-fp_kernel|LASTSTAND_FP_DEC=0 LASTSTAND_FP_PDL=0" "stages-2|LASTSTAND_FP_STAGES=2")
for cfg in "${CFGS[@]}"; do
    tag=${cfg%%|*}; ev=${cfg#*|}
    ( [ -n "$ev" ] && export $ev; gen "g-$tag" ) &
    ( [ -n "$ev" ] && export $ev; gen "e-$tag" --disable-cuda-graph ) &
done
# and beside them: compute-sanitizer memcheck of a generate run replaying the graph (defaults)
if command -v compute-sanitizer >/dev/null; then
    timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$BIN" generate --model-path "$SYN" \
        --device cuda --ids "$IDS" --max-new-tokens 6 --sampling-backend device > "$OUT/memcheck-gen.log" 2>&1 &
fi
wait
for cfg in "${CFGS[@]}"; do
    tag=${cfg%%|*}; ev=${cfg#*|}
    cmp_ids "g-$tag" "e-$tag" "auto attention, $tag${ev:+ ($ev)}"
done
[ -f "$OUT/memcheck-gen.log" ] && echo "  memcheck of generate with graph replays (defaults): $(grep -E 'ERROR SUMMARY|replayed' "$OUT/memcheck-gen.log" | tr '\n' ' ' | cut -c1-300)" \
    && grep -E "Invalid|out of bounds" "$OUT/memcheck-gen.log" | head -6
python3 - "$OUT" <<'PY'
import json, sys, os
o = sys.argv[1]
def ids(t):
    try: return json.load(open(os.path.join(o, f"gen-{t}.json")))["ids"]
    except Exception: return None
a, b = ids("e-round"), ids("e-default")
if a and b:
    print(f"  eager round vs eager default (other split and kernel): {sum(x == y for x, y in zip(a, b))}/{len(a)} equal (info)")
# fp_dec_kernel's pipeline depth must not change the arithmetic: 4 stages = 2 stages, bit for bit
for m in ("e", "g"):
    a, b = ids(f"{m}-default"), ids(f"{m}-stages-2")
    if a and b:
        same = sum(x == y for x, y in zip(a, b))
        print(f"  {'eager' if m == 'e' else 'graph'} default (4 stages at M = 1) vs LASTSTAND_FP_STAGES=2: "
              f"{'SAME' if same == len(a) else 'DIFF'} {same}/{len(a)}")
PY

echo "== 2. doctor attention cells, cuda_flash_prefill ($(el))"
doc() { # $1 label, $2 env (may be empty), $3 shape, $4 M list
    local tag=$1 ev=$2 sh=$3 m=$4 f="$OUT/doctor-$(echo "$1-$3" | tr ' =/' '___')"
    ( [ -n "$ev" ] && export $ev; timeout 30 "$BIN" doctor --device cuda --shapes $sh --families attention \
        --backends cuda_flash_prefill --m $m --json "$f.json" > "$f.txt" 2> "$f.err" )
    local rc=$?
    printf "  %-44s %-18s rc=%d: %s\n" "$tag" "${sh%-a*}" $rc \
        "$(grep -E '^ +[0-9]+ ' "$f.txt" | awk '{printf "M=%s %s %s %s; ", $1, $2, $3, $4}')"
    [ $rc -ne 0 ] && tail -3 "$f.err" | sed 's/^/    /'
}
# A. the doctor's own mixed batches (a decode row at M = 1; decode rows and prefill chunks above)
for sh in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
    doc "mixed, defaults" "" $sh 1,8,64
done
# B. pure decode steps (LASTSTAND_DOCTOR_ATTN_CTX: every row one new token at that context), as
#    CUDA graphs replay them: the defaults against the old round plan
for ctx in 512 4096 16384; do
    m=1,8,64; [ $ctx -gt 4096 ] && m=1,8
    for sh in qwen3.5-397b-a17b qwen3.5-35b-a3b; do
        doc "decode ctx $ctx, defaults" "LASTSTAND_DOCTOR_ATTN_CTX=$ctx" $sh $m
        doc "decode ctx $ctx, round plan" "LASTSTAND_DOCTOR_ATTN_CTX=$ctx LASTSTAND_FP_PLAN=round" $sh $m
    done
done

left() { echo $(( 96 - ($(date +%s) - T0) )); }
echo "== 3. op-level test test_attn_cuda, memcheck ($(el))"
UT="$(dirname "$BIN")/tests/test_attn_cuda"
if [ -x "$UT" ]; then
    # plans rows+dec, rows, round: graph replay at other contexts vs eager bits (asserted under rows)
    # and vs fp64 (asserted), decode timings
    for plan in default round; do
        l=$(left); [ $l -lt 10 ] && { echo "  plan $plan: skipped (time budget)"; continue; }
        ex=(LASTSTAND_FP_PLAN=round); [ $plan = default ] && ex=(LS_ATTN_PLAN_DEFAULT=1)
        env "${ex[@]}" timeout $(( l < 30 ? l : 30 )) "$UT" > "$OUT/test_attn_cuda-$plan.log" 2>&1
        echo "  plan $plan: rc=$? $(grep -E '^\[  (PASSED|FAILED)  \] [0-9]|^\[  SKIPPED \] [0-9]' "$OUT/test_attn_cuda-$plan.log" | tr '\n' ' ')"
        grep -E "attn:|FAIL|Failure|error" "$OUT/test_attn_cuda-$plan.log" | head -70
    done
    # compute-sanitizer memcheck of the same graph replays (the check part only): the default plan,
    # then the row plan with the decode kernel and PDL
    for plan in default round; do
        l=$(left)
        command -v compute-sanitizer >/dev/null || { echo "  compute-sanitizer not found"; break; }
        [ $l -lt 12 ] && { echo "  memcheck plan $plan: skipped (time budget)"; continue; }
        ex=(LASTSTAND_FP_PLAN=round); [ $plan = default ] && ex=(LS_ATTN_PLAN_DEFAULT=1)
        env "${ex[@]}" LS_ATTN_TEST=check timeout $(( l < 25 ? l : 25 )) compute-sanitizer \
            --tool memcheck --error-exitcode 9 "$UT" > "$OUT/memcheck-op-$plan.log" 2>&1
        echo "  memcheck, plan $plan, graph replays: rc=$? $(grep -E 'ERROR SUMMARY|PASSED  \]|FAILED  \]' "$OUT/memcheck-op-$plan.log" | tr '\n' ' ')"
        grep -E "Invalid|out of bounds|Address" "$OUT/memcheck-op-$plan.log" | head -6
    done
    # the row plan's knobs, timings only: PDL between the two kernels, chunk length
    for knob in "LASTSTAND_FP_STAGES=2" "LASTSTAND_FP_DEC=0"; do
        [ $(left) -lt 8 ] && { echo "  $knob: skipped (time budget)"; continue; }
        env LS_ATTN_TEST=quick $knob timeout 8 "$UT" > "$OUT/test_attn_quick.log" 2>&1
        echo "  defaults + $knob, quick timings: rc=$?"
        grep -E "attn:|FAIL|error" "$OUT/test_attn_quick.log" | head -16
    done
else
    echo "  not built at $UT"
fi

echo "done ($(el))"
