"""The chunk-parallel form of gdn cuda_chunked (src/ops/cuda/gdn_chunked.cu, LASTSTAND_GDN_WY=1:
every chunk's WY record at once, then the serial pass over the state) on a GPU; skipped without one.

Pins:
- the doctor's verdict against the fp64 CPU reference (whole sequences replayed, outputs and final
  conv + recurrent states compared) is "ok" with the switch at the Qwen3.5-35B and 397B GDN shapes
  (dk = dv = 128, 32 / 64 v heads) for batches of several multi-chunk sequences (M = 512, 3072:
  prefill chunks of up to 512 tokens mixed with decode rows);
- a 3000-token prompt (47 chunks of one sequence, the long-prompt case the form is for) on the
  synth Qwen3.5-35B cut to 4 layers gives the same greedy ids with and without the switch
  (the two forms do the same products in the same order: the same bits).
"""
import json
import os
import subprocess

import pytest

from conftest import BIN, requires_gpu

pytestmark = requires_gpu


@pytest.mark.parametrize("preset,ms", [("qwen3.5-35b-a3b", [512, 3072]), ("qwen3.5-397b-a17b", [3072])],
                         ids=["35b", "397b"])
def test_wy_form_right_against_the_fp64_reference(tmp_path, preset, ms):
    out = tmp_path / "doctor.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), LASTSTAND_GDN_WY="1")
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--families", "gdn", "--backends", "cuda_chunked",
                        "--shapes", preset, "--m", ",".join(map(str, ms)), "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert out.exists(), f"doctor wrote no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    tabs = [t for t in json.load(open(out))["tables"] if t["family"] == "gdn"]
    assert len(tabs) == 1, p.stdout
    cells = tabs[0]["cells"]["cuda_chunked"]
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{p.stdout}"
    assert sorted(map(int, cells)) == ms


def test_wy_form_same_tokens_on_a_long_prompt():
    ids = ",".join(str(1000 + (i * 7919) % 200000) for i in range(3000))

    def gen(wy):
        env = dict(os.environ, LASTSTAND_GDN_WY=wy)
        p = subprocess.run([BIN, "generate", "--model-path", "synth:qwen3.5-35b-a3b,layers=4", "--ids", ids,
                            "--max-new-tokens", "8", "--device", "cuda", "--gdn-backend", "cuda_chunked",
                            "--prefix-cache", "off"], capture_output=True, text=True, env=env, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)["ids"]

    assert gen("1") == gen("0")
