"""cuda_grouped_gemm's warpgroup-MMA GEMMs for prefill chunks (src/ops/cuda/moe_wgmma.cu,
LASTSTAND_MG_WGMMA=1) on a GPU; skipped without one.

Pins, each against the doctor's fp64 CPU reference (verdict "ok" at every bucket):
- the Qwen3.5-35B MoE layer (NVFP4 experts, the NVFP4 shared expert in the same launch) at batch
  sizes whose average rows per expert take 64-row tiles (M·8/256 >= 28: M = 1024, 2048, 3001 with
  a partial last tile per expert), and at M = 100 with 64-row tiles forced
  (LASTSTAND_GROUPED_BM=64: tiles mostly padding);
- the Qwen3.5-397B layer (H = 4096, I = 1024: 16 gate/up column blocks, K = 1024 for down) at M = 2048;
- synth Qwen3.5-35B (a BF16 shared expert: its GEMMs stay on mg_gemm_kernel, on the side stream,
  beside the routed experts' wgmma launches) at M = 1024, 2048;
- end to end, synth:demo (NVFP4 experts; H = 256, I = 128: 2 column blocks, K = 256 / 128) over a
  150-token prompt (37.5 rows per expert: 64-row tiles): `logits --device cuda` with the switch is
  no further from the CPU forward pass than the same run without it (max |a - b| / max |b| per
  row, x1.25 + 0.02: this random model amplifies any change of summation order, S9 R1 saw 0.11
  between the two CUDA runs), and its log names the wgmma path on a compute capability 9.0 device
  (the switch did not silently fall back to mg_gemm_kernel).
Those with mw_kernel forced (LASTSTAND_MG_WGMMA2=0, LASTSTAND_MG_WGMMA2_SH=0); each again with
m2_kernel at every M (the default from 112 rows an expert; synth's BF16 shared expert by m2's BF16
form too), the 35B at M = 8192 (groups of four 64-row tiles) as well; and m2 with its NVFP4 down's
token rows by cp.async instead of TMA (LASTSTAND_MG_WGMMA2_TMA=0), whose logits must equal the
default's bit for bit (the same bytes for the same MMAs).
"""
import json
import os
import subprocess

import numpy as np
import pytest

from conftest import BIN, requires_gpu

pytestmark = requires_gpu

BACKEND = "cuda_grouped_gemm"


def doctor(tmp_path, *args, env_extra=None):
    out = tmp_path / "doctor.json"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"), LASTSTAND_MG_WGMMA="1", **(env_extra or {}))
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--families", "moe", "--backends", BACKEND,
                        "--json", str(out), *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert out.exists(), f"doctor wrote no report (exit {p.returncode}):\n{p.stderr[-3000:]}"
    tabs = [t for t in json.load(open(out))["tables"] if t["family"] == "moe"]
    assert len(tabs) == 1, p.stdout
    return tabs[0]["cells"][BACKEND], p.stdout, p.stderr


def check(cells, table, ms):
    bad = {m: (c["status"], c["detail"]) for m, c in cells.items() if c["status"] != "ok"}
    assert not bad, f"{bad}\n{table}"
    assert sorted(map(int, cells)) == ms


MW = {"LASTSTAND_MG_WGMMA2": "0", "LASTSTAND_MG_WGMMA2_SH": "0"}  # mw_kernel only
M2 = {"LASTSTAND_MG_WGMMA2": "1", "LASTSTAND_MG_WGMMA2_MINROWS": "0"}  # m2_kernel at every M
M2SH = dict(M2, LASTSTAND_MG_WGMMA2_SH="1")
# S12: m2's NVFP4 down loads its token rows by TMA (default) or by cp.async (LASTSTAND_MG_WGMMA2_TMA=0)
M2NOTMA = dict(M2, LASTSTAND_MG_WGMMA2_TMA="0")


@pytest.mark.parametrize("args,ms,extra", [
    (["--shapes", "qwen3.5-35b-a3b"], [1024, 2048, 3001], MW),
    (["--shapes", "qwen3.5-35b-a3b"], [100], dict(MW, LASTSTAND_GROUPED_BM="64")),
    (["--shapes", "qwen3.5-397b-a17b"], [2048], MW),
    (["--model-path", "synth:qwen3.5-35b-a3b,layers=1"], [1024, 2048], MW),
    # m2_kernel (up to 256 tokens a CTA, the weights decoded into wgmma's A registers), and its BF16
    # form for synth's BF16 shared expert; 8192: 4-tile groups, 3001: partial groups and last tiles
    (["--shapes", "qwen3.5-35b-a3b"], [1024, 3001, 8192], M2),
    (["--shapes", "qwen3.5-35b-a3b"], [100], dict(M2, LASTSTAND_GROUPED_BM="64")),
    (["--shapes", "qwen3.5-397b-a17b"], [2048], M2),
    (["--model-path", "synth:qwen3.5-35b-a3b,layers=1"], [1024, 8192], M2SH),
    # the down's tokens by cp.async (4-tile groups and partial ones; mostly padding)
    (["--shapes", "qwen3.5-35b-a3b"], [3001, 8192], M2NOTMA),
    (["--shapes", "qwen3.5-35b-a3b"], [100], dict(M2NOTMA, LASTSTAND_GROUPED_BM="64")),
], ids=["35b", "35b-bm64-padding", "397b", "35b-bf16-shared", "m2-35b", "m2-35b-bm64-padding", "m2-397b",
        "m2-35b-bf16-shared", "m2-notma-35b", "m2-notma-35b-bm64-padding"])
def test_wgmma_grouped_gemm_right(tmp_path, args, ms, extra):
    cells, table, _ = doctor(tmp_path, *args, "--m", ",".join(map(str, ms)), env_extra=extra)
    check(cells, table, ms)


def logits(device, wgmma, extra=None):
    ids = ",".join(str(5 + (i * 37) % 200) for i in range(150))
    env = dict(os.environ, LASTSTAND_MG_WGMMA="1" if wgmma else "0", **(extra or {}))
    args = [BIN, "logits", "--model-path", "synth:demo", "--ids", ids, "--device", device]
    if device == "cuda":
        args += ["--moe-runner-backend", BACKEND]
    p = subprocess.run(args, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    return np.array(json.loads(p.stdout)["logits"], dtype=np.float64), p.stderr


@pytest.mark.parametrize("extra", [MW, M2], ids=["mw", "m2"])
def test_wgmma_logits_agree_with_mg_gemm_and_the_cpu(extra):
    cpu, _ = logits("cpu", False)
    base, _ = logits("cuda", False)
    new, err = logits("cuda", True, extra)
    if "no sm_90a image" not in err:
        assert "by the wgmma kernels" in err, f"the wgmma path never ran:\n{err[-2000:]}"
    rel = lambda a, b: float((np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max())
    # the random demo model amplifies rounding (summation order alone moves its logits by ~0.1,
    # bench/RESULTS.md): the switch must keep the CUDA forward pass as close to the CPU's as it was
    r_new, r_base, r_nb = rel(new, cpu), rel(base, cpu), rel(new, base)
    print(f"rel err vs cpu: wgmma {r_new:.4f}, mg_gemm {r_base:.4f}; wgmma vs mg_gemm {r_nb:.4f}")
    assert r_new <= 1.25 * r_base + 0.02, (r_new, r_base, r_nb)
    assert r_nb <= 2 * r_base + 0.02, (r_new, r_base, r_nb)


def test_m2_tma_bit_identical_to_cp_async():
    """m2's NVFP4 down with its token rows by TMA (the default) and by cp.async
    (LASTSTAND_MG_WGMMA2_TMA=0) places the same bytes at the same places for the same MMAs: the
    logits are equal bit for bit (synth:demo, 150 tokens, m2 forced, its BF16 shared-expert form too);
    a run of the cp.async form against itself first shows the forward pass deterministic. (S12-R2/R3
    showed both forms, and every S12 form, bit for bit equal to S11's kernel.)"""
    base = dict(M2SH, LASTSTAND_MG_WGMMA2_TMA="0")
    a, _ = logits("cuda", True, base)
    b, _ = logits("cuda", True, base)
    if not np.array_equal(a, b):
        pytest.skip(f"two identical m2 runs differ ({np.abs(a - b).max()}): nothing to compare bitwise")
    c, err = logits("cuda", True, dict(M2SH))
    if "no sm_90a image" not in err:
        assert "by the wgmma kernels" in err, f"the wgmma path never ran:\n{err[-2000:]}"
    assert np.array_equal(a, c), f"TMA differs from cp.async by {np.abs(a - c).max()}"
