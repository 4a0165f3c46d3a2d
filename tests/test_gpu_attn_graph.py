"""CUDA-graph replay of decode steps gives the eager steps' tokens with every attention backend;
skipped without an NVIDIA GPU.

Pins (src/ops/cuda/attention_prefill.cu's row plan): `generate` greedy on
synth:qwen3.5-35b-a3b,layers=4 (random weights: near-flat logits, so greedy ids flip on any
last-bit difference of a step), 136 new tokens, decode steps replayed from CUDA graphs equal
`--disable-cuda-graph` (eager steps) on every token, with `--attention-backend` auto (the
registry's first, cuda_flash_prefill) and cuda_flash_decode pinned. Before
the row plan, cuda_flash_prefill split a decode row's keys by a count planned from the batch
(eager) or from the context cap (capture), so the two rounded differently: 19 of 136 tokens
equal. The op-level twin (graph replay at contexts other than the captured ones, bits and an fp64
reference) is the cmocka test tests/unit/test_attn_cuda.c.
"""
import json
import subprocess

import numpy as np
import pytest

from conftest import BIN, requires_gpu


pytestmark = requires_gpu

SYN = "synth:qwen3.5-35b-a3b,layers=4"
IDS = ",".join(str(int(x)) for x in np.random.default_rng(9).integers(3, 248000, size=32))


def generate(*flags):
    """Starts a generate run; returns the Popen (graph and eager runs go side by side)."""
    return subprocess.Popen([BIN, "generate", "--model-path", SYN, "--device", "cuda", "--ids", IDS,
                             "--max-new-tokens", "136", "--sampling-backend", "device", *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(p):
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-2000:]
    return json.loads(out)["ids"], err


@pytest.mark.parametrize("attn", ["auto", "cuda_flash_decode"])
def test_graph_replay_gives_the_eager_tokens(attn):
    pin = [] if attn == "auto" else ["--attention-backend", attn]
    pg, pe = generate(*pin), generate(*pin, "--disable-cuda-graph")
    (graph, log), (eager, _) = result(pg), result(pe)
    assert "CUDA graphs captured and checked against eager steps" in log, log[-2000:]
    assert len(graph) == len(eager) == 136
    first = next((i for i, (a, b) in enumerate(zip(graph, eager)) if a != b), None)
    assert first is None, (f"{attn}: graph and eager differ from token {first} on "
                           f"({sum(a == b for a, b in zip(graph, eager))}/136 equal)")
