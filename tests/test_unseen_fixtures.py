"""The CPU forward pass against transformers on models the code was not developed on
(other seeds, 8 layers, 16 experts top-4, vocab 1536; see tests/fixtures/README.md):
every logits row within 1e-4 relative error with the same argmax, greedy reproduced."""
import json
import os
import tarfile

import numpy as np
import pytest

from conftest import ROOT, run_ls

FIX = os.path.join(ROOT, "tests", "fixtures")
ARCHIVES = sorted(f for f in os.listdir(FIX) if f.endswith(".tgz"))


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory):
    d = tmp_path_factory.mktemp("unseen")
    models = {}
    for a in ARCHIVES:
        with tarfile.open(os.path.join(FIX, a)) as t:
            t.extractall(d)
            top = {m.name.split("/")[0] + "/" + m.name.split("/")[1] for m in t.getmembers() if m.name.count("/") >= 1}
        for rel in top:
            models[a] = os.path.join(d, rel)
    return models


@pytest.mark.parametrize("archive", ARCHIVES)
def test_unseen_model_matches_transformers(ls_bin, unpacked, archive):
    d = unpacked[archive]
    ref = json.load(open(os.path.join(d, "ref.json")))
    ids = ",".join(map(str, ref["input_ids"]))
    p = run_ls("logits", "--model-path", d, "--ids", ids)
    assert p.returncode == 0, p.stderr[-2000:]
    a = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    b = np.array(ref["logits"], dtype=np.float64)
    err = np.abs(a - b).max(1) / np.abs(b).max(1)
    assert err.max() < 1e-4, f"{archive}: worst row error {err.max():.3g} at position {err.argmax()}"
    assert (a.argmax(1) == b.argmax(1)).all()
    g = run_ls("generate", "--model-path", d, "--ids", ids, "--max-new-tokens", len(ref["greedy"]))
    assert g.returncode == 0, g.stderr[-2000:]
    assert json.loads(g.stdout)["ids"] == ref["greedy"]
