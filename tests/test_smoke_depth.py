"""serve's smoke test runs the model cut to its first model_smoke_depth() layers (DESIGN.md
section 4; src/cli/serve_auto.c): 2 layers of every layer kind, then the final norm and lm_head.

Pinned behaviour, on the CPU:
- the smoke child (`serve --smoke-trial --smoke-layers auto`) runs exactly the first D layers:
  its logits equal `laststand logits` on a model that has only those layers (synth `layers=D`,
  the same weights; a fixture folder whose config.json says num_hidden_layers=D), and differ
  from the uncut model's;
- D is 8 of 10 for a hybrid (3 GDN + 1 attention) model, 2 of 4 for dense / MoE fixtures,
  and the whole model when it is no deeper (the 4-layer hybrid fixtures);
- serve logs which depth ran, and a broken backend is still caught at that depth.
"""
import json
import os
import struct
import subprocess

import numpy as np
import pytest

from conftest import BIN
from e2e_util import Server

IDS = [5, 17, 99, 3, 250, 41, 7, 1000, 12, 64, 300, 8]
L, S = 9, 3  # prompt tokens, then 3 steps (the last 2 teacher-forced decode rows)


def smoke_child(model, tmp_path, *extra):
    out = tmp_path / "smoke.bin"
    ids = ",".join(map(str, IDS[:L + S - 1]))
    r = subprocess.run([BIN, "serve", "--smoke-trial", "--model-path", model, "--device", "cpu",
                        "--smoke-ids", ids, "--smoke-prompt-len", str(L), "--smoke-steps", str(S),
                        "--smoke-out", str(out), *extra], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    d = out.read_bytes()
    V, l, s, layers, ckpt = struct.unpack("<5i", d[:20])
    assert (l, s) == (L, S)
    rows = np.frombuffer(d[20 + 4 * (L + S):], dtype=np.float32).reshape(S, V)
    return layers, ckpt, rows


def logits(model):
    ids = ",".join(map(str, IDS[:L + S - 1]))
    r = subprocess.run([BIN, "logits", "--model-path", model, "--ids", ids, "--device", "cpu"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return np.array(json.loads(r.stdout)["logits"], dtype=np.float32)[L - 1:L + S - 1]


def rel(a, b):
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


def test_hybrid_child_runs_the_first_8_of_10_layers_exactly(tmp_path):
    layers, ckpt, rows = smoke_child("synth:demo,layers=10", tmp_path, "--smoke-layers", "auto")
    assert (layers, ckpt) == (8, 10)
    assert rel(rows, logits("synth:demo,layers=8")) < 1e-4      # the cut model
    assert rel(rows, logits("synth:demo,layers=10")) > 1e-2     # not the whole one


def cut_folder(src, dst, n):
    """src with config.json saying n layers (the same safetensors): the oracle of a cut."""
    os.makedirs(dst)
    for f in os.listdir(src):
        if f != "config.json":
            os.symlink(os.path.join(src, f), os.path.join(dst, f))
    c = json.load(open(os.path.join(src, "config.json")))
    t = c.get("text_config", c)
    t["num_hidden_layers"] = n
    if "layer_types" in t:
        t["layer_types"] = t["layer_types"][:n]
    json.dump(c, open(os.path.join(dst, "config.json"), "w"))
    return dst


@pytest.mark.parametrize("name,depth", [("qwen3", 2), ("qwen3_moe", 2), ("qwen3_moe-nvfp4", 2),
                                        ("qwen3_next", 4), ("qwen3_5_moe_text-nvfp4", 4)])
def test_folder_child_runs_the_first_d_layers_exactly(shared_dir, tmp_path, name, depth):
    src = os.path.join(shared_dir, "fixtures", "models", name)
    layers, ckpt, rows = smoke_child(src, tmp_path, "--smoke-layers", "auto")
    assert (layers, ckpt) == (depth, 4)
    if depth < 4:
        assert rel(rows, logits(cut_folder(src, str(tmp_path / "cut"), depth))) < 1e-4
        assert rel(rows, logits(src)) > 1e-2
    else:
        assert rel(rows, logits(src)) < 1e-4


def test_tp_child_runs_the_same_cut(shared_dir, tmp_path):
    src = os.path.join(shared_dir, "fixtures", "models", "qwen3_moe")
    _, _, one = smoke_child(src, tmp_path, "--smoke-layers", "auto")
    layers, ckpt, two = smoke_child(src, tmp_path, "--smoke-layers", "auto", "--tp", "2")
    assert (layers, ckpt) == (2, 4)
    assert rel(two, one) < 1e-4


def test_serve_logs_the_depth_and_passes(ls_bin, tmp_path):
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    with Server(ls_bin, "synth:demo,layers=10", "--device", "cpu", env=env) as s:
        log = s.log_text()
    assert "smoke test: the first 8 of 10 layers (2 of each layer kind" in log, log
    assert "the first 8 of 10 layers (2 of each layer kind, then the final norm and lm_head): the tokens equal" in log


def test_serve_logs_2_of_4_for_a_moe_folder(ls_bin, shared_dir, tmp_path):
    src = os.path.join(shared_dir, "fixtures", "models", "qwen3_moe")
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    with Server(ls_bin, src, "--device", "cpu", "--doctor-buckets", "1", env=env) as s:
        log = s.log_text()
    assert "smoke test: the first 2 of 4 layers (2 of each layer kind" in log, log


@pytest.mark.parametrize("bad,why", [("cpu_broken_nan", "wrong: .*NaN"), ("cpu_broken_abort", "crash")])
def test_broken_backend_is_still_caught_at_depth_8(tmp_path, bad, why):
    import re
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path), LASTSTAND_TEST_BROKEN_BACKENDS="1")
    r = subprocess.run([BIN, "serve", "--model-path", "synth:demo,layers=10", "--device", "cpu", "--port", "1",
                        "--moe-runner-backend", bad], capture_output=True, text=True, env=env, timeout=120)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out[-3000:]
    assert "smoke test: the first 8 of 10 layers" in out, out[-3000:]
    assert re.search(f"--moe-runner-backend {bad} refused: the smoke test found it {why}", out), out[-3000:]
