#!/bin/bash
# bench/device/pdlcheck.sh: is the MoE mid path's router deterministic with programmatic dependent
# launch? (S11 found it history-dependent with S10's trigger-first PDL launch and launched it plain;
# bench/RESULTS.md "PDL hazard audit" names the suspects.) Detectors, each must hold exactly:
#  - test_prefix_cuda: one prefill step with in-step GDN snapshots vs without = 0 on synth 35B
#    (0.179 under S10's launch) and its other comparisons;
#  - `generate` synth 35B (4 layers, test_gpu_attn_graph.py's 32 ids, 64 tokens): CUDA-graph
#    decode ids == eager ids, twice (S10's launch: different from token 0);
#  - serve's start-up sampler check (the same 8-token forward six times): "sampling on the device".
# Variants: LASTSTAND_MG_ROUTER_PDL=0 (the default: a plain launch), =1 (S10's), =2 (PDL with the
# release after the wait); with =1 the audit's suspects one at a time: LASTSTAND_MG_DNEARLY=0
# (down's early plan reads), LASTSTAND_MG_SIDE=0 (the combine after the side-stream join),
# LASTSTAND_MG_MIDDN=1. A variant clean on all three detectors, with =2, can become the default
# (then time it: bench/device/c16moe.sh's doctor cells at M = 9..64).
# device-limit: 150
#   bash bench/device/pdlcheck.sh BIN OUTDIR
. "$(dirname "$0")/lib.sh"
dev_init pdlcheck 148 "$@"
SYN="synth:qwen3.5-35b-a3b,layers=4"
IDS=$(python3 -c "import numpy as np; print(','.join(str(int(x)) for x in np.random.default_rng(9).integers(3, 248000, size=32)))")
gen() { # tag envs flags...
    local tag=$1 envs=$2; shift 2
    env $envs timeout 40 "$BIN" generate --model-path "$SYN" --device cuda --ids "$IDS" --max-new-tokens 64 \
        --sampling-backend device "$@" >"$OUT/$tag.json" 2>"$OUT/$tag.err"
}
same() { python3 -c "
import json, sys
try:
    a = json.load(open('$OUT/$1.json'))['ids']; b = json.load(open('$OUT/$2.json'))['ids']
    f = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    print('SAME' if f is None else 'DIFF@' + str(f), end='')
except Exception as e:
    print('ERR', end='')"; }
for v in "p0:LASTSTAND_MG_ROUTER_PDL=0" "p1:LASTSTAND_MG_ROUTER_PDL=1" "p2:LASTSTAND_MG_ROUTER_PDL=2" \
         "p1-dnearly0:LASTSTAND_MG_ROUTER_PDL=1 LASTSTAND_MG_DNEARLY=0" \
         "p1-side0:LASTSTAND_MG_ROUTER_PDL=1 LASTSTAND_MG_SIDE=0" "p1-middn1:LASTSTAND_MG_ROUTER_PDL=1 LASTSTAND_MG_MIDDN=1"; do
    n=${v%%:*}; envs=${v#*:}
    [ "$(left)" -gt 20 ] || { echo "$n: skipped (time)"; continue; }
    gen $n-e "$envs" --disable-cuda-graph; gen $n-g1 "$envs"; gen $n-g2 "$envs"
    pf=$(env $envs LS_SHARED="$D" timeout 30 "$D/tests/test_prefix_cuda" 2>&1 | grep -E "35b.*one step with" | grep -oE "[0-9.e+-]+$")
    P=$((38000 + RANDOM % 2000))
    env $envs timeout 40 "$BIN" serve --model-path synth:qwen3.5-35b-a3b,layers=8 --device cuda --max-running-requests 8 \
        --prefix-cache off --host 127.0.0.1 --port $P >"$OUT/$n-serve.log" 2>&1 &
    sp=$!
    for _ in $(seq 80); do curl -s -o /dev/null "http://127.0.0.1:$P/health" && break; sleep 0.5; done
    kill $sp 2>/dev/null; wait $sp 2>/dev/null
    smp=$(grep -oE "sampling on the (device|host)" "$OUT/$n-serve.log" | head -1)
    ok=FAIL; [ "$(same $n-e $n-g1)$(same $n-e $n-g2)" = SAMESAME ] && [ "$pf" = 0 ] && [ "$smp" = "sampling on the device" ] && ok=PASS
    echo "$ok $n [$envs]: graph vs eager $(same $n-e $n-g1) $(same $n-e $n-g2); snapshots vs not ${pf:-?}; serve: ${smp:-?}"
done
echo "total $(( $(date +%s) - T0 )) s"
