"""The GDN recurrent state in BF16 on a GPU (--mamba-ssm-dtype bfloat16: gdn_state.rec16, every
CUDA gdn backend but cuda_per_token; cuda_chunked at dk = dv = 128); skipped without one.

Pins:
- the doctor's gdn cells on the BF16 state are "ok" against the fp64 CPU reference started from
  the same (BF16) states, every bucket, for cuda_decode (gd_kernel, and gd_kernel_p at the wide
  decode steps: its states as BF16 bulk copies), cuda_chunked (the chunk kernel, serial and WY
  forms at 512+ tokens) and cuda_recurrent; cuda_per_token says it keeps fp32 state;
- the 35B and 397B GDN shapes, cuda_decode also taking every chunk itself (DECODE_MAX_NEW=0);
- `generate --batch 6` with the BF16 state gives the same greedy ids with and without CUDA graphs
  (the captured kernels read and write the BF16 state as the eager ones).
"""
import json
import os
import subprocess

import pytest

from conftest import BIN, requires_gpu

pytestmark = requires_gpu

MS = [1, 2, 8, 16, 64, 512, 2048]


def _cells(tmp_path, shapes, backends, env_extra=None):
    out = tmp_path / "doctor-gdn.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), **(env_extra or {}))
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--families", "gdn", "--backends", backends,
                        "--shapes", shapes, "--m", ",".join(map(str, MS)), "--mamba-ssm-dtype", "bfloat16",
                        "--json", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert out.exists(), f"doctor wrote no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    tabs = [t for t in json.load(open(out))["tables"] if t["family"] == "gdn"]
    assert len(tabs) == 1, p.stdout
    assert "BF16 state" in p.stdout, p.stdout
    return tabs[0]["cells"], p.stdout


@pytest.mark.parametrize("shapes", ["qwen3.5-35b-a3b", "qwen3.5-397b-a17b"])
def test_bf16_state_right_at_every_bucket(tmp_path, shapes):
    cells, table = _cells(tmp_path, shapes, "cuda_decode,cuda_chunked,cuda_recurrent,cuda_per_token")
    for be in ("cuda_decode", "cuda_chunked", "cuda_recurrent"):
        bad = {m: (c["status"], c["detail"]) for m, c in cells[be].items() if c["status"] != "ok"}
        assert not bad, f"{be}: {bad}\n{table}"
    assert all(c["status"] == "unsupported" and "fp32" in c["detail"] for c in cells["cuda_per_token"].values())


def test_bf16_state_decode_takes_every_chunk_itself(tmp_path):
    cells, table = _cells(tmp_path, "qwen3.5-35b-a3b", "cuda_decode", {"LASTSTAND_GDN_DECODE_MAX_NEW": "0"})
    bad = {m: (c["status"], c["detail"]) for m, c in cells["cuda_decode"].items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"


def test_bf16_state_graphs_equal_eager():
    ids = ",".join(str(1000 + (i * 7919) % 150000) for i in range(80))
    outs = {}
    for graphs in (True, False):
        p = subprocess.run([BIN, "generate", "--model-path", "synth:qwen3.5-35b-a3b,layers=4", "--ids", ids,
                            "--max-new-tokens", "8", "--ignore-eos", "--batch", "6", "--device", "cuda",
                            "--mamba-ssm-dtype", "bfloat16", *([] if graphs else ["--disable-cuda-graph"])],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
        assert "GDN recurrent state in BF16" in p.stderr
        outs[graphs] = p.stdout
    assert outs[True] and outs[True] == outs[False]
