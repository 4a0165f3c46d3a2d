#!/bin/bash
# bench/int/bisect11.sh DIR OUTDIR: for each DIR/laststand-SHA, graph vs eager greedy ids
# (test_gpu_attn_graph.py's case, 64 tokens) and the engine's sampler check at a serve start
# (test_gpu_grammar.py's server flags). S11's bisect of the graph != eager regression.
# device-limit: 200
D=$1; OUT=$2; mkdir -p $OUT
export LD_LIBRARY_PATH=$D${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
SYN="synth:qwen3.5-35b-a3b,layers=4"
IDS=$(python3 -c "import numpy as np; print(','.join(str(int(x)) for x in np.random.default_rng(9).integers(3, 248000, size=32)))")
for b in $D/laststand-*; do
  s=${b##*-}
  for mode in e g; do
    fl=""; [ $mode = e ] && fl=--disable-cuda-graph
    timeout 60 $b generate --model-path "$SYN" --device cuda --ids "$IDS" --max-new-tokens 64 --sampling-backend device $fl >$OUT/$s-$mode.json 2>$OUT/$s-$mode.err
  done
  python3 - $OUT $s <<'PY'
import json, sys
o, s = sys.argv[1:3]
try:
    a = json.load(open(f"{o}/{s}-e.json"))["ids"]; b = json.load(open(f"{o}/{s}-g.json"))["ids"]
    f = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    print(f"{s}: graph vs eager: {'SAME' if f is None else 'DIFF from ' + str(f)}")
except Exception as e:
    print(f"{s}: no result ({e})")
PY
  # the sampler check at a serve start (grammar test's server)
  P=$((37000 + RANDOM % 2000))
  timeout 50 $b serve --model-path synth:qwen3.5-35b-a3b,layers=8 --device cuda --max-running-requests 8 --prefix-cache off --host 127.0.0.1 --port $P >$OUT/$s-serve.log 2>&1 &
  sp=$!
  for i in $(seq 100); do grep -q "listening\|serving on\|ready" $OUT/$s-serve.log 2>/dev/null && break; curl -s -o /dev/null "http://127.0.0.1:$P/health" && break; sleep 0.5; done
  kill $sp 2>/dev/null; wait $sp 2>/dev/null
  echo "   serve: $(grep -o "sampling on the [a-z]*[^,]*" $OUT/$s-serve.log | head -2 | tr '\n' ' ' | cut -c1-300)"
done
