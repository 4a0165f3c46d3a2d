"""CUDA graphs of decode steps with tensor parallelism (`--tp 2 --device cuda`,
NCCL all-reduces captured inside every rank's graph); skipped without 2 GPUs.

Pins, on the BF16 fixtures qwen3_5_moe_text (GDN + MoE) and qwen3 (dense):
- the engine captures the decode buckets on every rank at start-up and its
  self-check (the batch-1 graph against eager steps) passes: the log says
  "captured on every tensor-parallel rank and checked against eager steps";
- `generate` greedy ids with graphs equal `--disable-cuda-graph` (eager TP
  steps) exactly, with the backends pinned as bench/device/graph.sh pins them
  (so eager and captured steps run the same kernels);
- the decode steps were really replayed: the shutdown line counts at least one
  replayed step per generated token after the first (the self-check's 6 more).
The GPU-machine script bench/device/tpgraph.sh runs the same and more (synth
35B, --tp 1, serve with concurrent requests, step times).
"""
import json
import os
import re
import shutil
import subprocess

import pytest

from conftest import run_ls


def _gpus():
    if not shutil.which("nvidia-smi"):
        return 0
    try:
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for l in p.stdout.splitlines() if l.startswith("GPU ")) if p.returncode == 0 else 0


pytestmark = pytest.mark.skipif(_gpus() < 2, reason="needs 2 NVIDIA GPUs")

PIN_MOE = ["--moe-runner-backend", "cuda_grouped_gemm", "--attention-backend", "cuda_flash_decode",
           "--gdn-backend", "cuda_recurrent"]
PIN_DENSE = ["--attention-backend", "cuda_flash_decode"]
N_NEW = 16


def generate(model_dir, ids, *flags):
    p = run_ls("generate", "--model-path", model_dir, "--device", "cuda", "--tp", "2", "--ids",
               ",".join(map(str, ids)), "--max-new-tokens", N_NEW, *flags, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)["ids"], p.stderr


@pytest.mark.parametrize("model,pin", [("qwen3_5_moe_text", PIN_MOE), ("qwen3", PIN_DENSE)])
def test_tp2_graphs_replay_and_equal_eager(shared_dir, model, pin):
    d = os.path.join(shared_dir, "fixtures", "models", model)
    ids = json.load(open(os.path.join(d, "ref.json")))["input_ids"]
    eager, elog = generate(d, ids, "--disable-cuda-graph", *pin)
    graph, glog = generate(d, ids, *pin)
    assert "captured on every tensor-parallel rank and checked against eager steps" in glog, glog[-3000:]
    m = re.search(r"CUDA graphs: (\d+) steps replayed", glog)
    assert m and int(m.group(1)) >= N_NEW - 1 + 6, glog[-3000:]
    assert graph == eager, f"graph {graph}\neager {eager}\n{glog[-2000:]}"
