#!/bin/bash
# bench/device/spec.sh BIN OUTDIR: speculative decoding's speed on the GPU, on the full synth
# Qwen3.5-35B-A3B (40 layers, random weights, NVFP4 experts): `serve --speculative-algorithm ngram`
# with test id forcing (LASTSTAND_TEST_FORCE_IDS=1: a random model never repeats itself, so the
# output is dictated; forward passes, drafts, verification and rollbacks are real), then
# bench/spec_bench.py at concurrency 1: outputs with no n-gram match (plain decode steps: the
# same server without drafts), copied from the prompt (drafts accepted) and the copy with every
# 4th token changed. SPEC_CFG="5:1 5:0 3:1 5:0:eager" runs a server per N:A[:eager],
# --speculative-num-draft-tokens N, LASTSTAND_SPEC_ADAPT=A, and with eager --disable-cuda-graph
# (default 5:1). SPEC_BUCKETS: the doctor buckets (default:
# serve's, with drafts 1,2,4,8,16,64,512,2048; S27 calls 1-4 ran 1,8,64).
# device-limit: 420
set -u
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUT=$2
mkdir -p "$OUT"
for cfg in ${SPEC_CFG:-5:1}; do  # num-draft-tokens:adapt (LASTSTAND_SPEC_ADAPT: the cost model on / off)
    n=${cfg%%:*}; rest=${cfg#*:}; adapt=${rest%%:*}; extra=""
    [ "${rest#*:}" = eager ] && extra=--disable-cuda-graph
    PORT=$((33000 + $$ % 1000))
    XDG_CACHE_HOME="$OUT/cache" LASTSTAND_TEST_FORCE_IDS=1 LASTSTAND_SPEC_ADAPT=$adapt "$BIN" serve --model-path synth:qwen3.5-35b-a3b \
        --device cuda --port $PORT --max-running-requests 8 --cuda-graph-max-bs 8 ${SPEC_BUCKETS:+--doctor-buckets $SPEC_BUCKETS} \
        --speculative-algorithm ngram --speculative-num-draft-tokens $n --log-level debug $extra >"$OUT/server$n.log" 2>&1 &
    pid=$!
    for i in $(seq 240); do curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && break; sleep 1; done
    echo "== num-draft-tokens $n, cost model $adapt $extra (server up after $i s)"
    python3 bench/spec_bench.py "http://127.0.0.1:$PORT" --reps ${REPS:-3} --k $((n - 1)) --vocab 240000
    kill $pid; wait $pid
    grep -E "speculative decoding|decode steps|CUDA graphs:" "$OUT/server$n.log" | cut -c1-220
    # the steps by kind: tokens and rows verifying drafts -> count, mean forward and sampling + commit ms
    python3 - "$OUT/server$n.log" <<'PY'
import re, sys, collections
acc = collections.defaultdict(list)
for m in re.finditer(r"step \d+: (\d+) seqs, (\d+) tokens, forward ([0-9.]+) ms, sampling and commit ([0-9.]+) ms.* (\d+) rows verifying", open(sys.argv[1]).read()):
    seqs, toks, f, s, v = m.groups()
    if int(toks) > 64: continue  # prefill
    acc[(int(seqs), int(toks), int(v))].append((float(f), float(s)))
print("seqs tokens verifying  steps  forward ms  sampling+commit ms")
for k in sorted(acc):
    v = acc[k]
    print(f"{k[0]:4} {k[1]:6} {k[2]:9} {len(v):6} {sum(a for a, _ in v) / len(v):11.3f} {sum(b for _, b in v) / len(v):19.3f}")
PY
done
