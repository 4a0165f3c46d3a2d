#!/usr/bin/env bash
# bench/device/tied.sh BIN OUTDIR: the tied-embedding oracle fixtures (task cleanup, device round R1).
# device-limit: 60
#
# 1. bench/tied/gen_tied.py OUTDIR: transformers builds tiny random Qwen3 (dense) and Qwen3-MoE with
#    tie_word_embeddings=True, save_pretrained (no lm_head.weight on disk), ref.json in the format
#    of ../shared/fixtures/models. OUTDIR then holds only qwen3-tied/ and qwen3_moe-tied/ (the files
#    the integrator copies into tests/fixtures/); logs go to stdout.
# 2. A first look, against that ref.json: `BIN logits --device cpu` and `--device cuda` with each
#    lm_head backend (auto, cuda_gemv, cuda_cublaslt, cuda_ref), worst row max|a-b|/max|b|, argmax;
#    `BIN generate` greedy against ref "greedy". Reads nothing from ../shared.
set -u
BIN=${1:?usage: tied.sh BIN OUTDIR}
OUT=${2:?usage: tied.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
T0=$(date +%s)
nvidia-smi -L 2>&1 | head -1
git log --oneline -1 2>/dev/null
echo "== gen_tied.py"
timeout 40 python3 bench/tied/gen_tied.py "$OUT" 5 2>&1 | grep -v -i "warn" | tail -60
echo "rc=${PIPESTATUS[0]} ($(( $(date +%s) - T0 )) s)"
ls -la "$OUT"/*-tied 2>&1
echo "== laststand against ref.json"
timeout $(( 58 - ($(date +%s) - T0) )) python3 - "$BIN" "$OUT" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, OUT = sys.argv[1:3]
for name in ("qwen3-tied", "qwen3_moe-tied"):
    d = os.path.join(OUT, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        print(name, "no ref.json"); continue
    ref = json.load(open(os.path.join(d, "ref.json")))
    b = np.array(ref["logits"], dtype=np.float64)
    ids = ",".join(map(str, ref["input_ids"]))
    top2 = np.sort(b, axis=1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) > 0.05
    runs = [("cpu", ["--device", "cpu"]), ("cuda auto", ["--device", "cuda"])]
    runs += [("cuda " + x, ["--device", "cuda", "--lm-head-backend", x])
             for x in ("cuda_gemv", "cuda_cublaslt", "cuda_ref", "cuda_gemv:8,cuda_cublaslt")]
    for tag, extra in runs:
        try:
            p = subprocess.run([BIN, "logits", "--model-path", d, "--ids", ids, *extra],
                               capture_output=True, text=True, timeout=15)
        except subprocess.TimeoutExpired:
            print(f"{name:15s} {tag:28s} TIMEOUT"); continue
        if p.returncode:
            print(f"{name:15s} {tag:28s} rc={p.returncode} {p.stderr.strip()[-600:]}"); continue
        a = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
        if a.shape != b.shape:
            print(f"{name:15s} {tag:28s} shape {a.shape} vs {b.shape}"); continue
        rel = np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)
        ag = a.argmax(1) == b.argmax(1)
        print(f"{name:15s} {tag:28s} worst rel {rel.max():.3e} (row {rel.argmax()})  argmax {ag.sum()}/{len(ag)}"
              f"  (margin>0.05: {ag[sure].sum()}/{sure.sum()})  nan={int(np.isnan(a).sum())}")
    for dev in ("cpu", "cuda"):
        try:
            p = subprocess.run([BIN, "generate", "--model-path", d, "--ids", ids, "--device", dev,
                                "--max-new-tokens", str(len(ref["greedy"]))],
                               capture_output=True, text=True, timeout=15)
        except subprocess.TimeoutExpired:
            print(f"{name:15s} generate {dev}: TIMEOUT"); continue
        if p.returncode:
            print(f"{name:15s} generate {dev}: rc={p.returncode} {p.stderr.strip()[-600:]}"); continue
        got = json.loads(p.stdout)["ids"]
        same = sum(x == y for x, y in zip(got, ref["greedy"]))
        print(f"{name:15s} generate {dev:4s} {same}/{len(ref['greedy'])} equal  got {got}  ref {ref['greedy']}")
PY
echo "total $(( $(date +%s) - T0 )) s"
