#!/usr/bin/env bash
# bench/gpu_forward_check.sh: the CUDA forward pass against the CPU one (and
# against transformers' ref.json) on the fixture models, on a GPU machine.
#
# For every folder of FIXTURES with a ref.json:
#   `laststand logits --device cuda` and `--device cpu` on ref.json's input_ids:
#   per model the worst row of max|cuda-cpu|/max|cpu| (BF16 activations: expect
#   ~1e-2), the same against transformers' logits, and the argmax agreement;
#   `laststand generate --ids ... --device cuda` greedy continuation vs the CPU's
#   and ref.json's "greedy" (how many leading tokens agree).
# With TP=N (N GPUs): also `logits --device cuda --tp N` against --tp 1 on CUDA
# (rel_tp column; models whose heads/intermediate sizes do not split are marked).
# Writes OUT/gpu_forward.txt (the table) and OUT/gpu_forward.json; prints the table.
# Exit: 0 when every model ran on both devices, 1 otherwise (the numbers are the verdict).
#
# usage: bench/gpu_forward_check.sh [BIN] [FIXTURES] [OUT]
#   defaults: build/laststand  ../shared/fixtures/models  /tmp/gpu_forward_check
# On the device tool (one call): copy build-cuda/laststand, build/*.so* and the
# fixtures into .dev/gpufwd/, carry [".dev/gpufwd"], and run
#   bash .dev/gpufwd/gpu_forward_check.sh .dev/gpufwd/laststand .dev/gpufwd/fixtures $OUT
set -u
BIN=${1:-build/laststand}
FIX=${2:-../shared/fixtures/models}
OUT=${3:-/tmp/gpu_forward_check}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
(nvidia-smi -L; "$BIN" --help 2>&1 | head -1) > "$OUT/gpu_info.txt" 2>&1
python3 - "$BIN" "$FIX" "$OUT" <<'PY'
import json, os, subprocess, sys, time
import numpy as np
BIN, FIX, OUT = sys.argv[1:4]
rows, ok = [], True

def run(*args, timeout=120):
    t = time.time()
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return p, time.time() - t

def rel(a, b):
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())

for name in sorted(os.listdir(FIX)):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        continue
    ref = json.load(open(os.path.join(d, "ref.json")))
    ids = ",".join(map(str, ref["input_ids"]))
    r = {"model": name, "n_tok": len(ref["input_ids"])}
    lg = {}
    for dev in ("cpu", "cuda"):
        p, dt = run("logits", "--model-path", d, "--ids", ids, "--device", dev)
        r[f"logits_{dev}_s"] = round(dt, 2)
        if p.returncode:
            r[f"error_{dev}"] = p.stderr.strip()[-600:]
            ok = False
            continue
        lg[dev] = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    tp = int(os.environ.get("TP", "1"))
    if tp > 1 and "cuda" in lg:
        p, dt = run("logits", "--model-path", d, "--ids", ids, "--device", "cuda", "--tp", tp)
        if p.returncode == 0:
            r["rel_tp"] = rel(np.array(json.loads(p.stdout)["logits"], dtype=np.float64), lg["cuda"])
        else:
            r["rel_tp"] = "refused" if p.returncode == 2 else "ERR"
            r["error_tp"] = p.stderr.strip()[-600:]
    hf = np.array(ref["logits"], dtype=np.float64)
    if "cuda" in lg and "cpu" in lg:
        r["rel_cuda_cpu"] = rel(lg["cuda"], lg["cpu"])
        r["rel_cuda_hf"] = rel(lg["cuda"], hf)
        r["rel_cpu_hf"] = rel(lg["cpu"], hf)
        r["argmax_agree"] = f'{int((lg["cuda"].argmax(1) == lg["cpu"].argmax(1)).sum())}/{len(hf)}'
    if "greedy" in ref:
        g = {}
        for dev in ("cpu", "cuda"):
            p, _ = run("generate", "--model-path", d, "--ids", ids, "--max-new-tokens", len(ref["greedy"]),
                       "--device", dev)
            if p.returncode == 0:
                g[dev] = json.loads(p.stdout)["ids"]
            else:
                r[f"gen_error_{dev}"] = p.stderr.strip()[-600:]
                ok = False
        def lead(a, b):
            n = 0
            while n < min(len(a), len(b)) and a[n] == b[n]:
                n += 1
            return n
        if "cuda" in g:
            r["greedy_cuda_vs_hf"] = f'{lead(g["cuda"], ref["greedy"])}/{len(ref["greedy"])}'
            if "cpu" in g:
                r["greedy_cuda_vs_cpu"] = f'{lead(g["cuda"], g["cpu"])}/{len(ref["greedy"])}'
    rows.append(r)
    print(json.dumps(r), flush=True)

cols = ["model", "rel_cuda_cpu", "rel_cuda_hf", "rel_cpu_hf", "argmax_agree", "greedy_cuda_vs_cpu",
        "greedy_cuda_vs_hf", "logits_cuda_s"] + (["rel_tp"] if int(os.environ.get("TP", "1")) > 1 else [])
lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
for r in rows:
    cells = []
    for c in cols:
        v = r.get(c, "ERR" if c != "model" else "")
        cells.append(f"{v:.3g}" if isinstance(v, float) else str(v))
    lines.append("| " + " | ".join(cells) + " |")
table = "\n".join(lines)
print(table)
open(os.path.join(OUT, "gpu_forward.txt"), "w").write(table + "\n")
json.dump(rows, open(os.path.join(OUT, "gpu_forward.json"), "w"), indent=1)
sys.exit(0 if ok else 1)
PY
