"""Issue 5's deliberately broken fp4_gemm backends (LASTSTAND_TEST_BROKEN_BACKENDS=1) in the doctor
on a GPU; skipped without one.

Pins: `laststand doctor --device cuda --families fp4_gemm` lives through all three and ends each
for its own reason, at every M of every fp4_gemm table of the synth 35B layer:
- cuda_broken_sm100 (src/ops/cuda/fp4_gemm_sm100.cu, built for sm_100a only): unsupported, the
  CUDA error "no kernel image" in its detail. A build that gave it a Hopper image (an NVARCH on
  make's command line reaching that object, as bench/int/prep_round.sh's builds did until S18)
  makes it run, and this test fail;
- cuda_broken_nan3072: right at M = 1 and 64, wrong at M = 3072 with "M=3072" in the detail;
- cuda_broken_illegal: a crash at every M (its trial process killed; the doctor lives on);
- the chosen backend at every M is a correct, non-test-only one, and the report flags the three as
  test-only.
"""
import json
import os
import subprocess

from conftest import BIN, requires_gpu

pytestmark = requires_gpu

BROKEN = {"cuda_broken_sm100", "cuda_broken_nan3072", "cuda_broken_illegal"}


def test_the_three_broken_fp4_backends_end_for_their_own_reasons(tmp_path):
    out = tmp_path / "doctor.json"
    env = dict(os.environ, LASTSTAND_TEST_BROKEN_BACKENDS="1", XDG_CACHE_HOME=str(tmp_path / "cache"))
    p = subprocess.run([BIN, "doctor", "--device", "cuda", "--model-path", "synth:qwen3.5-35b-a3b,layers=1",
                        "--families", "fp4_gemm", "--m", "1,64,3072", "--json", str(out)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rep = json.load(open(out))
    tabs = [t for t in rep["tables"] if t["family"] == "fp4_gemm"]
    assert tabs, p.stdout[-3000:]
    for t in tabs:
        assert BROKEN <= set(t["backends"]) and BROKEN <= set(t["test_only"]), t["backends"]
        cells = t["cells"]
        for m in ("1", "64", "3072"):
            sm100 = cells["cuda_broken_sm100"][m]
            assert sm100["status"] == "unsupported" and "no kernel image" in sm100["detail"], (m, sm100)
            assert cells["cuda_broken_illegal"][m]["status"] == "crash", (m, cells["cuda_broken_illegal"][m])
            assert t["chosen"][m] not in BROKEN and cells[t["chosen"][m]][m]["status"] == "ok", (m, t["chosen"][m])
        for m in ("1", "64"):
            assert cells["cuda_broken_nan3072"][m]["status"] == "ok", (m, cells["cuda_broken_nan3072"][m])
        nan = cells["cuda_broken_nan3072"]["3072"]
        assert nan["status"] == "wrong" and "M=3072" in nan["detail"], nan
    assert "(test-only)" in p.stdout and "❌ unsupported" in p.stdout and "❌ crash" in p.stdout
