"""The gdn decode backend cuda_decode (src/ops/cuda/gdn_decode.cu) on a GPU; skipped without one.

Pins:
- the doctor's verdict against the fp64 CPU reference is "ok" at every bucket (decode rows and
  prefill chunks mixed, random state slots and starting states; outputs and the final conv and
  recurrent states compared) at the Qwen3.5-397B GDN shapes (16 k / 64 v heads, dk = dv = 128:
  4 warps per block, clusters of 8) and 35B (16 / 32: 1 warp per block), with the kernel taking
  every chunk itself (LASTSTAND_GDN_DECODE_MAX_NEW=0: groups of 8 tokens, partial last groups),
  and at the fixture model's own shapes (dk = dv = 32, 2 k / 4 v heads: clusters of 4);
- `logits` with cuda_decode on the Qwen3.5 and Qwen3-Next fixtures is no further from the CPU's
  than with cuda_recurrent (1.5x + 2e-3: the fixtures amplify BF16 rounding, see
  test_gpu_prefill.py), and 8 greedy tokens are the same with and without CUDA graphs (the
  cluster launch captured).
"""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import BIN, run_ls, requires_gpu


pytestmark = requires_gpu

MS = [1, 2, 4, 8, 16, 64, 512]


def _doctor_cells(tmp_path, env_extra, *args):
    out = tmp_path / "doctor-gdn.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), **env_extra)
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--families", "gdn", "--backends", "cuda_decode",
                        "--json", str(out), *map(str, args)], capture_output=True, text=True, env=env, timeout=300)
    assert out.exists(), f"doctor wrote no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    tabs = [t for t in json.load(open(out))["tables"] if t["family"] == "gdn"]
    assert len(tabs) == 1, p.stdout
    return tabs[0]["cells"]["cuda_decode"], p.stdout


def _assert_all_ok(cells, table, ms):
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"cuda_decode: {bad}\n{table}"
    assert sorted(map(int, cells)) == ms


@pytest.mark.parametrize("max_new", ["0", ""])
@pytest.mark.parametrize("shapes", ["qwen3.5-397b-a17b", "qwen3.5-35b-a3b"])
def test_decode_right_at_every_bucket(tmp_path, shapes, max_new):
    env = {"LASTSTAND_GDN_DECODE_MAX_NEW": max_new} if max_new else {}
    cells, table = _doctor_cells(tmp_path, env, "--shapes", shapes, "--m", ",".join(map(str, MS)))
    _assert_all_ok(cells, table, MS)


def _fixture(shared_dir, name):
    model = os.path.join(shared_dir, "fixtures", "models", name)
    ref = os.path.join(model, "ref.json")
    if not os.path.exists(ref):
        pytest.skip(f"{ref} missing")
    return model, ",".join(map(str, json.load(open(ref))["input_ids"]))


def test_decode_right_at_the_fixture_shapes(tmp_path, shared_dir):
    model, _ = _fixture(shared_dir, "qwen3_5_moe_text")
    ms = [1, 2, 3, 16, 64, 300]
    cells, table = _doctor_cells(tmp_path, {"LASTSTAND_GDN_DECODE_MAX_NEW": "0"}, "--model-path", model,
                                 "--m", ",".join(map(str, ms)))
    _assert_all_ok(cells, table, ms)


def _logits(model, ids, *extra):
    p = run_ls("logits", "--model-path", model, "--ids", ids, *extra, check=True, timeout=300)
    return np.array(json.loads(p.stdout)["logits"], dtype=np.float64)


def _rel(a, b):
    return float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())


@pytest.mark.parametrize("name", ["qwen3_5_moe_text", "qwen3_next"])
def test_decode_logits_no_further_from_the_cpu_than_cuda_recurrent(shared_dir, name):
    model, ids = _fixture(shared_dir, name)
    cpu = _logits(model, ids, "--device", "cpu")
    base = _rel(_logits(model, ids, "--device", "cuda", "--gdn-backend", "cuda_recurrent"), cpu)
    new = _rel(_logits(model, ids, "--device", "cuda", "--gdn-backend", "cuda_decode"), cpu)
    assert new <= 1.5 * base + 2e-3, f"cuda_decode: {new:.3e} from the CPU, cuda_recurrent {base:.3e}"


def test_decode_greedy_same_with_and_without_graphs(shared_dir):
    model, ids = _fixture(shared_dir, "qwen3_5_moe_text")
    gen = ["generate", "--model-path", model, "--ids", ids, "--max-new-tokens", "8", "--device", "cuda",
           "--gdn-backend", "cuda_decode"]
    a = json.loads(run_ls(*gen, check=True, timeout=300).stdout)["ids"]
    b = json.loads(run_ls(*gen, "--disable-cuda-graph", check=True, timeout=300).stdout)["ids"]
    assert a and a == b
