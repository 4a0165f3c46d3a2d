"""`laststand sweep` over scripted servers (tests/test_bench_fake.py run as a
server) whose behaviour per grid point is known: healthy and sound, `!!!!`
output, empty output, the same answer for every prompt, error responses, invalid
UTF-8, an exit at start-up, an abort, a death during the smoke test, a server that
never becomes healthy. Each must land in its verdict with its evidence, the
launch template's quoting must reach the server intact, and no process or port
may be left behind."""
import json
import os
import signal
import sys
import time

from conftest import free_port, run_ls

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "test_bench_fake.py")


def sweep(*args, timeout=300):
    return run_ls("sweep", *args, timeout=timeout)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purpose
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sweep_verdicts_land_in_the_right_cells(ls_bin, tmp_path):
    port = free_port()
    pidfile = tmp_path / "pids-{mode}"
    launch = (f"{sys.executable} {FAKE} serve --port {port} --mode {{mode}} --ttft 0 --tpot 0.001 "
              f"--pidfile {pidfile} --child --banner 'it'\"'\"'s a \"quoted\" $HOME-free {{x}} arg'")
    modes = ["ok", "bang", "empty", "same", "nan", "badutf8", "exit3", "abort", "die", "hang"]
    js = tmp_path / "sweep.json"
    p = sweep("--launch", launch, "--grid", "mode=" + ",".join(modes), "--grid", "x=1",
              "--base-url", f"http://127.0.0.1:{port}", "--health-timeout", 6, "--grace", 3,
              "--json", js, "--log-dir", tmp_path / "logs",
              "--num-prompts", 4, "--random-input-len", 8, "--random-output-len", 4, "--max-concurrency", 2)
    assert p.returncode == 0, p.stderr[-3000:]
    j = json.loads(js.read_text())
    got = {pt["params"]["mode"]: pt for pt in j["points"]}
    assert list(got) == modes
    want = {"ok": "ok", "bang": "garbage", "empty": "garbage", "same": "garbage", "nan": "garbage",
            "badutf8": "garbage", "exit3": "crash", "abort": "crash", "die": "crash", "hang": "timeout"}
    assert {m: got[m]["verdict"] for m in modes} == want
    ev = {m: got[m]["evidence"] for m in modes}
    assert "repeated" in ev["bang"] and "!!" in ev["bang"]
    assert "empty output" in ev["empty"]
    assert "identical answer" in ev["same"]
    assert "NaN in logits" in ev["nan"] and "HTTP 500" in ev["nan"]
    assert "UTF-8" in ev["badutf8"]
    assert "exit code 3" in ev["exit3"] and "cannot load model" in ev["exit3"]
    assert "SIGABRT" in ev["abort"]
    assert "during the smoke test" in ev["die"] and "exit code 9" in ev["die"]
    assert "no 200 from GET /health" in ev["hang"]
    # ok carries the bench's headline and its full record
    assert "tok/s" in ev["ok"] and "4/4 ok" in ev["ok"]
    b = got["ok"]["bench"][0]
    assert b["completed"] == 4 and b["total_output_tokens"] == b["server_usage"]["completion_tokens"] > 0
    assert all(s["text"] for s in got["ok"]["smoke"])
    # the crash evidence is the log's tail
    assert any("cannot load model" in l for l in got["exit3"]["log_tail"])
    # markdown matrix: a header, a rule and one row per point with its verdict
    rows = [l for l in p.stdout.splitlines() if l.startswith("|")]
    assert rows[0].replace(" ", "") == "|#|mode|x|verdict|evidence|"
    assert len(rows) == 2 + len(modes)
    for m, row in zip(modes, rows[2:]):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[1] == m and cells[3] == want[m], row
    # quoting: the server saw the exact argument the shell template meant
    log = open(got["ok"]["log_file"]).read()
    argv = json.loads(log.split("fake server argv:", 1)[1].splitlines()[0])
    assert argv[argv.index("--banner") + 1] == "it's a \"quoted\" $HOME-free 1 arg"
    # nothing left behind: servers and their children are gone, the port is free
    for m in ["ok", "bang", "hang"]:
        for pid in map(int, open(str(pidfile).replace("{mode}", m)).read().split()):
            assert not alive(pid), (m, pid)
    import socket
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_sweep_rejects_placeholders_without_a_grid(ls_bin):
    p = sweep("--launch", "server --a {alpha} --b {beta} --json '{\"k\": 1}'", "--grid", "alpha=1,2",
              "--base-url", f"http://127.0.0.1:{free_port()}")
    assert p.returncode == 2
    assert "{beta}" in p.stderr and "{alpha}" not in p.stderr.split("placeholder")[1]
    p = sweep("--launch", "server --a {alpha}", "--grid", "alpha=1", "--grid", "gamma=3",
              "--base-url", f"http://127.0.0.1:{free_port()}")
    assert p.returncode == 2 and "gamma" in p.stderr
    p = sweep("--launch", "server", "--grid", "alpha", "--base-url", "http://127.0.0.1:1")
    assert p.returncode == 2 and "--grid" in p.stderr


def test_sweep_refuses_a_port_already_in_use(ls_bin, tmp_path):
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = sweep("--launch", "true {a}", "--grid", "a=1", "--base-url", f"http://127.0.0.1:{port}")
    assert p.returncode == 2 and "already listens" in p.stderr


def test_sweep_product_of_grids_in_order(ls_bin, tmp_path):
    port = free_port()
    launch = f"{sys.executable} {FAKE} serve --port {port} --mode ok --ttft 0 --tpot 0 --banner '{{a}}-{{b}}'"
    js = tmp_path / "s.json"
    p = sweep("--launch", launch, "--grid", "a=1,2", "--grid", "b=x,y,z", "--base-url", f"http://127.0.0.1:{port}",
              "--no-bench", "--json", js, "--grace", 2)
    assert p.returncode == 0, p.stderr[-2000:]
    pts = json.loads(js.read_text())["points"]
    assert [(q["params"]["a"], q["params"]["b"]) for q in pts] == [
        ("1", "x"), ("1", "y"), ("1", "z"), ("2", "x"), ("2", "y"), ("2", "z")]
    assert all(q["verdict"] == "ok" and "smoke ok" in q["evidence"] for q in pts)
    assert [q["command"].split("--banner ")[1] for q in pts] == ["'1-x'", "'1-y'", "'1-z'", "'2-x'", "'2-y'", "'2-z'"]


def test_sweep_judges_repetition_but_not_real_text(ls_bin, tmp_path):
    """The garbage rule (one character or a short unit repeated 16+ times) on texts chosen to sit on
    both sides of it: `++++` and a repeated word are garbage; indentation, a 15-fold repetition,
    and ordinary prose are not."""
    port = free_port()
    cases = {
        "plus": ("+" * 20, "garbage"),
        "word": ("hello " * 16, "garbage"),
        "fffd": ("\ufffd" * 16, "garbage"),
        "under16": ("!" * 15 + " then words", "ok"),
        "indent": ("def f():\n" + " " * 24 + "return 1", "ok"),
        "prose": ("The capital of France is Paris, a city on the Seine.", "ok"),
    }
    files = {}
    for name, (text, _) in cases.items():
        f = tmp_path / f"{name}.txt"
        f.write_text(text)
        files[name] = f
    launch = (f"{sys.executable} {FAKE} serve --port {port} --mode answer --ttft 0 --tpot 0 "
              f"--answer \"$(cat {tmp_path}/{{case}}.txt)\"")
    js = tmp_path / "s.json"
    p = sweep("--launch", launch, "--grid", "case=" + ",".join(cases), "--base-url", f"http://127.0.0.1:{port}",
              "--no-bench", "--json", js, "--grace", 2)
    assert p.returncode == 0, p.stderr[-2000:]
    got = {q["params"]["case"]: q for q in json.loads(js.read_text())["points"]}
    for name, (text, verdict) in cases.items():
        assert got[name]["verdict"] == verdict, (name, got[name]["evidence"])
        assert got[name]["smoke"][0]["text"].startswith(text)
    assert "repeated 20 times" in got["plus"]["evidence"]
    assert "repeated 16 times" in got["word"]["evidence"] and "hello " in got["word"]["evidence"]
