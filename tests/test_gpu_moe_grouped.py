"""The cuda_grouped_gemm moe backend (src/ops/cuda/moe_grouped.cu, its mid-batch path in moe_mid.cu)
on a GPU; skipped without one.

Pins:
- the doctor's verdict against the fp64 CPU reference is "ok" at every batch bucket of the
  Qwen3.5-35B MoE layer shape (NVFP4 experts, shared expert), including batches that leave
  partial tiles (M = 3, 100) and all three tile heights (the routed experts average M·8/256
  rows: 16-row tiles below 12, 32-row tiles below 28, else 64: M <= 100, 512 and 1024 here);
- BF16 experts (the doctor on the BF16 fixture's MoE shape, I = 48: a K tail inside one 64-wide
  block);
- a BF16 shared expert next to NVFP4 experts (synth:qwen3.5-35b-a3b: its GEMMs are separate
  launches) is right with every batched-decode variant of moe_grouped.cu's knobs: the default
  (the mid-batch path at 16-row tiles up to 8 rows per expert, bit-placement decode, the shared
  expert on a side stream), the R3 default (SIDE=0, perm), place32 (the decode at 32-row tiles,
  M = 512), place3 (3 CTAs per SM), the grouped GEMM at 16-row tiles (LASTSTAND_MG_MID=0), the
  mid-batch path at every 16-row tile size with gate/up at one barrier (mid-lean) and with its
  other down instance, the old router and top-k (mid-alt), the down's weights fetched
  before its wait (mid-dnearly: LASTSTAND_MG_DNEARLY=1), and with gate/up at 4 blocks an SM
  (mid-gu4: LASTSTAND_MG_MIDGU=2);
- the BF16 shared expert forked before the router (LASTSTAND_MG_SHEARLY, the default: its own
  h buffer, tiles of 16 tokens in order) is right at partial tiles (M = 9, 33, 100) and gives the
  same logits as the shared expert forked after the plan (SHEARLY=0) bit for bit, one forward of
  20 and of 37 rows, and the same greedy ids of 20 sequences decoded from CUDA graphs;
- the mid-batch GEMVs with an NVFP4 shared expert in the same launch (the presets: full
  16-slot tiles), partial tiles and both Qwen3.5 layer shapes;
- on the Qwen3-MoE BF16 fixture (no shared expert), `logits --moe-runner-backend
  cuda_grouped_gemm` agrees with the CPU forward pass within issue 5's bar (max |a - b| / max |b|
  <= 2e-2 on every row, same argmax where the CPU's top-2 margin exceeds 0.05). The other
  fixtures are not held to that bar: their CUDA forward passes are as far from the CPU with
  every moe backend (BF16 rounding amplified by tiny random weights; bench/RESULTS.md); the
  doctor pins the NVFP4 experts instead.
"""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import BIN, run_ls, requires_gpu

BACKEND = "cuda_grouped_gemm"



pytestmark = requires_gpu


def doctor_cells(tmp_path, *args, env_extra=None):
    out = tmp_path / "doctor.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), **(env_extra or {}))
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--families", "moe", "--backends", BACKEND,
                        "--json", str(out), *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert out.exists(), f"doctor wrote no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    tabs = [t for t in json.load(open(out))["tables"] if t["family"] == "moe"]
    assert len(tabs) == 1, p.stdout
    return tabs[0]["cells"][BACKEND], p.stdout


def test_grouped_gemm_right_at_every_bucket_of_the_35b_layer(tmp_path):
    ms = [1, 3, 8, 64, 100, 512, 1024]
    cells, table = doctor_cells(tmp_path, "--shapes", "qwen3.5-35b-a3b", "--m", ",".join(map(str, ms)))
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"
    assert sorted(map(int, cells)) == ms


@pytest.mark.parametrize("knobs", [{}, {"LASTSTAND_MG_SIDE": "0", "LASTSTAND_MG_DECODE": "perm"},
                                   {"LASTSTAND_MG_DECODE": "place32"}, {"LASTSTAND_MG_DECODE": "place3"},
                                   {"LASTSTAND_MG_MID": "0"}, {"LASTSTAND_MG_MID": "1"},
                                   {"LASTSTAND_MG_MID": "1", "LASTSTAND_MG_MIDALL": "1", "LASTSTAND_MG_MIDDN": "2",
                                    "LASTSTAND_MG_MIDGU": "1"},
                                   {"LASTSTAND_MG_MID": "1", "LASTSTAND_MG_MIDALL": "1", "LASTSTAND_MG_MIDDN": "1",
                                    "LASTSTAND_MG_MIDTOPK": "0", "LASTSTAND_MG_MIDROUTER": "0"},
                                   {"LASTSTAND_MG_DNEARLY": "1"}, {"LASTSTAND_MG_MIDGU": "2", "LASTSTAND_MG_DNEARLY": "1"},
                                   {"LASTSTAND_MG_SHEARLY": "0"}],
                         ids=["default", "r3", "place32", "place3", "grouped", "mid", "mid-lean", "mid-alt",
                              "mid-dnearly", "mid-gu4", "sh-late"])
def test_grouped_gemm_variants_right_with_a_bf16_shared_expert(tmp_path, knobs):
    ms = [1, 16, 64, 512]
    cells, table = doctor_cells(tmp_path, "--model-path", "synth:qwen3.5-35b-a3b,layers=1",
                                "--m", ",".join(map(str, ms)), env_extra=knobs)
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{knobs}: {bad}\n{table}"
    assert sorted(map(int, cells)) == ms


@pytest.mark.parametrize("preset,ms,early", [("qwen3.5-35b-a3b", [3, 9, 16, 33, 64, 100, 256], False),
                                             ("qwen3.5-397b-a17b", [16, 64], False),
                                             ("qwen3.5-35b-a3b", [3, 16, 33, 100, 256], True)],
                         ids=["35b", "397b", "35b-dnearly"])
def test_grouped_gemm_mid_gemvs_right_with_a_shared_expert_in_the_launch(tmp_path, preset, ms, early):
    # LASTSTAND_MG_MID=1 (+ MIDALL: at every 16-row tile size and shape): the mid-batch GEMVs
    # (mv_kernel) take the 16-row tiles; the presets' NVFP4 shared expert rides in the same
    # launch with full 16-slot tiles (the second pass over slots 8..15), odd M leaves partial
    # tiles; both instances of each GEMM (K = 2048 / 4096 for gate/up, 512 / 1024 for down);
    # early: the down's weights fetched before its wait (LASTSTAND_MG_DNEARLY=1)
    cells, table = doctor_cells(tmp_path, "--shapes", preset, "--m", ",".join(map(str, ms)),
                                env_extra={"LASTSTAND_MG_MID": "1", "LASTSTAND_MG_MIDALL": "1",
                                           "LASTSTAND_MG_DNEARLY": "1" if early else "0"})
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"
    assert sorted(map(int, cells)) == ms


def test_grouped_gemm_right_with_bf16_experts(tmp_path, shared_dir):
    model = os.path.join(shared_dir, "fixtures", "models", "qwen3_5_moe_text")
    if not os.path.exists(os.path.join(model, "config.json")):
        pytest.skip(f"{model} missing")
    cells, table = doctor_cells(tmp_path, "--model-path", model, "--m", "1,5,64,300")
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"


@pytest.mark.parametrize("name", ["qwen3_moe"])
def test_grouped_gemm_logits_match_the_cpu_forward_pass(shared_dir, name):
    model = os.path.join(shared_dir, "fixtures", "models", name)
    ref = os.path.join(model, "ref.json")
    if not os.path.exists(ref):
        pytest.skip(f"{ref} missing")
    ids = ",".join(map(str, json.load(open(ref))["input_ids"]))
    got = {}
    for dev, extra in (("cpu", []), ("cuda", ["--moe-runner-backend", BACKEND])):
        p = run_ls("logits", "--model-path", model, "--ids", ids, "--device", dev, *extra, check=True, timeout=300)
        got[dev] = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    a, b = got["cuda"], got["cpu"]
    assert a.shape == b.shape and np.isfinite(a).all()
    rel = np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)
    assert rel.max() <= 2e-2, f"worst row {rel.argmax()}: {rel.max():.3e}"
    top2 = np.sort(b, axis=1)[:, -2:]
    sure = (top2[:, 1] - top2[:, 0]) > 0.05
    assert (a.argmax(1) == b.argmax(1))[sure].all()


RANK397 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "moe_shapes", "qwen3.5-397b-tp2-rank")


@pytest.mark.parametrize("src,knobs,ms", [
    (("--model-path", RANK397), {}, [9, 16, 33, 64, 100]),
    (("--model-path", RANK397), {"LASTSTAND_MG_MID4K": "0"}, [9, 16, 33]),
    (("--model-path", RANK397), {"LASTSTAND_MG_MIDALL": "1"}, [9, 16, 64, 130]),
    (("--shapes", "qwen3.5-397b-a17b"), {"LASTSTAND_MG_MIDALL": "1"}, [9, 16, 33, 64])],
    ids=["397b-rank", "397b-rank-old", "397b-rank-all", "397b-preset"])
def test_grouped_gemm_mid_variants_at_the_397b_rank_shape(tmp_path, src, knobs, ms):
    # c16moe: the mid-batch path at the 397B's per-GPU shape under --tp 2 (I = 512, BF16 shared
    # expert 512: tests/fixtures/moe_shapes) and the 397B preset (NVFP4 shared expert in the
    # launch: full 16-slot tiles, the second pass): gate/up at H = 4096 with one barrier at 2
    # blocks an SM and the mid path up to M·k = 4E (the default; LASTSTAND_MG_MID4K=0 the old
    # instance), at every 16-row tile size (MIDALL), odd M (partial tiles); the doctor's fp64
    # CPU oracle
    cells, table = doctor_cells(tmp_path, *src, "--m", ",".join(map(str, ms)), env_extra=knobs)
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{knobs}: {bad}\n{table}"
    assert sorted(map(int, cells)) == ms


def test_early_shared_expert_right_at_partial_tiles(tmp_path):
    ms = [9, 33, 100, 256]
    cells, table = doctor_cells(tmp_path, "--model-path", "synth:qwen3.5-35b-a3b,layers=1", "--m",
                                ",".join(map(str, ms)))
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"


@pytest.mark.parametrize("n_tok", [20, 37])
def test_early_shared_expert_same_logits_as_late(n_tok):
    # one forward of n_tok rows (two or three 16-token tiles, the last partial) through
    # cuda_grouped_gemm's mid path in every MoE layer: the early and the late shared expert compute
    # the same sums, so the same logits bit for bit. (A single forward: two `generate --batch` runs
    # may schedule their requests into different steps, which changes the batches' rounding.)
    ids = ",".join(str(1000 + (i * 7919) % 150000) for i in range(n_tok))
    outs = {}
    for early in ("1", "0"):
        env = dict(os.environ, LASTSTAND_MG_SHEARLY=early)
        p = subprocess.run([BIN, "logits", "--model-path", "synth:qwen3.5-35b-a3b,layers=3", "--ids", ids,
                            "--device", "cuda", "--moe-runner-backend", "cuda_fused_decode:1,cuda_grouped_gemm"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        outs[early] = p.stdout  # %.9g of every fp32 logit: equal text = equal bits
    assert outs["1"].startswith('{"shape":[%d,' % n_tok), outs["1"][:80]
    assert outs["1"] == outs["0"]


def test_early_shared_expert_same_tokens_as_late_in_graphs():
    # the CUDA-graph side: decode steps of 20 sequences replayed from graphs, early vs late shared
    # expert, the same greedy ids (generate --batch submits under ls_engine_hold since S21, so the
    # two runs schedule the same steps; before, an eager variant of this test failed once on that)
    ids = ",".join(str(1000 + (i * 7919) % 150000) for i in range(40))
    outs = {}
    for early in ("1", "0"):
        env = dict(os.environ, LASTSTAND_MG_SHEARLY=early)
        p = subprocess.run([BIN, "generate", "--model-path", "synth:qwen3.5-35b-a3b,layers=3", "--ids", ids,
                            "--max-new-tokens", "6", "--ignore-eos", "--batch", "20", "--device", "cuda",
                            "--moe-runner-backend", "cuda_fused_decode:1,cuda_grouped_gemm"],
                           capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "decode steps of 20.00 sequences" in p.stderr, p.stderr[-2000:]
        outs[early] = p.stdout
    assert outs["1"] and outs["1"] == outs["0"]
