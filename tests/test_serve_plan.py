"""`serve` dispatches per-M backend plans (ops.h "per-M plans", src/cli/serve_auto.c).

Pinned behaviour, on the CPU device with the demo model and the test-only broken MoE
backends (LASTSTAND_TEST_BROKEN_BACKENDS=1: cpu_broken_nan writes NaN):
- a plan named on the command line (NAME:MAXM,...,NAME) is validated by the doctor entry by
  entry, smoke-tested with a chunked prefill and decode steps, served, and shown in the
  "last backend standing" table; greedy completions through the OpenAI SDK equal those of a
  server running the reference backends (the oracle);
- with auto, the doctor's per-bucket picks become the family's plan (its cached decision is
  doctored here so the CPU timings cannot decide the test), shown in the table and in
  /get_server_info (with the backends the start-up checks banned);
- a plan whose prefill entry is broken (the doctor "missed" it) is caught by the smoke test,
  which runs every entry, and serve falls back to a single backend, banning the broken one;
- a named plan with an entry the doctor failed is refused (exit 2) naming the flag, the
  entry and the bucket;
- a malformed plan exits 2 naming the flag and the fault before anything runs;
- the BF16 gemm family (--gemm-backend, in serve, generate and logits) does all of the above
  like the other four: a bad value exits 2 naming the flag and listing the valid backends, a
  named plan is smoke-tested, served and shown, auto takes the doctor's per-bucket gemm picks
  as a plan, and logits dispatches each call to the plan's entry for its M;
- the lm_head has a plan of its own (--lm-head-backend, from the doctor's "lm_head" rows): a bad
  value exits 2 naming the flag, logits runs the vocab projection on it while the projections
  keep the gemm plan, and with auto serve takes the doctor's lm_head picks as that plan.
Every test points XDG_CACHE_HOME (the doctor's cache) at a temp dir.
"""
import glob
import json
import os
import re
import subprocess

import pytest
from openai import OpenAI

from conftest import BIN
from e2e_util import Server

REF = ["--fp4-gemm-backend", "cpu_ref", "--moe-runner-backend", "cpu_ref",
       "--attention-backend", "cpu_ref", "--gdn-backend", "cpu_ref"]
PROMPTS = ["The last backend standing", "Once upon a time, a kernel"]


def env_for(cache):
    return {"XDG_CACHE_HOME": str(cache), "LASTSTAND_TEST_BROKEN_BACKENDS": "1"}


def full_log(s):
    s.log.seek(0)
    return s.log.read()


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


def completions(s):
    c = OpenAI(base_url=s.base + "/v1", api_key="none")
    out = {}
    for p in PROMPTS:
        r = c.completions.create(model=s.model_path, prompt=p, max_tokens=12, temperature=0)
        out[p] = r.choices[0].text
    return out


def serve_rc(demo_model, cache, *flags, timeout=120):
    env = dict(os.environ, **env_for(cache))
    return subprocess.run([BIN, "serve", "--model-path", demo_model, "--port", "1", *flags],
                          capture_output=True, text=True, env=env, timeout=timeout)


@pytest.fixture(scope="module")
def ref_text(ls_bin, demo_model, tmp_path_factory):
    """The oracle: greedy completions of a server running the reference backends everywhere."""
    with Server(ls_bin, demo_model, *REF, env=env_for(tmp_path_factory.mktemp("refcache"))) as s:
        return completions(s)


def doctor_moe(cache_dir, fastest):
    doctor_family(cache_dir, "moe", fastest)


def doctor_family(cache_dir, family, fastest):
    """Rewrite the cached doctor decision's timings of family: fastest = {bucket: backend}; the named
    backend gets 1 us there and every other correct one 1 s; a named backend that was test-only
    or failing is made correct and non-test-only (a doctor that missed a bug). Drops cached
    smoke verdicts."""
    [path] = glob.glob(os.path.join(cache_dir, "laststand", "doctor-*.json"))
    r = json.load(open(path))
    named = set(fastest.values())
    for tab in r["tables"]:
        if tab["family"] != family:
            continue
        tab["test_only"] = [n for n in tab["test_only"] if n not in named]
        for name, row in tab["cells"].items():
            for mk, c in row.items():
                if name in named:
                    c.update(status="ok", detail="doctored for the test")
                if c.get("status") == "ok":
                    c["ms"] = 1e-3 if fastest.get(int(mk)) == name else 1e3
        for mk in tab["chosen"]:
            tab["chosen"][mk] = fastest[int(mk)]
    for mk in r["choice"][family]:
        r["choice"][family][mk] = fastest[int(mk)]
    json.dump(r, open(path, "w"))
    for f in glob.glob(os.path.join(cache_dir, "laststand", "smoke-*.json")):
        os.unlink(f)


def fill_cache(demo_model, cache):
    """A real doctor decision in the cache (the start is refused after the doctor: nothing served)."""
    p = serve_rc(demo_model, cache, "--moe-runner-backend", "cpu_broken_nan")
    assert p.returncode == 2, p.stderr[-3000:]


def test_named_plan_is_validated_smoke_tested_served_and_shown(ls_bin, demo_model, tmp_path, ref_text):
    with Server(ls_bin, demo_model, "--moe-runner-backend", "cpu_grouped:4,cpu_ref", env=env_for(tmp_path)) as s:
        log = full_log(s)
        t = table(log)
        assert t["moe"][0] == "cpu_grouped:4,cpu_ref", t
        assert "named on the command line" in t["moe"][1]
        # decode steps (M = 1) run cpu_grouped, the prefill chunk (M > 4) cpu_ref
        # (the chunk list has one size per plan boundary of every family, e.g. "2,5": the other
        # families' doctor picks depend on the machine's timing)
        m = re.search(r"smoke test: prefill in chunks of ([\d,]+) tokens and decode steps of 1", log)
        assert m and max(map(int, m.group(1).split(","))) > 4, log[-3000:]
        assert "the tokens equal the reference backends'" in log
        assert re.search(r"eliminated, never taken by a fallback or a CUDA graph capture: .*moe:cpu_broken_nan", log)
        assert completions(s) == ref_text


def test_auto_takes_the_doctors_per_bucket_picks_as_a_plan(ls_bin, demo_model, tmp_path, ref_text):
    fill_cache(demo_model, tmp_path)
    doctor_moe(tmp_path, {1: "cpu_grouped", 16: "cpu_ref"})
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        log = full_log(s)
        t = table(log)
        assert t["moe"][0] == "cpu_grouped:1,cpu_ref", t
        assert re.search(r"per-bucket plan, the doctor's fastest: M=1 cpu_grouped [0-9.e-]+ ms, M=16 cpu_ref", t["moe"][1])
        assert "smoke test: prefill in chunks of" in log
        info = json.loads(s.get("/get_server_info")[1])
        assert info["backends"]["moe"] == "cpu_grouped:1,cpu_ref", info["backends"]
        assert "moe:cpu_broken_nan" in info["banned_backends"].split(","), info["banned_backends"]
        assert completions(s) == ref_text
    # the reverse picks give the reverse plan
    doctor_moe(tmp_path, {1: "cpu_ref", 16: "cpu_grouped"})
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        assert table(full_log(s))["moe"][0] == "cpu_ref:1,cpu_grouped"


def test_a_plan_with_a_broken_prefill_entry_falls_back_to_one_backend(ls_bin, demo_model, tmp_path, ref_text):
    """The doctor 'missed' cpu_broken_nan, fastest at M=16 only: only the smoke test's prefill
    chunk (M > 1) runs it; decode steps alone would never see it."""
    fill_cache(demo_model, tmp_path)
    doctor_moe(tmp_path, {1: "cpu_grouped", 16: "cpu_broken_nan"})
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        log = full_log(s)
        assert re.search(r"smoke test: moe backend cpu_grouped:1,cpu_broken_nan fails: wrong: \d+ of \d+ logits NaN/Inf "
                         r"at step 0", log), log[-3000:]
        assert "smoke test: falling back to moe backend cpu_grouped" in log
        t = table(log)
        assert t["moe"][0] == "cpu_grouped", t
        assert re.search(r"plan cpu_grouped:1,cpu_broken_nan: smoke test wrong: .*NaN", t["moe"][1]), t["moe"]
        m = re.search(r"eliminated, never taken by a fallback or a CUDA graph capture: (\S+)", log)
        assert m and "moe:cpu_broken_nan" in m.group(1).split(","), log[-3000:]
        assert completions(s) == ref_text


def test_named_plan_with_an_entry_the_doctor_failed_is_refused(demo_model, tmp_path):
    p = serve_rc(demo_model, tmp_path, "--moe-runner-backend", "cpu_grouped:1,cpu_broken_nan")
    assert p.returncode == 2, p.stderr[-3000:]
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("laststand serve: error: --moe-runner-backend cpu_grouped:1,cpu_broken_nan refused: the "
                          "doctor's verdict for entry cpu_broken_nan at M=16: wrong"), err
    assert "--trust-backend" in err
    assert "(REFUSED)" in table(p.stderr)["moe"][0]


@pytest.mark.parametrize("value,fault", [
    ("cpu_ref:8", "the last entry 'cpu_ref:8' must have no bound"),
    ("cpu_ref:8,cpu_chunked:4,cpu_ref", "bounds must increase, but 'cpu_chunked:4' follows a bound of 8"),
    ("cpu_ref:8,,cpu_ref", "entry 2 is empty"),
    ("cpu_ref,cpu_chunked", "entry 'cpu_ref' needs a bound"),
    ("cpu_ref:eight,cpu_chunked", "the bound 'eight' is not an integer"),
    ("cpu_ref:8,nope", "unknown gdn backend 'nope' for device cpu"),
])
def test_malformed_plan_exits_2_naming_the_flag_before_anything_runs(demo_model, tmp_path, value, fault):
    p = serve_rc(demo_model, tmp_path, "--gdn-backend", value, timeout=30)
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith(f"laststand serve: error: --gdn-backend: gdn backend plan '{value}': "), err
    assert fault in err, err
    assert not os.path.exists(os.path.join(tmp_path, "laststand"))  # no doctor ran


def test_doctor_prints_its_choice_as_plans_that_match_the_per_bucket_choice(demo_model, tmp_path):
    """`laststand doctor` prints, per family, the per-M plan text of its per-bucket choice: the entry
    it gives each bucket's M is the choice printed for that bucket."""
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    p = subprocess.run([BIN, "doctor", "--device", "cpu", "--model-path", demo_model, "--m", "1,2,16,64"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout.splitlines()
    i = next(k for k, l in enumerate(out) if l.startswith("choice per family"))
    j = next(k for k, l in enumerate(out) if l.startswith("the same choice as per-M plans"))
    choice = {l.split()[0]: dict((int(x.split(":")[0][2:]), x.split(":")[1]) for x in l.split()[1:])
              for l in out[i + 1:j] if l.strip()}
    plans = {l.split()[0]: l.split()[1] for l in out[j + 1:] if l.strip()}
    assert set(plans) == set(choice) == {"fp4_gemm", "gemm", "moe", "attention", "gdn", "lm_head"}, (plans, choice)
    for fam, text in plans.items():
        entries = [(e.split(":")[0], int(e.split(":")[1]) if ":" in e else None) for e in text.split(",")]
        bounds = [b for _, b in entries[:-1]]
        assert all(b is not None for b in bounds) and bounds == sorted(set(bounds)) and entries[-1][1] is None, text
        for M, want in choice[fam].items():
            got = next(n for n, b in entries if b is None or M <= b)
            assert got == want, (fam, M, text, choice[fam])


# ---- the BF16 gemm family: --gemm-backend -------------------------------------------------

def gemm_backends():
    """This CPU's gemm backends, in registry order (cpu_avx2 needs AVX2; cpu_ref is always there)."""
    p = subprocess.run([BIN, "logits", "--model-path", "synth:demo", "--ids", "1", "--gemm-backend", "nope"],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"unknown gemm backend 'nope' for device cpu \(valid: auto, ([^)]*)\)", p.stderr)
    assert p.returncode == 2 and m, p.stderr
    return m.group(1).split(", ")


@pytest.mark.parametrize("value,fault", [
    ("nope", "unknown gemm backend 'nope' for device cpu (valid: auto, "),
    ("cpu_ref:4", "gemm backend plan 'cpu_ref:4': the last entry 'cpu_ref:4' must have no bound"),
    ("cpu_ref:4,auto", "gemm backend plan 'cpu_ref:4,auto': 'auto' cannot be an entry of a plan"),
    ("cpu_ref:16,cpu_ref:4,cpu_ref", "bounds must increase, but 'cpu_ref:4' follows a bound of 16"),
    ("cpu_ref:4,cuda_gemv", "unknown gemm backend 'cuda_gemv' for device cpu"),
])
def test_gemm_backend_bad_value_exits_2_naming_the_flag_before_anything_runs(demo_model, tmp_path, value, fault):
    p = serve_rc(demo_model, tmp_path, "--gemm-backend", value, timeout=30)
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("laststand serve: error: --gemm-backend: "), err
    assert fault in err, err
    assert not os.path.exists(os.path.join(tmp_path, "laststand"))  # no doctor ran


@pytest.mark.parametrize("cmd", ["logits", "generate"])
def test_gemm_backend_unknown_name_exits_2_in_logits_and_generate(demo_model, cmd):
    p = subprocess.run([BIN, cmd, "--model-path", demo_model, "--ids", "1,2", "--gemm-backend", "nope"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2, p.stderr[-2000:]
    assert "unknown gemm backend 'nope' for device cpu (valid: auto, " in p.stderr, p.stderr


def test_named_gemm_plan_is_smoke_tested_served_and_shown(ls_bin, demo_model, tmp_path, ref_text):
    names = gemm_backends()
    plan = f"cpu_ref:4,{names[0]}"  # cpu_avx2 above M = 4 where the CPU has it, else cpu_ref again
    with Server(ls_bin, demo_model, "--gemm-backend", plan, env=env_for(tmp_path)) as s:
        log = full_log(s)
        t = table(log)
        assert t["gemm"][0] == plan, t
        assert "named on the command line" in t["gemm"][1]
        # decode steps (M = 1) run cpu_ref, the prompt's last chunk (M > 4) the other entry (other
        # families' plans, from the doctor's timings, may add chunks before it)
        m = re.search(r"smoke test: prefill in chunks of ([0-9,]+) tokens and decode steps of 1", log)
        assert m, log[-3000:]
        chunks = [int(c) for c in m.group(1).split(",")]
        assert chunks[-1] > 4, chunks
        assert "the tokens equal the reference backends'" in log
        info = json.loads(s.get("/get_server_info")[1])
        assert info["backends"]["gemm"] == plan, info["backends"]
        assert completions(s) == ref_text


def test_auto_takes_the_doctors_per_bucket_gemm_picks_as_a_plan(ls_bin, demo_model, tmp_path, ref_text):
    names = gemm_backends()
    if len(names) < 2:
        pytest.skip(f"one gemm backend on this CPU ({names}): the doctor cannot pick two")
    a, b = names[0], names[-1]
    fill_cache(demo_model, tmp_path)
    doctor_family(tmp_path, "gemm", {1: a, 16: b})
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        log = full_log(s)
        t = table(log)
        assert t["gemm"][0] == f"{a}:1,{b}", t
        assert re.search(rf"per-bucket plan, the doctor's fastest: M=1 {a} [0-9.e-]+ ms, M=16 {b}", t["gemm"][1]), t
        assert "smoke test: prefill in chunks of" in log
        info = json.loads(s.get("/get_server_info")[1])
        assert info["backends"]["gemm"] == f"{a}:1,{b}", info["backends"]
        assert completions(s) == ref_text
    doctor_family(tmp_path, "gemm", {1: b, 16: a})
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        t = table(full_log(s))
        assert t["gemm"][0] == f"{b}:1,{a}", t
        assert json.loads(s.get("/get_server_info")[1])["backends"]["gemm"] == f"{b}:1,{a}"


def test_logits_dispatches_each_gemm_call_to_the_plans_entry_for_its_m(demo_model):
    """One forward over 3 ids: every BF16 GEMM has M = 3, so 'X:2,Y' runs Y and 'Y:3,X' runs Y;
    the outputs equal Y's alone bit for bit (and differ from X's where the backends differ)."""
    names = gemm_backends()
    if len(names) < 2:
        pytest.skip(f"one gemm backend on this CPU ({names})")
    x, y = names[-1], names[0]

    def logits(gemm):
        p = subprocess.run([BIN, "logits", "--model-path", demo_model, "--ids", "5,17,42", "--gemm-backend", gemm],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)["logits"]

    ly, lx = logits(y), logits(x)
    if ly == lx:
        pytest.skip(f"{x} and {y} give bitwise equal logits here: the plan's entry cannot be told apart")
    assert logits(f"{x}:2,{y}") == ly
    assert logits(f"{y}:3,{x}") == ly
    assert logits(f"{x}:3,{y}") == lx


# ---- the lm_head's own plan: --lm-head-backend ----------------------------------------------

@pytest.mark.parametrize("value,fault", [
    ("nope", "unknown gemm backend 'nope' for device cpu (valid: auto, "),
    ("cpu_ref:4", "gemm backend plan 'cpu_ref:4': the last entry 'cpu_ref:4' must have no bound"),
    ("cpu_ref:4,cuda_gemv", "unknown gemm backend 'cuda_gemv' for device cpu"),
])
def test_lm_head_backend_bad_value_exits_2_naming_the_flag(demo_model, tmp_path, value, fault):
    p = serve_rc(demo_model, tmp_path, "--lm-head-backend", value, timeout=30)
    assert p.returncode == 2, p.stderr[-2000:]
    err = p.stderr.strip().splitlines()[-1]
    assert err.startswith("laststand serve: error: --lm-head-backend: "), err
    assert fault in err, err
    assert not os.path.exists(os.path.join(tmp_path, "laststand"))  # no doctor ran
    for cmd in ("logits", "generate"):
        q = subprocess.run([BIN, cmd, "--model-path", demo_model, "--ids", "1,2", "--lm-head-backend", value],
                           capture_output=True, text=True, timeout=60)
        assert q.returncode == 2, q.stderr[-2000:]
        assert f"error: --lm-head-backend: " in q.stderr and fault in q.stderr, q.stderr


def test_logits_runs_the_lm_head_on_its_own_plan(demo_model):
    """Over 3 ids the lm_head's M is 3 (logits wants every row): with the projections on one
    gemm backend (x), --lm-head-backend y changes only the vocab projection: the logits equal
    neither x's alone nor y's alone, and 'x:2,y' / 'y:3,x' give exactly --lm-head-backend y's;
    auto (or x) leaves x's bit for bit."""
    names = gemm_backends()
    if len(names) < 2:
        pytest.skip(f"one gemm backend on this CPU ({names})")
    x, y = names[-1], names[0]

    def logits(*flags):
        p = subprocess.run([BIN, "logits", "--model-path", demo_model, "--ids", "5,17,42", *flags],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        return json.loads(p.stdout)["logits"]

    lx, ly = logits("--gemm-backend", x), logits("--gemm-backend", y)
    if lx == ly:
        pytest.skip(f"{x} and {y} give bitwise equal logits here")
    mixed = logits("--gemm-backend", x, "--lm-head-backend", y)
    assert mixed != lx and mixed != ly
    assert logits("--gemm-backend", x, "--lm-head-backend", f"{x}:2,{y}") == mixed
    assert logits("--gemm-backend", x, "--lm-head-backend", f"{y}:3,{x}") == mixed
    assert logits("--gemm-backend", x, "--lm-head-backend", "auto") == lx
    assert logits("--gemm-backend", x, "--lm-head-backend", x) == lx
    assert logits("--gemm-backend", y, "--lm-head-backend", f"{x}:2,{y}") == ly
    # both correct: the lm_head on y instead of x moves the logits by rounding only
    def worst(a, b):
        return max(abs(u - v) for ra, rb in zip(a, b) for u, v in zip(ra, rb))
    scale = max(abs(v) for r in lx for v in r)
    assert 0 < worst(mixed, lx) < 1e-3 * scale
    # tensor parallel: rank 0 computes the logits, with the lm_head's plan
    tx, tmixed = logits("--tp", "2", "--gemm-backend", x), logits("--tp", "2", "--gemm-backend", x, "--lm-head-backend", y)
    assert tmixed != tx and worst(tmixed, mixed) < 1e-4 * scale


def test_auto_takes_the_doctors_lm_head_picks_as_its_own_plan(ls_bin, demo_model, tmp_path, ref_text):
    names = gemm_backends()
    if len(names) < 2:
        pytest.skip(f"one gemm backend on this CPU ({names}): the doctor cannot pick two")
    a, b = names[0], names[-1]
    fill_cache(demo_model, tmp_path)
    doctor_family(tmp_path, "gemm", {1: a, 16: a})
    doctor_family(tmp_path, "lm_head", {1: b, 16: a})
    with Server(ls_bin, demo_model, env=env_for(tmp_path)) as s:
        t = table(full_log(s))
        assert t["gemm"][0] == a, t  # the projections keep the gemm rows' choice
        assert t["lm_head"][0] == f"{b}:1,{a}", t
        assert re.search(rf"per-bucket plan, the doctor's fastest: M=1 {b} [0-9.e-]+ ms, M=16 {a}", t["lm_head"][1]), t
        info = json.loads(s.get("/get_server_info")[1])
        assert info["backends"]["lm_head"] == f"{b}:1,{a}", info["backends"]
        assert info["backends"]["gemm"] == a, info["backends"]
        assert completions(s) == ref_text
