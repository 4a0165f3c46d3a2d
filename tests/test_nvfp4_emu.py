"""The M = 1 NVFP4 GEMV kernels' warp step (src/ops/cuda/nvfp4.cuh) checked on the CPU.

Kind 5 is the M = 2..8 bit-placement step (nv4_gemv2_chunk with M tokens in the B columns,
x permuted per token, fp4_w4a16_async_kernel<D = 2>). Kind 3 is the table-decode step
(nv4_gemv1t_chunk<L>, fp4_gemv1t_kernel), kind 4 its M <= 8 form (nv4_w4_chunk_tab<L>,
cu_w4_chunk_mma's mapping, M tokens): their emulated
shared memory checks that every table load of lane i hits bank i (the conflict-free
layout); a lane reading its neighbour's copy (right values, wrong banks) or a table laid
out copy-major (wrong values) must fail.

tests/emu/nvfp4_emu.cpp includes nvfp4.cuh with its host hooks and runs a warp of the
kernels' per-lane code on 32 threads, emulating mma.sync m16n8k16 from the PTX
fragment layout, on 5 weight shapes (K = 512 .. 4096, the 4-, 8- and 16-warp
instances; random codes, scales including zero and subnormal E4M3, BF16 x), and
compares with an fp64 product from the format's definition; it also decodes every
nibble pattern with both decoders. The oracle is the NVFP4 definition, not the code.
No GPU needed: this pins the lane mapping (which B column carries which scale block,
which lane holds which scale, the (i, i + 4) pairing and the x permutation) that a GPU
run would only report as a wrong doctor cell.
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "tests", "emu", "nvfp4_emu.cpp")


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    cxx = shutil.which("g++")
    if not cxx:
        pytest.skip("g++ not found")
    out = str(tmp_path_factory.mktemp("nvfp4") / "nvfp4_emu")
    p = subprocess.run([cxx, "-std=c++20", "-O1", "-pthread", "-Wno-unknown-pragmas", SRC, "-o", out],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.mark.parametrize("kind", ["1", "2", "3 0", "3 1", "3 2", "3 4", "4 2 1", "4 2 3", "4 4 8", "5 2", "5 3", "5 8"])
def test_gemv_warp_step_matches_fp64(emu, kind):
    """kind 1: block-column step; kind 2: bit-placement step (the M = 1 default on the large
    weights); kind 3 L: table-decode step with L of 4 word pairs by table (L = 0, 2: the
    M = 1 defaults elsewhere); kind 4 L M: the M <= 8 table step (scaled A, M tokens in the
    B columns; header-only, for reuse); kind 5 M: the M <= 8 bit-placement step in
    fp4_w4a16_async_kernel<D = 2>'s mapping (the M = 2..8 default), M tokens."""
    p = subprocess.run([emu] + kind.split(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().endswith("PASS"), p.stdout + p.stderr
    assert p.stdout.count("rel ") == 5
    if kind[0] in "34":
        assert "table loads off their lane's bank: 0" in p.stdout


@pytest.mark.parametrize("kind", ["1", "2", "3 2", "4 2 8", "5 8"])
def test_a_wrong_lane_mapping_is_caught(emu, kind):
    """Swapping two scales in the lane mapping must fail the comparison."""
    env = dict(os.environ, NVFP4_EMU_MUTATE="1")
    p = subprocess.run([emu] + kind.split(), capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "FAIL" in p.stdout, p.stdout


def test_x_left_in_k_order_is_caught_by_the_m8_bit_placement_step(emu):
    """The bit-placement decode pairs codes (i, i + 4): x fed in K order must fail."""
    env = dict(os.environ, NVFP4_EMU_MUTATE="4")
    p = subprocess.run([emu, "5", "4"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "FAIL" in p.stdout, p.stdout


@pytest.mark.parametrize("mutate", ["2", "3"])
def test_a_wrong_table_bank_mapping_is_caught(emu, mutate):
    """2: each lane reads its neighbour's table copy (values right, every load off its bank);
    3: the table laid out copy-major (word i * 256 + j): the values go wrong."""
    env = dict(os.environ, NVFP4_EMU_MUTATE=mutate)
    p = subprocess.run([emu, "3", "2"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode != 0 and "FAIL" in p.stdout, p.stdout
    if mutate == "2":  # caught by the bank check alone: the sums are right
        assert "table loads off their lane's bank: 0" not in p.stdout
        assert all(float(r) < 1e-5 for r in re.findall(r"rel (\S+)", p.stdout)), p.stdout
