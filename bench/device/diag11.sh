#!/bin/bash
# bench/device/diag11.sh: S11's bisect of the GPU tests that failed on main e4fc8bf (graph replay !=
# eager tokens, the device sampler's start-up check, in-step snapshots): is a forward pass
# deterministic run to run, and which S10 default changes that?
# device-limit: 200
#   bash bench/device/diag11.sh BIN OUTDIR
# For each variant (defaults; K/V by cp.async; the old flash prefill; the mid path's old bound;
# four-launch fused MoE decode; mg_gemm_kernel prefill): `generate` on synth 35B (4 layers, the
# 32 ids of test_gpu_attn_graph.py) eager three times and from CUDA graphs once, 64 new tokens,
# device sampling: the ids of each run against the first eager run; the engine's sampler-check
# warning; then test_prefix_cuda under the same variant.
. "$(dirname "$0")/lib.sh"
dev_init diag11 200 "$@"
SYN="synth:qwen3.5-35b-a3b,layers=4"
IDS=$(python3 -c "import numpy as np; print(','.join(str(int(x)) for x in np.random.default_rng(9).integers(3, 248000, size=32)))")
VARS=("def:" "tma0:LASTSTAND_FP_WG_TMA=0" "wg0:LASTSTAND_FP_WG=0" "mid0:LASTSTAND_MG_MID4K=0"
      "dec0:LASTSTAND_MOE_DEC=0" "mgw0:LASTSTAND_MG_WGMMA=0" "all0:LASTSTAND_FP_WG=0 LASTSTAND_MG_MID4K=0 LASTSTAND_MOE_DEC=0")
gen() { # tag envs extra-flags...
    local tag=$1 envs=$2; shift 2
    env $envs timeout 60 "$BIN" generate --model-path "$SYN" --device cuda --ids "$IDS" --max-new-tokens 64 \
        --sampling-backend device "$@" >"$OUT/$tag.json" 2>"$OUT/$tag.err"
    echo $?
}
for v in "${VARS[@]}"; do
    n=${v%%:*}; envs=${v#*:}
    [ "$(left)" -gt 25 ] || { echo "$n: skipped (time)"; continue; }
    r1=$(gen $n-e1 "$envs" --disable-cuda-graph); r2=$(gen $n-e2 "$envs" --disable-cuda-graph)
    r3=$(gen $n-e3 "$envs" --disable-cuda-graph); r4=$(gen $n-g "$envs")
    python3 - "$OUT" $n "$envs" $r1 $r2 $r3 $r4 <<'PY'
import json, sys
o, n, envs = sys.argv[1:4]
def ids(t):
    try: return json.load(open(f"{o}/{n}-{t}.json"))["ids"]
    except Exception as e: return None
a = ids("e1")
out = []
for t in ("e2", "e3", "g"):
    b = ids(t)
    if a is None or b is None: out.append(f"{t}: no ids"); continue
    f = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    out.append(f"{t}: {'SAME' if f is None else 'DIFF from ' + str(f)}")
print(f"{n:5s} [{envs or 'defaults'}] rc {sys.argv[4:]} vs eager run 1: " + "; ".join(out))
PY
    grep -h "disagrees\|rror" "$OUT/$n-e1.err" "$OUT/$n-g.err" | sort -u | head -3 | cut -c1-250
    if [ -x "$D/tests/test_prefix_cuda" ]; then
        env $envs timeout 30 "$D/tests/test_prefix_cuda" >"$OUT/$n-prefix.log" 2>&1
        echo "      test_prefix_cuda rc=$? $(grep -h "one step with" "$OUT/$n-prefix.log" | tr '\n' ' ' | cut -c1-200)"
    fi
done
echo "total $(( $(date +%s) - T0 )) s"
