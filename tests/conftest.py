"""Shared pytest fixtures: where the binary, ../shared and the demo model are."""
import os
import shutil
import socket
import subprocess
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.environ.get("BUILD", os.path.join(ROOT, "build"))
BIN = os.path.join(BUILD, "laststand")
# LS_SHARED: another folder holding fixtures/models (the GPU machine, where ../shared is absent)
SHARED = os.path.abspath(os.environ.get("LS_SHARED") or os.path.join(ROOT, "..", "shared"))


def run_ls(*args, check=False, timeout=600, input=None):
    """Run build/laststand with args; returns CompletedProcess (text)."""
    p = subprocess.run([BIN, *map(str, args)], capture_output=True, text=True,
                       timeout=timeout, input=input)
    if check and p.returncode != 0:
        raise AssertionError(f"laststand {' '.join(map(str, args))} exited {p.returncode}:\n{p.stderr[-4000:]}")
    return p


def _have_gpu():
    """True when nvidia-smi lists a GPU; asked once per pytest run."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


HAVE_GPU = _have_gpu()
# the GPU tests (tests/test_gpu_*.py): `pytestmark = requires_gpu` skips them without a GPU
requires_gpu = pytest.mark.skipif(not HAVE_GPU, reason="no NVIDIA GPU on this machine")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def ls_bin():
    assert os.access(BIN, os.X_OK), f"{BIN} missing: run make"
    return BIN


@pytest.fixture(scope="session")
def shared_dir():
    if not os.path.isdir(SHARED):
        pytest.skip("../shared is not beside the checkout")
    return SHARED


@pytest.fixture(scope="session")
def demo_model(ls_bin):
    """The built-in demo model (synth --preset demo), built once into build/demo-model."""
    d = os.path.join(BUILD, "demo-model")
    if not os.path.exists(os.path.join(d, "config.json")):
        run_ls("synth", "--preset", "demo", "--out", d, check=True)
    return d
