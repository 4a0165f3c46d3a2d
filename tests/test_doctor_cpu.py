"""`laststand doctor` on the CPU device (runs in CI, no GPU needed).

Pins the behaviours of DESIGN.md section 4 that do not need a GPU:
- each backend runs in a child process: the deliberately broken moe backends
  (LASTSTAND_TEST_BROKEN_BACKENDS=1) are reported as `wrong` (cpu_broken_nan,
  NaN outputs) and `crash` (cpu_broken_abort, SIGABRT), the doctor survives and
  still chooses a correct backend for every bucket;
- correctness is measured against an fp64 oracle (the reference's own error is
  tiny but not zero), the JSON report and the cache file are written;
- `--device cuda` on a machine without a GPU fails clearly (exit 1).
The fixture model is HF transformers' tiny Qwen3.5-MoE NVFP4 checkpoint.
"""
import json
import os
import shutil
import subprocess

import pytest

from conftest import BIN, run_ls

FIXTURE = "models/qwen3_5_moe_text-nvfp4"


@pytest.fixture(scope="module")
def fixture_model(shared_dir):
    d = os.path.join(shared_dir, "fixtures", FIXTURE)
    if not os.path.exists(os.path.join(d, "config.json")):
        pytest.skip(f"{d} missing")
    return d


def doctor(tmp_path, *args, broken=False, timeout=300):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    env.pop("LASTSTAND_TEST_BROKEN_BACKENDS", None)
    if broken:
        env["LASTSTAND_TEST_BROKEN_BACKENDS"] = "1"
    return subprocess.run([BIN, "doctor", *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout)


def table(rep, family):
    return [t for t in rep["tables"] if t["family"] == family]


def test_broken_moe_backends_eliminated_for_the_right_reason(ls_bin, fixture_model, tmp_path):
    js = tmp_path / "rep.json"
    p = doctor(tmp_path, "--device", "cpu", "--model-path", fixture_model, "--families", "moe",
               "--m", "1,4,64", "--json", js, broken=True)
    # the doctor lived through a child that aborted, and found a correct backend everywhere
    assert p.returncode == 0, p.stderr
    rep = json.loads(js.read_text())
    (t,) = table(rep, "moe")
    assert t["backends"][0] == "cpu_ref"  # the reference is tried first (chain of trust)
    assert {"cpu_broken_nan", "cpu_broken_abort", "cpu_grouped"} <= set(t["backends"])
    for m in ("1", "4", "64"):
        nan = t["cells"]["cpu_broken_nan"][m]
        assert nan["status"] == "wrong" and "NaN" in nan["detail"] and f"M={m}" in nan["detail"]
        ab = t["cells"]["cpu_broken_abort"][m]
        assert ab["status"] == "crash"
        assert t["cells"]["cpu_grouped"][m]["status"] == "ok"
        assert t["chosen"][m] in ("cpu_ref", "cpu_grouped")
        assert rep["choice"]["moe"][m] in ("cpu_ref", "cpu_grouped")
    assert "SIGABRT" in t["cells"]["cpu_broken_abort"]["1"]["detail"]
    # deliberately broken backends are shown but flagged, never chosen
    assert {"cpu_broken_nan", "cpu_broken_abort"} <= set(t["test_only"])
    assert "(test-only)" in p.stdout
    # the matrix on stdout shows the verdicts
    assert "❌ wrong" in p.stdout and "❌ crash" in p.stdout and "✅" in p.stdout
    # the cache file was written under XDG_CACHE_HOME and is reused with --use-cache
    cached = list((tmp_path / "cache" / "laststand").glob("doctor-*.json"))
    assert len(cached) == 1
    q = doctor(tmp_path, "--device", "cpu", "--model-path", fixture_model, "--families", "moe",
               "--m", "1,4,64", "--use-cache", broken=True)
    assert q.returncode == 0 and "using the cached decision" in q.stderr
    assert "cpu_broken_abort" in q.stdout


def test_gemm_families_checked_against_fp64_oracle(ls_bin, fixture_model, tmp_path):
    js = tmp_path / "rep.json"
    p = doctor(tmp_path, "--device", "cpu", "--model-path", fixture_model, "--families", "fp4_gemm,gemm",
               "--m", "1,3,17", "--json", js)
    assert p.returncode == 0, p.stderr
    rep = json.loads(js.read_text())
    fp4 = table(rep, "fp4_gemm")
    # the fixture's experts (gate/up [48 x 128], down [128 x 48]) and shared expert are NVFP4
    shapes = {tuple(int(v) for v in t["title"].split("[")[1].split("]")[0].split(" x ")) for t in fp4}
    assert {(48, 128), (128, 48), (64, 128), (128, 64)} <= shapes
    assert table(rep, "gemm"), "the router (BF16) is a gemm shape"
    for t in fp4 + table(rep, "gemm"):
        for m in ("1", "3", "17"):
            c = t["cells"]["cpu_ref"][m]
            assert c["status"] == "ok", c
            assert c["reference"] == "cpu-fp64"
            # fp32 accumulation vs fp64: small but measured (a comparison that cannot fail would give 0)
            assert 0 <= c["rel_err"] < 1e-5
            assert c["ms"] > 0


def test_lm_head_is_its_own_row_group_with_its_own_choice(ls_bin, fixture_model, tmp_path):
    """The lm_head [vocab x hidden] (the fixture config's vocab_size and hidden_size) is timed as
    the "lm_head" row group against the fp64 oracle with a choice of its own; the gemm rows (the
    projections) neither include its shape nor count its time."""
    cfg = json.load(open(os.path.join(fixture_model, "config.json")))
    tc = cfg.get("text_config", cfg)
    V, H = tc["vocab_size"], tc["hidden_size"]
    js = tmp_path / "rep.json"
    p = doctor(tmp_path, "--device", "cpu", "--model-path", fixture_model, "--families", "gemm,lm_head",
               "--m", "1,5,600", "--json", js)
    assert p.returncode == 0, p.stderr
    rep = json.loads(js.read_text())
    assert rep["shapes"]["vocab"] == V
    (lm,) = table(rep, "lm_head")
    # its buckets stop at 512 (M is the rows that want logits; a plan's last entry takes the rest)
    assert lm["ms"] == [1, 5] and sorted(rep["choice"]["lm_head"]) == ["1", "5"], lm["ms"]
    assert all(t["ms"] == [1, 5, 600] for t in table(rep, "gemm"))
    assert lm["title"].startswith(f"lm_head  [{V} x {H}]"), lm["title"]
    assert lm["backends"][0] == "cpu_ref"
    for m in ("1", "5"):
        c = lm["cells"]["cpu_ref"][m]
        assert c["status"] == "ok" and c["reference"] == "cpu-fp64", c
        assert 0 <= c["rel_err"] < 1e-5 and c["ms"] > 0
        assert c["bytes"] >= V * H * 2  # the BF16 weight, read once
        assert rep["choice"]["lm_head"][m] == lm["chosen"][m] != None
    gemm_shapes = [t["title"].split("]")[0] for t in table(rep, "gemm")]
    assert gemm_shapes and f"gemm  [{V} x {H}" not in gemm_shapes
    # printed with the others, as a plan serve's --lm-head-backend takes
    assert f"lm_head  [{V} x {H}]" in p.stdout
    assert [l for l in p.stdout.splitlines() if l.startswith("  lm_head ")], p.stdout[-1500:]


def test_doctor_rejects_bad_input(ls_bin, tmp_path):
    p = doctor(tmp_path, "--device", "cpu", "--shapes", "no-such-model")
    assert p.returncode == 2 and "no-such-model" in p.stderr and "qwen3.5-397b-a17b" in p.stderr
    p = doctor(tmp_path, "--device", "cpu", "--shapes", "qwen3.5-35b-a3b", "--model-path", "x")
    assert p.returncode == 2
    p = doctor(tmp_path, "--device", "tpu", "--shapes", "qwen3.5-35b-a3b")
    assert p.returncode == 2 and "--device" in p.stderr
    p = doctor(tmp_path, "--device", "cpu", "--shapes", "qwen3.5-35b-a3b", "--m", "0")
    assert p.returncode == 2 and "--m" in p.stderr


def test_doctor_cuda_without_gpu_fails_clearly(ls_bin, tmp_path):
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is present: covered by the GPU acceptance run (bench/RESULTS.md)")
    p = doctor(tmp_path, "--device", "cuda", "--shapes", "qwen3.5-35b-a3b", timeout=60)
    assert p.returncode == 1
    assert "cuda" in p.stderr.lower() and "error" in p.stderr


def test_sequence_families_on_heterogeneous_batches(ls_bin, fixture_model, tmp_path):
    """attention and gdn: decode rows and prefill chunks mixed in one step; the
    chunked GDN backend is validated against the reference (outputs and final
    per-slot states) but, being test-only, is never chosen."""
    js = tmp_path / "rep.json"
    p = doctor(tmp_path, "--device", "cpu", "--model-path", fixture_model, "--families", "attention,gdn",
               "--m", "1,5,96", "--json", js)
    assert p.returncode == 0, p.stderr
    rep = json.loads(js.read_text())
    (att,) = table(rep, "attention")
    (gdn,) = table(rep, "gdn")
    assert "output gate" in att["title"] and "4 heads / 2 kv heads x 32" in att["title"]
    for m in ("1", "5", "96"):
        assert att["cells"]["cpu_ref"][m]["status"] == "ok"
        if "cpu_chunked" in gdn["backends"]:
            c = gdn["cells"]["cpu_chunked"][m]
            assert c["status"] == "ok", c
            assert c["rel_err"] < 1e-3  # fp32 chunked vs fp32 per-token: rounding only
            assert gdn["chosen"][m] != "cpu_chunked" or "cpu_chunked" not in gdn["test_only"]
    assert "cpu_chunked" not in rep["choice"]["gdn"].values() or "cpu_chunked" not in gdn["test_only"]
