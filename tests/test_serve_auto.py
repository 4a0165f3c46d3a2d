"""`serve` with `auto` backends never serves garbage (DESIGN.md section 4, issue 5 deliverable 5).

Pinned behaviour, on the CPU device with the demo model and the test-only broken MoE
backends (LASTSTAND_TEST_BROKEN_BACKENDS=1: cpu_broken_nan writes NaN, cpu_broken_abort
aborts the process):
- start-up runs the doctor at the server's buckets (or uses its cached decision), then a
  smoke test against the reference backends, and logs "the last backend standing" table;
- a second start with the same build, model and device reuses both cached verdicts;
- with `auto` the broken backends are eliminated and the served greedy tokens equal the
  tokens of a server running the reference backends (cpu_ref) everywhere (the oracle);
- a named backend that fails is refused with exit 2 and the reason, unless --trust-backend;
- a backend the doctor missed (its cached verdict doctored to "ok") is caught by the smoke
  test, blamed on its op family and replaced by the next candidate;
- NaN logits at run time fail the request, count in /metrics, and the server keeps serving.
Every test points XDG_CACHE_HOME (where the doctor keeps its cache) at a temp dir.
"""
import glob
import json
import os
import re
import subprocess
import time

import pytest

from conftest import BIN
from e2e_util import Server

REF = ["--fp4-gemm-backend", "cpu_ref", "--moe-runner-backend", "cpu_ref",
       "--attention-backend", "cpu_ref", "--gdn-backend", "cpu_ref"]
PROMPTS = ["The last backend standing", "Once upon a time, a kernel", "1 2 3 4 5"]


def env_for(cache, broken=True):
    e = {"XDG_CACHE_HOME": str(cache)}
    if broken:
        e["LASTSTAND_TEST_BROKEN_BACKENDS"] = "1"
    return e


def full_log(s):
    s.log.seek(0)
    return s.log.read()


def serve_rc(demo_model, cache, *flags, broken=True, timeout=120):
    env = dict(os.environ, **env_for(cache, broken))
    return subprocess.run([BIN, "serve", "--model-path", demo_model, "--port", "1", *flags],
                          capture_output=True, text=True, env=env, timeout=timeout)


def table(log):
    """The last 'last backend standing' table: {family: (backend, why)}."""
    rows = {}
    lines = log.splitlines()
    start = max(i for i, l in enumerate(lines) if "the last backend standing" in l or "backend check FAILED" in l)
    for l in lines[start + 2:]:
        m = re.match(r"\[[^\]]*\]\s+(fp4_gemm|moe|attention|gdn|gemm|lm_head)\s+(\S+(?: \([A-Z, ]+\))?)\s+(.*)$", l)
        if not m:
            break
        rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def greedy_ids(s, prompt, n=10):
    st, out = s.post_json("/generate", {"text": prompt, "sampling_params": {
        "temperature": 0, "max_new_tokens": n, "ignore_eos": True}})
    assert st == 200, out
    return out["output_ids"]


@pytest.fixture(scope="module")
def ref_tokens(ls_bin, demo_model, tmp_path_factory):
    """The oracle: greedy tokens of a server running the reference backends everywhere."""
    cache = tmp_path_factory.mktemp("refcache")
    with Server(ls_bin, demo_model, *REF, env=env_for(cache)) as s:
        return {p: greedy_ids(s, p) for p in PROMPTS}


def test_auto_eliminates_broken_backends_and_serves_the_reference_tokens(ls_bin, demo_model, tmp_path, ref_tokens):
    t0 = time.time()
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        first = time.time() - t0
        log = full_log(s)
        assert "backend check: the doctor ran" in log, log[-3000:]
        m = re.search(r"decision cached in (\S+doctor-[0-9a-f]+\.json)", log)
        assert m and m.group(1).startswith(str(tmp_path)), log[-3000:]
        assert "smoke test: 8 greedy steps" in log and "the tokens equal the reference backends'" in log
        t = table(log)
        assert set(t) == {"fp4_gemm", "moe", "attention", "gdn", "gemm", "lm_head"}, t
        assert t["moe"][0] not in ("cpu_broken_nan", "cpu_broken_abort"), t
        assert re.search(r"cpu_broken_nan: doctor wrong at M=1,16: .*NaN", t["moe"][1]), t["moe"]
        assert re.search(r"cpu_broken_abort: doctor crash at M=1,16: killed by SIGABRT", t["moe"][1]), t["moe"]
        assert "cpu_chunked: test-only" in t["gdn"][1]
        for p in PROMPTS:
            assert greedy_ids(s, p) == ref_tokens[p], p
    # second start: both verdicts come from the cache, no child runs, start-up is cheap
    t0 = time.time()
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        second = time.time() - t0
        log = full_log(s)
        assert "backend check: the doctor's cached decision " + m.group(1) in log, log[-3000:]
        assert "smoke test: this combination passed before" in log
        assert "the doctor ran" not in log and "greedy steps" not in log
        assert table(log)["moe"][0] == t["moe"][0]
    assert second < first + 1.0, (first, second)


def test_named_nan_backend_is_refused_with_the_reason(demo_model, tmp_path):
    p = serve_rc(demo_model, tmp_path, "--moe-runner-backend", "cpu_broken_nan")
    assert p.returncode == 2, p.stderr[-3000:]
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("laststand serve: error: --moe-runner-backend cpu_broken_nan refused")
    assert "wrong" in err and "NaN" in err and "--trust-backend" in err
    assert "(REFUSED)" in table(p.stderr)["moe"][0]


def test_named_aborting_backend_is_refused_as_a_crash(demo_model, tmp_path):
    p = serve_rc(demo_model, tmp_path, "--moe-runner-backend", "cpu_broken_abort")
    assert p.returncode == 2, p.stderr[-3000:]
    err = p.stderr.strip().splitlines()[-1]
    assert "cpu_broken_abort refused" in err and "crash" in err and "SIGABRT" in err, err


def test_trusted_nan_backend_serves_with_a_warning_and_nan_fails_each_request(ls_bin, demo_model, tmp_path):
    with Server(ls_bin, demo_model, "--moe-runner-backend", "cpu_broken_nan", "--trust-backend",
                env=env_for(tmp_path)) as s:
        log = full_log(s)
        assert "!!! --moe-runner-backend cpu_broken_nan FAILED the doctor" in log
        assert "!!! --moe-runner-backend cpu_broken_nan FAILED the smoke test" in log
        assert table(log)["moe"][0] == "cpu_broken_nan (TRUSTED, FAILED)"
        for _ in range(2):
            st, out = s.post_json("/v1/completions", {"prompt": "hi", "max_tokens": 3, "temperature": 0})
            assert st == 500 and "NaN" in out["error"]["message"], out
        assert s.get("/health")[0] == 200  # still serving
        metrics = s.get("/metrics")[1].decode()
        assert re.search(r"laststand:nan_logits_total\{[^}]*\} 2\b", metrics), metrics
        assert re.search(r"laststand:num_requests_failed_total\{[^}]*\} 2\b", metrics), metrics


def doctored_cache(cache_dir, bad, ok_status="ok"):
    """Make the doctor's cached decision claim `bad` is correct, fastest and not test-only
    (a doctor that missed a bug), and drop any cached smoke verdict."""
    [path] = glob.glob(os.path.join(cache_dir, "laststand", "doctor-*.json"))
    r = json.load(open(path))
    for tab in r["tables"]:
        if tab["family"] != "moe":
            continue
        tab["test_only"] = [n for n in tab["test_only"] if n != bad]
        for mk, c in tab["cells"][bad].items():
            c.update(status=ok_status, detail="doctored for the test", ms=1e-6)
        for mk in tab["chosen"]:
            tab["chosen"][mk] = bad
    for mk in r["choice"]["moe"]:
        r["choice"]["moe"][mk] = bad
    json.dump(r, open(path, "w"))
    for f in glob.glob(os.path.join(cache_dir, "laststand", "smoke-*.json")):
        os.unlink(f)


@pytest.mark.parametrize("bad,why", [("cpu_broken_nan", r"wrong: 4096 of 4096 logits NaN/Inf at step 0"),
                                     ("cpu_broken_abort", r"crash: killed by SIGABRT")])
def test_smoke_test_catches_what_the_doctor_missed_and_falls_back(ls_bin, demo_model, tmp_path, ref_tokens, bad, why):
    p = serve_rc(demo_model, tmp_path, "--doctor-timeout", "-1")  # bad flag: nothing runs, nothing cached
    assert p.returncode == 2 and "--doctor-timeout" in p.stderr
    # fill the cache with a real decision, then doctor it
    p = serve_rc(demo_model, tmp_path, "--moe-runner-backend", "cpu_broken_nan")
    assert p.returncode == 2
    doctored_cache(tmp_path, bad)
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        log = full_log(s)
        assert "the doctor's cached decision" in log
        assert re.search(r"smoke test: moe backend %s fails: %s" % (bad, why), log), log[-3000:]
        assert re.search(r"smoke test: falling back to moe backend cpu_grouped", log), log[-3000:]
        t = table(log)
        assert t["moe"][0] == "cpu_grouped", t
        assert re.search(r"%s: smoke test %s" % (bad, why), t["moe"][1]), t["moe"]
        for q in PROMPTS:
            assert greedy_ids(s, q) == ref_tokens[q], q


def test_named_backend_the_doctor_missed_is_refused_by_the_smoke_test(demo_model, tmp_path):
    serve_rc(demo_model, tmp_path, "--moe-runner-backend", "cpu_broken_nan")
    doctored_cache(tmp_path, "cpu_broken_nan")
    p = serve_rc(demo_model, tmp_path, "--moe-runner-backend", "cpu_broken_nan")
    assert p.returncode == 2, p.stderr[-3000:]
    err = p.stderr.strip().splitlines()[-1]
    assert "cpu_broken_nan refused: the smoke test found it wrong" in err and "NaN" in err, err


def test_no_correct_backend_exits_1_with_the_reason(demo_model, tmp_path):
    serve_rc(demo_model, tmp_path, "--moe-runner-backend", "cpu_broken_nan")
    [path] = glob.glob(os.path.join(tmp_path, "laststand", "doctor-*.json"))
    r = json.load(open(path))
    for tab in r["tables"]:
        if tab["family"] == "moe":
            for name, row in tab["cells"].items():
                for c in row.values():
                    c.update(status="wrong", detail="doctored: rel err 1")
    json.dump(r, open(path, "w"))
    p = serve_rc(demo_model, tmp_path)
    assert p.returncode == 1, p.stderr[-3000:]
    assert "no correct moe backend on cpu at M=1,16" in p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("bad,why", [("cpu_broken_nan", "wrong: 4096 of 4096 logits NaN/Inf"),
                                     ("cpu_broken_abort", "crash: killed by SIGABRT")])
def test_without_doctor_shapes_the_smoke_test_alone_refuses_a_broken_backend(tmp_path, bad, why):
    """synth:demo is not one of the doctor's presets: no doctor decision, the smoke test decides alone."""
    p = serve_rc("synth:demo", tmp_path, "--moe-runner-backend", bad)
    assert p.returncode == 2, p.stderr[-3000:]
    assert "the doctor cannot read the model's shapes" in p.stderr
    err = p.stderr.strip().splitlines()[-1]
    assert f"--moe-runner-backend {bad} refused: the smoke test found it {why}" in err, err
    t = table(p.stderr)
    assert t["moe"][0] == f"{bad} (REFUSED)", t


def test_nan_logits_at_run_time_fail_that_request_count_and_the_server_keeps_serving(
        ls_bin, demo_model, tmp_path, ref_tokens):
    """A forced -1 puts NaN into that step's logits (engine test hook): the request fails with a 5xx
    naming NaN, /metrics counts it, and the next request gets the reference's tokens."""
    env = dict(env_for(tmp_path), LASTSTAND_TEST_FORCE_IDS="1")
    with Server(ls_bin, demo_model, env=env) as s:
        st, out = s.post_json("/v1/completions", {"prompt": "hi", "max_tokens": 4, "temperature": 0,
                                                  "force_ids": [5, -1]})
        assert st >= 500 and "NaN" in out["error"]["message"], (st, out)
        for p in PROMPTS:
            assert greedy_ids(s, p) == ref_tokens[p], p
        metrics = s.get("/metrics")[1].decode()
        assert re.search(r"laststand:nan_logits_total\{[^}]*\} 1\b", metrics), metrics
        assert re.search(r"laststand:num_requests_failed_total\{[^}]*\} 1\b", metrics), metrics


def test_unknown_backend_name_is_refused_before_any_check_runs(demo_model, tmp_path):
    p = serve_rc(demo_model, tmp_path, "--moe-runner-backend", "nope")
    assert p.returncode == 2
    assert "unknown moe backend 'nope' for device cpu (valid: auto, cpu_grouped, cpu_broken_nan" in p.stderr
    assert not os.path.exists(os.path.join(tmp_path, "laststand"))  # no doctor ran
