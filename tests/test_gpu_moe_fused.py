"""The cuda_fused_decode moe backend (src/ops/cuda/moe_fused.cu) on a GPU; skipped without one.

Pins, each by the doctor's verdict against the fp64 CPU reference ("ok" in every cell) on the
Qwen3.5-35B MoE layer shape at M = 1, 2, 8, with an NVFP4 shared expert (`--shapes`) and with
the BF16 shared expert synth writes (`--model-path synth:...,layers=1`):
- the default choices (kernel pair, programmatic dependent launch, the NVFP4 shared expert's
  gate/up ahead of the top-k wait, where a BF16 shared expert runs, per shape);
- every benchmark knob of fused_run, which must stay right even where it is slower: the other
  kernel pair (LASTSTAND_MOE_FUSED_PAIR=1|2), PDL off / on (LASTSTAND_MOE_PDL=0|1), the NVFP4
  shared expert's gate/up after the top-k wait (LASTSTAND_MOE_SHARED_EARLY=0), the NVFP4
  decode form at M = 1 (LASTSTAND_MOE_BC=0 in the register pair, where block-column is the
  default; =1 in the cp.async pair), and where a BF16 shared expert runs inside the router and
  top-k launches (LASTSTAND_MOE_SHARED_ROUTE=1: m16n8k16 tiles, the default of the four launches
  at M > 2; =2: one warp a row, their default at M <= 2; with an NVFP4 shared expert it changes
  nothing) with either pair and without PDL (with LASTSTAND_MOE_DEC=0 where the three launches
  would be the default); the three-launch form with a BF16 shared expert (the default at
  M >= 4; LASTSTAND_MOE_DEC=0 | 1 forces it off | on: the top-k in the router's last blocks, the
  shared expert's down rows inside the down kernel) with its parts (LASTSTAND_MOE_GU_V: gate/up's
  16 slices in 8 warps; LASTSTAND_MOE_PF: the expert tables prefetched into L2); the defaults and
  the three launches also at the full 397B's tensor-parallel rank shape (I = shared I = 512).
"""
import json
import os
import subprocess

import pytest

from conftest import BIN, requires_gpu

BACKEND = "cuda_fused_decode"
PRESET = "qwen3.5-35b-a3b"



pytestmark = requires_gpu


# the full 397B's MoE layer as each of two tensor-parallel ranks runs it (model_tp.c slices the
# experts' and the shared expert's intermediate dimension: 1024 / 2), BF16 shared expert
RANK_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "device", "moedec_rank")


def doctor_cells(tmp_path, knobs, shared, ms):
    out = tmp_path / "doctor.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), **knobs)
    src = (["--shapes", PRESET] if shared == "nvfp4" else ["--model-path", RANK_DIR] if shared == "rank"
           else ["--model-path", f"synth:{PRESET},layers=1"])
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--families", "moe", "--backends", BACKEND,
                        "--m", ",".join(map(str, ms)), "--json", str(out), *src], capture_output=True,
                       text=True, env=env, timeout=300)
    assert out.exists(), f"doctor wrote no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    tabs = [t for t in json.load(open(out))["tables"] if t["family"] == "moe"]
    assert len(tabs) == 1, p.stdout
    return tabs[0]["cells"][BACKEND], p.stdout


KNOBS = [
    {},
    {"LASTSTAND_MOE_FUSED_PAIR": "1"},
    {"LASTSTAND_MOE_FUSED_PAIR": "2"},
    {"LASTSTAND_MOE_PDL": "0"},
    {"LASTSTAND_MOE_PDL": "1", "LASTSTAND_MOE_FUSED_PAIR": "1"},
    {"LASTSTAND_MOE_SHARED_EARLY": "0"},
    {"LASTSTAND_MOE_BC": "0", "LASTSTAND_MOE_FUSED_PAIR": "1"},
    {"LASTSTAND_MOE_BC": "1", "LASTSTAND_MOE_FUSED_PAIR": "2"},
    {"LASTSTAND_MOE_SHARED_ROUTE": "1", "LASTSTAND_MOE_DEC": "0"},
    {"LASTSTAND_MOE_SHARED_ROUTE": "1", "LASTSTAND_MOE_FUSED_PAIR": "1"},
    {"LASTSTAND_MOE_SHARED_ROUTE": "2", "LASTSTAND_MOE_DEC": "0"},
    {"LASTSTAND_MOE_SHARED_ROUTE": "2", "LASTSTAND_MOE_FUSED_PAIR": "1"},
    {"LASTSTAND_MOE_SHARED_ROUTE": "2", "LASTSTAND_MOE_PDL": "0", "LASTSTAND_MOE_DEC": "0"},
    {"LASTSTAND_MOE_DEC": "0"},
    {"LASTSTAND_MOE_DEC": "1"},
    {"LASTSTAND_MOE_DEC": "1", "LASTSTAND_MOE_GU_V": "1", "LASTSTAND_MOE_PF": "0"},
    {"LASTSTAND_MOE_DEC": "0", "LASTSTAND_MOE_GU_V": "2", "LASTSTAND_MOE_PF": "1"},
]


@pytest.mark.parametrize("shared", ["nvfp4", "bf16"])
@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(f"{a[13:]}={b}" for a, b in k.items()) or "default")
def test_fused_decode_right_with_every_choice(tmp_path, knobs, shared):
    ms = [1, 2] if "LASTSTAND_MOE_BC" in knobs else [1, 2, 8]
    cells, table = doctor_cells(tmp_path, knobs, shared, ms)
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"
    assert sorted(map(int, cells)) == ms


@pytest.mark.parametrize("knobs", [{}, {"LASTSTAND_MOE_DEC": "1"}],
                         ids=lambda k: ",".join(f"{a[13:]}={b}" for a, b in k.items()) or "default")
def test_fused_decode_right_at_the_397b_rank_shape(tmp_path, knobs):
    ms = [1, 2, 8]
    cells, table = doctor_cells(tmp_path, knobs, "rank", ms)
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"
    assert sorted(map(int, cells)) == ms
