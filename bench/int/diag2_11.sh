#!/bin/bash
# bench/int/diag2_11.sh BIN OUTDIR: S11 diagnosis 2 (call 5): graph vs eager under the mid path's switches, graph runs repeated;
# also the bisect binaries of bench/int/bisect11.sh unpacked at /tmp/b/bis
B=$1; OUT=$2; mkdir -p $OUT
export LD_LIBRARY_PATH=$(dirname $B)
SYN="synth:qwen3.5-35b-a3b,layers=4"
IDS=$(python3 -c "import numpy as np; print(','.join(str(int(x)) for x in np.random.default_rng(9).integers(3, 248000, size=32)))")
run() { local tag=$1 envs=$2 b=$3; shift 3; env $envs timeout 60 $b generate --model-path "$SYN" --device cuda --ids "$IDS" --max-new-tokens 64 --sampling-backend device "$@" >$OUT/$tag.json 2>$OUT/$tag.err; }
cmp() { python3 -c "
import json,sys
a=json.load(open('$OUT/$1.json'))['ids']; b=json.load(open('$OUT/$2.json'))['ids']
f=next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y),None); print('SAME' if f is None else 'DIFF@'+str(f), end='')" 2>/dev/null || echo -n "ERR"; }
run base-e "" $B --disable-cuda-graph
for i in 1 2 3; do run base-g$i "" $B; done
echo "main defaults: graph runs vs eager: $(cmp base-e base-g1) $(cmp base-e base-g2) $(cmp base-e base-g3); graph1 vs graph2 $(cmp base-g1 base-g2)"
for v in "mid:LASTSTAND_MG_MID=0" "router:LASTSTAND_MG_MIDROUTER=0" "topk:LASTSTAND_MG_MIDTOPK=0" "pdl:LASTSTAND_MG_MIDPDL=0" "side:LASTSTAND_MG_SIDE=0" "dnearly:LASTSTAND_MG_DNEARLY=0" "midgu:LASTSTAND_MG_MIDGU=1" "wg:LASTSTAND_MG_WGMMA=0"; do
  n=${v%%:*}; e=${v#*:}
  run $n-e "$e" $B --disable-cuda-graph; run $n-g "$e" $B; run $n-g2 "$e" $B
  echo "$n [$e]: eager vs main eager $(cmp base-e $n-e); graph vs its eager $(cmp $n-e $n-g) $(cmp $n-e $n-g2)"
done
for b in /tmp/b/bis/laststand-3665348 /tmp/b/bis/laststand-4508d2c; do
  s=${b##*-}; run $s-e "" $b --disable-cuda-graph; for i in 1 2 3; do run $s-g$i "" $b; done
  echo "$s: graph vs eager $(cmp $s-e $s-g1) $(cmp $s-e $s-g2) $(cmp $s-e $s-g3)"
done
