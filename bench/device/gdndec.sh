#!/usr/bin/env bash
# bench/device/gdndec.sh: the gdn decode backend cuda_decode (src/ops/cuda/gdn_decode.cu: one
# launch, conv + norms + g/β + delta rule, a warp per 16 value columns of a head, a k head's
# blocks one thread block cluster) next to cuda_recurrent, cuda_per_token and cuda_chunked, on a
# GPU machine, for the integrator's device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/gdndec.sh BIN OUTDIR
#
# 1. `laststand doctor --families gdn` at Qwen3.5-397B shapes (16 k heads / 64 v heads,
#    dk = dv = 128, conv 4) and 35B shapes (16 / 32), M = 1, 2, 4, 8, 16, 64, 512 (decode rows
#    and prefill chunks mixed, random slots and states, fp64 CPU reference on outputs and final
#    conv + recurrent states): verdicts and times. (cuda_decode hands a call with a sequence of
#    more than 64 new tokens to cuda_chunked; "raw397" shows its own kernel there, with
#    LASTSTAND_GDN_DECODE_MAX_NEW=0.)
# 2. The fixture model's own shapes (qwen3_5_moe_text: dk = dv = 32, 2 k / 4 v heads; reads
#    .dev/int/fixtures/models, copied from ../shared/fixtures/models): doctor cells, then
#    `laststand logits --gdn-backend cuda_decode` against `--device cpu` and 12 greedy tokens
#    (decode rows captured in CUDA graphs) against the CPU's and against no graphs.
# 3. compute-sanitizer memcheck and racecheck of one fixture's greedy run with cuda_decode.
# 4. ncu: kernel times at M = 1, 4, 16 (397B) of cuda_decode's gd_kernel, and cuda_recurrent's two
#    kernels at M = 4.
# Everything is bounded by `timeout`; the whole script stays under 100 s.
. "$(dirname "$0")/lib.sh"
dev_init gdndec 100 "$@"
FIX=${FIX:-.dev/int/fixtures/models}

doc() { # tag timeout args...
    local tag=$1 lim=$2
    shift 2
    echo "== doctor $tag"
    timeout "$lim" "$BIN" doctor --device cuda "$@" --json "$OUT/doctor-$tag.json" 2>"$OUT/doctor-$tag.err"
    echo "rc=$? $(el)"
    grep -iE "crash|error|wrong|timeout|unsupported" "$OUT/doctor-$tag.err" | head -n 12
}
doc gdn397 30 --families gdn --shapes qwen3.5-397b-a17b --m 1,2,4,8,16,64,512 \
    --backends cuda_decode,cuda_recurrent,cuda_per_token,cuda_chunked
doc gdn35 22 --families gdn --shapes qwen3.5-35b-a3b --m 1,2,4,8,16,64,512 \
    --backends cuda_decode,cuda_recurrent,cuda_chunked
# cuda_decode's own kernel on long prompt chunks (no hand-over to cuda_chunked)
LASTSTAND_GDN_DECODE_MAX_NEW=0 doc raw397 15 --families gdn --shapes qwen3.5-397b-a17b --m 16,64,512 \
    --backends cuda_decode
[ -d "$FIX/qwen3_5_moe_text" ] && doc fixture 6 --families gdn --model-path "$FIX/qwen3_5_moe_text" \
    --m 1,2,3,16,64,300 --backends cuda_decode,cuda_recurrent

echo "== fixtures: logits and greedy tokens vs --device cpu (--gdn-backend cuda_decode)"
timeout 20 python3 - "$BIN" "$FIX" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, FIX = sys.argv[1:3]
def run(args, t=8):
    try:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=t)
    except subprocess.TimeoutExpired:
        return None
def err(p):
    return "TIMEOUT" if p is None else p.stderr.strip()[-300:]
for name in ("qwen3_5_moe_text", "qwen3_next"):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        continue
    ref = json.load(open(os.path.join(d, "ref.json")))
    ids = ",".join(map(str, ref["input_ids"]))
    p = run(["logits", "--model-path", d, "--ids", ids, "--device", "cpu"])
    if p is None or p.returncode:
        print(f"{name:18s} cpu: {err(p)}"); continue
    cpu = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    p = run(["generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "12", "--device", "cpu"])
    gcpu = json.loads(p.stdout)["ids"] if p is not None and p.returncode == 0 else None
    for gdn in ("cuda_recurrent", "cuda_decode"):
        extra = ["--gdn-backend", gdn]
        p = run(["logits", "--model-path", d, "--ids", ids, "--device", "cuda", *extra])
        if p is None or p.returncode:
            print(f"{name:18s} {gdn:15s} logits: {err(p)}"); continue
        x = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
        rel = float((np.abs(x - cpu).max(axis=1) / np.abs(cpu).max(axis=1)).max())
        agree = int((x.argmax(1) == cpu.argmax(1)).sum())
        p = run(["generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "12", "--device", "cuda", *extra])
        if p is None or p.returncode:
            gen = "gen ERR " + err(p)
        else:
            g = json.loads(p.stdout)["ids"]
            n = 0
            while gcpu and n < min(len(g), len(gcpu)) and g[n] == gcpu[n]:
                n += 1
            gen = f"greedy {n}/12 same as cpu"
            q = run(["generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "12", "--device", "cuda",
                     "--disable-cuda-graph", *extra])
            if q is not None and q.returncode == 0:
                gen += " (no graphs: " + ("same" if json.loads(q.stdout)["ids"] == g else "DIFFERENT") + ")"
            else:
                gen += " (no graphs: ERR " + err(q) + ")"
        print(f"{name:18s} {gdn:15s} rel {rel:.2e}  argmax {agree}/{len(cpu)}  {gen}")
PY
echo "rc=$? $(el)"

if command -v compute-sanitizer >/dev/null && [ -d "$FIX/qwen3_5_moe_text" ]; then
    ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$FIX/qwen3_5_moe_text/ref.json'))['input_ids'])))")
    for tool in memcheck racecheck; do
        echo "== compute-sanitizer $tool: qwen3_5_moe_text generate 2 tokens, --gdn-backend cuda_decode"
        timeout 20 compute-sanitizer --tool $tool --print-limit 5 "$BIN" generate --model-path "$FIX/qwen3_5_moe_text" \
            --ids "$ids" --max-new-tokens 2 --device cuda --disable-cuda-graph --gdn-backend cuda_decode \
            >"$OUT/$tool.out" 2>&1
        echo "rc=$?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|out of bounds|hazard|rror" "$OUT/$tool.out" | head -n 8
    done
fi
if command -v ncu >/dev/null; then
    echo "== ncu --clock-control none: kernel times, 397B shapes (first launches of the doctor's runs)"
    for mb in "1 cuda_decode gd_" "4 cuda_decode gd_" "16 cuda_decode gd_" "4 cuda_recurrent gdn_"; do
        set -- $mb
        timeout 8 ncu --clock-control none --target-processes all --kernel-name "regex:$3" --launch-count 6 \
            --metrics gpu__time_duration.sum,dram__bytes.sum,launch__registers_per_thread "$BIN" doctor --device cuda \
            --families gdn --shapes qwen3.5-397b-a17b --m "$1" --backends "$2" --json "$OUT/ncu-$2-$1.json" \
            >"$OUT/ncu-$2-$1.out" 2>&1
        echo "M=$1 $2 rc=$?"; grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|dram__bytes|registers|==ERROR" "$OUT/ncu-$2-$1.out" | head -n 16
    done
fi
echo "total $(( $(date +%s) - T0 )) s"
