"""The sampling-backend and CUDA-graph flags of `serve` and `generate` on the
CPU (the GPU side runs in bench/device/graph.sh): the flags are listed by
--help, the CPU refuses device sampling with a message naming the flag and
exits 2, a bad value exits 2, and --sampling-backend host / auto and
--disable-cuda-graph leave the CPU's greedy tokens exactly as before
(ref.json's greedy continuation of the fixture, written by transformers)."""
import json
import os

import pytest

from conftest import run_ls


def test_serve_help_lists_the_flags(ls_bin):
    p = run_ls("serve", "--help")
    assert p.returncode == 0
    for flag in ("--sampling-backend", "--disable-cuda-graph", "--cuda-graph-max-bs"):
        assert flag in p.stdout, flag


def test_generate_help_lists_the_flags(ls_bin):
    p = run_ls("generate", "--help")
    assert p.returncode == 0
    assert "--sampling-backend" in p.stdout and "--disable-cuda-graph" in p.stdout


@pytest.fixture(scope="module")
def fixture(shared_dir):
    d = os.path.join(shared_dir, "fixtures", "models", "qwen3_5_moe_text")
    return d, json.load(open(os.path.join(d, "ref.json")))


@pytest.mark.parametrize("flags", [[], ["--sampling-backend", "host"], ["--sampling-backend", "auto"],
                                   ["--disable-cuda-graph"]])
def test_cpu_greedy_unchanged_by_the_flags(fixture, flags):
    d, ref = fixture
    p = run_ls("generate", "--model-path", d, "--device", "cpu", "--ids", ",".join(map(str, ref["input_ids"])),
               "--max-new-tokens", "12", *flags)
    assert p.returncode == 0, p.stderr[-2000:]
    assert json.loads(p.stdout)["ids"] == ref["greedy"]
    assert "sampling on the host" in p.stderr


def test_cpu_refuses_device_sampling(fixture):
    d, ref = fixture
    p = run_ls("generate", "--model-path", d, "--device", "cpu", "--ids", "1,2,3", "--sampling-backend", "device")
    assert p.returncode == 2
    assert "--sampling-backend device" in p.stderr and "cpu" in p.stderr


def test_bad_sampling_backend_value_exits_2(fixture):
    d, _ = fixture
    p = run_ls("generate", "--model-path", d, "--device", "cpu", "--ids", "1,2,3", "--sampling-backend", "gpu")
    assert p.returncode == 2
    assert "--sampling-backend 'gpu'" in p.stderr
    p = run_ls("serve", "--model-path", d, "--device", "cpu", "--sampling-backend", "gpu")
    assert p.returncode == 2
    assert "sampling-backend" in p.stderr
