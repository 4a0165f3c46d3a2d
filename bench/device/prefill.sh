#!/usr/bin/env bash
# bench/device/prefill.sh: the prefill backends of the attention and gdn families
# (src/ops/cuda/attention_prefill.cu: cuda_flash_prefill; src/ops/cuda/gdn_chunked.cu:
# cuda_chunked, cuda_per_token) on a GPU machine, for the integrator's device rounds
# (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/prefill.sh BIN OUTDIR
#
# 1. `laststand doctor` on attention and gdn, the new backends next to the old ones
#    (cuda_flash_decode, cuda_naive; cuda_recurrent): Qwen3.5-397B shapes (head_dim 256,
#    16 q heads per kv head; 64 v heads, dk = dv = 128) and 35B shapes at
#    M = 1, 2, 16, 512, 3072 (decode rows and prefill chunks mixed, fp64 CPU reference),
#    attention at head_dim 128 (qwen3-30b-a3b), and the fixture model's own shapes
#    (qwen3_5_moe_text: head_dim 32, dk = dv = 32). The matrices (verdicts, times).
# 2. The fixture models (reads .dev/int/fixtures/models, copied from
#    ../shared/fixtures/models; head_dim 32, dk = dv = 32): `laststand logits --device cuda`
#    with --attention-backend cuda_flash_prefill and --gdn-backend cuda_chunked /
#    cuda_per_token against `--device cpu` (worst row of max|a-b|/max|b|, argmax
#    agreement), and 12 greedy tokens (decode rows, captured in CUDA graphs: device planning)
#    against the CPU's and against the same run without graphs.
# 3. compute-sanitizer memcheck of one fixture's logits with the new backends (if present).
# Everything is bounded by `timeout`; the whole script stays under 100 s.
set -u
BIN=${1:?usage: prefill.sh BIN OUTDIR}
OUT=${2:?usage: prefill.sh BIN OUTDIR}
FIX=${FIX:-.dev/int/fixtures/models}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
nvidia-smi -L 2>&1 | head -2
git log --oneline -1 2>/dev/null

doc() { # tag timeout args...
    local tag=$1 lim=$2
    shift 2
    echo "== doctor $tag"
    timeout "$lim" "$BIN" doctor --device cuda "$@" --json "$OUT/doctor-$tag.json" 2>"$OUT/doctor-$tag.err"
    echo "rc=$? ($(( $(date +%s) - T0 )) s)"
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor-$tag.err" | head -n 12
}
doc attn397 15 --families attention --shapes qwen3.5-397b-a17b --m 1,2,16,512,3072 \
    --backends cuda_flash_prefill,cuda_flash_decode
doc gdn397 18 --families gdn --shapes qwen3.5-397b-a17b --m 1,2,16,512,3072 \
    --backends cuda_chunked,cuda_per_token,cuda_recurrent
doc both35 16 --families attention,gdn --shapes qwen3.5-35b-a3b --m 1,2,16,512,3072 \
    --backends cuda_flash_prefill,cuda_flash_decode,cuda_chunked,cuda_per_token,cuda_recurrent
doc attn128 6 --families attention --shapes qwen3-30b-a3b --m 1,7,100,512 \
    --backends cuda_flash_prefill,cuda_flash_decode
[ -d "$FIX/qwen3_5_moe_text" ] && doc fixture 6 --families attention,gdn --model-path "$FIX/qwen3_5_moe_text" \
    --m 1,3,64,300 --backends cuda_flash_prefill,cuda_chunked,cuda_per_token

echo "== fixtures: logits and greedy tokens vs --device cpu"
timeout 20 python3 - "$BIN" "$FIX" "$OUT" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, FIX, OUT = sys.argv[1:4]
combos = (("flash_prefill+chunked", ["--attention-backend", "cuda_flash_prefill", "--gdn-backend", "cuda_chunked"]),
          ("flash_prefill+per_token", ["--attention-backend", "cuda_flash_prefill", "--gdn-backend", "cuda_per_token"]))
def run(args, t=10):
    try:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=t)
    except subprocess.TimeoutExpired:
        return None
for name in ("qwen3_5_moe_text", "qwen3_next", "qwen3_moe"):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        continue
    ref = json.load(open(os.path.join(d, "ref.json")))
    ids = ",".join(map(str, ref["input_ids"]))
    base = {}
    p = run(["logits", "--model-path", d, "--ids", ids, "--device", "cpu"])
    if p is None or p.returncode:
        print(f"{name:26s} cpu: {'TIMEOUT' if p is None else p.stderr.strip()[-300:]}"); continue
    cpu = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    p = run(["generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "12", "--device", "cpu"])
    gcpu = json.loads(p.stdout)["ids"] if p is not None and p.returncode == 0 else None
    for ci, (tag, extra) in enumerate(combos):
        p = run(["logits", "--model-path", d, "--ids", ids, "--device", "cuda", *extra])
        if p is None or p.returncode:
            print(f"{name:26s} {tag:24s} logits: {'TIMEOUT' if p is None else p.stderr.strip()[-300:]}"); continue
        x = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
        rel = float((np.abs(x - cpu).max(axis=1) / np.abs(cpu).max(axis=1)).max())
        agree = int((x.argmax(1) == cpu.argmax(1)).sum())
        p = run(["generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "12", "--device", "cuda", *extra]) if ci == 0 else None
        if ci > 0:
            gen = ""
        elif p is None or p.returncode:
            gen = "gen ERR " + ("TIMEOUT" if p is None else p.stderr.strip()[-200:])
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
                gen += " (no graphs: ERR " + ("TIMEOUT" if q is None else q.stderr.strip()[-200:]) + ")"
        print(f"{name:26s} {tag:24s} rel {rel:.2e}  argmax {agree}/{len(cpu)}  {gen}")
PY
echo "rc=$? ($(( $(date +%s) - T0 )) s)"

if command -v compute-sanitizer >/dev/null && [ -d "$FIX/qwen3_5_moe_text" ]; then
    echo "== compute-sanitizer memcheck: qwen3_5_moe_text logits, cuda_flash_prefill + cuda_chunked"
    ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$FIX/qwen3_5_moe_text/ref.json'))['input_ids'])))")
    timeout 10 compute-sanitizer --tool memcheck --print-limit 5 "$BIN" logits --model-path "$FIX/qwen3_5_moe_text" \
        --ids "$ids" --device cuda --attention-backend cuda_flash_prefill --gdn-backend cuda_chunked \
        >"$OUT/memcheck.out" 2>&1
    echo "rc=$?"; grep -E "ERROR SUMMARY|Invalid|out of bounds|rror" "$OUT/memcheck.out" | head -n 8
fi
if command -v ncu >/dev/null; then
    echo "== ncu: per-kernel times at M = 3072 (397B shapes), first launches of the correctness run"
    for fb in "attention cuda_flash_prefill fp_" "gdn cuda_chunked gc_"; do
        set -- $fb
        timeout 7 ncu --target-processes all --kernel-name "regex:$3" --launch-count 6 \
            --metrics gpu__time_duration.sum "$BIN" doctor --device cuda --families $1 --shapes qwen3.5-397b-a17b \
            --m 3072 --backends $2 --json "$OUT/ncu-$2.json" >"$OUT/ncu-$2.out" 2>&1
        echo "$2 rc=$?"; grep -E "^  [a-z_]+.*\(|gpu__time_duration|==ERROR|==WARNING" "$OUT/ncu-$2.out" | head -n 16
    done
fi
echo "total $(( $(date +%s) - T0 )) s"
