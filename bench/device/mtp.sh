#!/bin/bash
# bench/device/mtp.sh BIN OUTDIR: MTP drafts' speed on the GPU, on the full synth Qwen3.5-35B-A3B (40
# layers, NVFP4 experts) with a chain head (mtp=chain: the head's draft after token t is always f(t),
# so forced outputs choose the acceptance): f's chains from `laststand logits --mtp --chain`
# (the layers=4 cut: the same embedding, lm_head and head, seeded by name), then `serve` without
# drafts and with --speculative-algorithm mtp at MTP_N="2 3 4" num-draft-tokens, each benched by
# bench/mtp_bench.py at concurrency 1 (LASTSTAND_TEST_FORCE_IDS=1, the cost model off unless
# MTP_ADAPT=1): outputs random (every draft rejected), chain (every draft accepted), chain/4 and
# chain/8 (every 4th / 8th token off the chain). 1024-token prompt, 256 output tokens.
# device-limit: 480
set -u
BIN=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); OUT=$2
mkdir -p "$OUT"
M=synth:qwen3.5-35b-a3b,mtp=chain
export XDG_CACHE_HOME="$OUT/cache"
T0=$(date +%s)
. "$(dirname "$0")/lib.sh"
export MTP_PLANS="${DEV_PLANS_AUTO[*]}"  # the chain under the plans serve picks on auto (S28 call 3: the CLI's defaults failed)
python3 - "$BIN" "$OUT/forces.json" <<'PY'
import json, os, random, subprocess, sys
ls, out = sys.argv[1], sys.argv[2]
rnd = random.Random(11)
prompt = [rnd.randrange(1000, 240000) for _ in range(1024)]
def chain(q):
    a = [ls, "logits", "--model-path", "synth:qwen3.5-35b-a3b,layers=4,mtp=chain", "--device", "cuda", "--mtp",
         "--ids", f"0,{prompt[-1]}", "--chain", "256"] + (["--chain-deviate", str(q)] if q else []) + \
        os.environ.get("MTP_PLANS", "").split()
    r = subprocess.run(a, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)["chain"]
outs = {"random": [rnd.randrange(1000, 240000) for _ in range(256)], "chain": chain(0), "chain/4": chain(4),
        "chain/8": chain(8)}
json.dump({"prompt": prompt, "outputs": outs}, open(out, "w"))
print("forces:", {k: v[:6] for k, v in outs.items()})
PY
[ -f "$OUT/forces.json" ] || { echo "no forces: stop"; exit 1; }
echo "forces in $(( $(date +%s) - T0 )) s"
serve() { # tag n (0: no drafts)
    local tag=$1 n=$2 extra=""
    [ "$n" -gt 0 ] && extra="--speculative-algorithm mtp --speculative-num-draft-tokens $n"
    PORT=$((34000 + $$ % 1000))
    LASTSTAND_TEST_FORCE_IDS=1 LASTSTAND_SPEC_ADAPT=${MTP_ADAPT:-0} "$BIN" serve --model-path "$M" --device cuda \
        --port $PORT --max-running-requests 8 --cuda-graph-max-bs 8 $extra --log-level debug >"$OUT/server-$tag.log" 2>&1 &
    pid=$!
    for i in $(seq 240); do curl -s -o /dev/null "http://127.0.0.1:$PORT/health" && break; sleep 1; done
    echo "== $tag: num-draft-tokens $n (server up after $i s, $(( $(date +%s) - T0 )) s in)"
    if [ "$n" -gt 0 ]; then
        python3 bench/mtp_bench.py "http://127.0.0.1:$PORT" --forces "$OUT/forces.json" --reps ${REPS:-3} \
            --baseline "$OUT/plain.json" --k $((n - 1))
    else
        python3 bench/mtp_bench.py "http://127.0.0.1:$PORT" --forces "$OUT/forces.json" --reps ${REPS:-3} \
            --save "$OUT/plain.json"
    fi
    kill $pid; wait $pid
    grep -E "speculative decoding|MTP head passes|decode steps|CUDA graphs:" "$OUT/server-$tag.log" | cut -c1-220
}
serve plain 0
for n in ${MTP_N:-2 3 4}; do serve mtp$n $n; done
echo "done in $(( $(date +%s) - T0 )) s"
