"""A backend named on the command line that cannot run the model is refused at load, on a GPU;
skipped without one.

Pins (model.c check_named_backends, ops.h ops_sel_check_*):
- cuda_fused_decode does not take the tiny Qwen3.5 NVFP4 fixture's MoE shape (hidden 128, 8
  experts, expert size 48). Named for M <= 8 in a plan, it used to pass the load and fail the
  first decode step of `generate` ("moe backend 'cuda_fused_decode' does not take this shape");
  now `generate` exits 2 before any token, naming the flag, the plan, the layer, the M range and
  the backend's own reason;
- named alone, a backend that takes M <= 8 only is refused on the 35B shape it does take at
  small M (the prefill would reach it), naming M = 8192;
- the same flags left to auto (serve's fallback per call) and a plan whose entries all take the
  shape load and generate.
"""
import os
import subprocess

import pytest

from conftest import BIN, SHARED, requires_gpu


pytestmark = requires_gpu

FIXTURE = os.path.join(SHARED, "fixtures", "models", "qwen3_5_moe_text-nvfp4")


def generate(model, *flags, n=4):
    return subprocess.run([BIN, "generate", "--device", "cuda", "--model-path", model, "--ids", "1,2,3,4,5,6,7,8,9,10",
                           "--max-new-tokens", str(n), "--temperature", "0", *flags],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(not os.path.isdir(FIXTURE), reason="fixture models not staged")
def test_named_plan_that_cannot_run_the_model_is_refused_at_load():
    p = generate(FIXTURE, "--moe-runner-backend", "cuda_fused_decode:8,cuda_grouped_gemm")
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr
    assert "--moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm: layer 0" in err, err[-2000:]
    assert "moe backend 'cuda_fused_decode' (its entry for M 1..8) does not take this model's moe shape" in err
    assert "hidden 128, 8 experts" in err
    assert not p.stdout.strip(), p.stdout  # no token was generated


@pytest.mark.skipif(not os.path.isdir(FIXTURE), reason="fixture models not staged")
def test_plans_that_take_the_shape_and_auto_still_run():
    for flags in (("--moe-runner-backend", "cuda_grouped_gemm"),
                  ("--moe-runner-backend", "cuda_expert_loop:8,cuda_grouped_gemm"),
                  ("--moe-runner-backend", "auto")):
        p = generate(FIXTURE, *flags)
        assert p.returncode == 0, (flags, p.stderr[-2000:])
        assert p.stdout.strip(), flags


def test_backend_capped_in_M_named_alone_is_refused_naming_the_M():
    p = generate("synth:qwen3.5-35b-a3b,layers=2", "--moe-runner-backend", "cuda_fused_decode", n=1)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "--moe-runner-backend cuda_fused_decode: layer 0" in p.stderr, p.stderr[-2000:]
    assert "at M = 8192: the fused decode path takes M <= 8" in p.stderr
