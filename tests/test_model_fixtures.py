"""The CPU forward pass against transformers (the oracle that wrote
../shared/fixtures/models/*/ref.json): `laststand logits` matches every row
to max|a-b|/max|b| < 1e-4 with the same argmax, `laststand generate --ids`
reproduces the greedy continuation; backend flags select real alternatives;
bad models and flags end with exit code 2 and a message naming the culprit."""
import json
import math
import os
import shutil

import numpy as np
import pytest

from conftest import SHARED, run_ls

MODELS = os.path.join(SHARED, "fixtures", "models")
FOLDERS = sorted(os.listdir(MODELS)) if os.path.isdir(MODELS) else []
# More fixture sets written by ../shared/tools/gen_fixtures.py (other seeds and
# sizes), e.g. LS_EXTRA_FIXTURES=/tmp/fb:/tmp/fr: every sub-folder with a
# ref.json joins the logits and greedy tests under the name "<set>/<folder>".
for extra in filter(None, os.environ.get("LS_EXTRA_FIXTURES", "").split(":")):
    for f in sorted(os.listdir(extra)):
        if os.path.exists(os.path.join(extra, f, "ref.json")):
            FOLDERS.append(os.path.join(os.path.abspath(extra), f))


def model_dir(name):
    return name if os.path.isabs(name) else os.path.join(MODELS, name)


def load_ref(name):
    with open(os.path.join(model_dir(name), "ref.json")) as f:
        return json.load(f)


def logits(model, ids, *flags, env=None):
    p = run_ls("logits", "--model-path", model, "--ids", ",".join(map(str, ids)), *flags)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    a = np.array(out["logits"], dtype=np.float64)
    assert list(a.shape) == out["shape"]
    return a


def rel_err_rows(a, b):
    return np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)


@pytest.mark.parametrize("name", FOLDERS)
def test_logits_match_transformers(ls_bin, shared_dir, name):
    ref = load_ref(name)
    b = np.array(ref["logits"], dtype=np.float64)
    a = logits(model_dir(name), ref["input_ids"])
    assert a.shape == b.shape
    err = rel_err_rows(a, b)
    assert err.max() < 1e-4, f"{name}: worst row error {err.max():.3g} at position {err.argmax()}"
    assert (a.argmax(1) == b.argmax(1)).all(), f"{name}: argmax differs at {np.nonzero(a.argmax(1) != b.argmax(1))}"


@pytest.mark.parametrize("name", [f for f in FOLDERS if "greedy" in load_ref(f)])
def test_generate_reproduces_greedy(ls_bin, shared_dir, name):
    ref = load_ref(name)
    p = run_ls("generate", "--model-path", model_dir(name),
               "--ids", ",".join(map(str, ref["input_ids"])), "--max-new-tokens", len(ref["greedy"]))
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout)
    assert out["ids"] == ref["greedy"]
    assert out["text"] == ""  # the fixtures carry no tokenizer


def test_moe_backends_agree_and_match(ls_bin, shared_dir):
    name = "qwen3_5_moe-nvfp4"
    ref = load_ref(name)
    b = np.array(ref["logits"])
    model = os.path.join(MODELS, name)
    grouped = logits(model, ref["input_ids"], "--moe-runner-backend", "cpu_grouped")
    refimpl = logits(model, ref["input_ids"], "--moe-runner-backend", "cpu_ref",
                     "--attention-backend", "cpu_ref", "--gdn-backend", "cpu_ref",
                     "--fp4-gemm-backend", "cpu_ref")
    assert rel_err_rows(grouped, refimpl).max() < 1e-5
    assert rel_err_rows(refimpl, b).max() < 1e-4


def test_unknown_backend_lists_valid_names(ls_bin, shared_dir):
    p = run_ls("logits", "--model-path", os.path.join(MODELS, "qwen3_moe"), "--ids", "1,2",
               "--moe-runner-backend", "triton")
    assert p.returncode == 2
    assert "moe backend 'triton'" in p.stderr and "cpu_grouped" in p.stderr and "cpu_ref" in p.stderr


def test_broken_backends_only_with_env(ls_bin, shared_dir, monkeypatch):
    model = os.path.join(MODELS, "qwen3_moe")
    p = run_ls("logits", "--model-path", model, "--ids", "1,2", "--moe-runner-backend", "cpu_broken_nan")
    assert p.returncode == 2 and "cpu_broken_nan" in p.stderr
    monkeypatch.setenv("LASTSTAND_TEST_BROKEN_BACKENDS", "1")
    p = run_ls("logits", "--model-path", model, "--ids", "1,2", "--moe-runner-backend", "cpu_broken_nan")
    assert p.returncode == 0
    vals = json.loads(p.stdout)["logits"]
    assert all(math.isnan(v) for row in vals for v in row)
    p = run_ls("logits", "--model-path", model, "--ids", "1,2", "--moe-runner-backend", "cpu_broken_abort")
    assert p.returncode < 0  # killed by SIGABRT
    # auto never picks a test-only backend
    ref = load_ref("qwen3_moe")
    a = logits(model, ref["input_ids"])
    assert rel_err_rows(a, np.array(ref["logits"])).max() < 1e-4


def test_sampling_is_seeded(ls_bin, shared_dir):
    model = os.path.join(MODELS, "qwen3_next")
    args = ("generate", "--model-path", model, "--ids", "1,2,3", "--max-new-tokens", "8",
            "--temperature", "1.5")
    a = run_ls(*args, "--seed", "7", check=True).stdout
    b = run_ls(*args, "--seed", "7", check=True).stdout
    c = run_ls(*args, "--seed", "8", check=True).stdout
    assert a == b
    assert json.loads(a)["ids"] != json.loads(c)["ids"]


# ---- bad input: exit 2 and a message naming the culprit ----------------------

def broken_copy(tmp_path, name, edit):
    d = tmp_path / name
    shutil.copytree(os.path.join(MODELS, name), d)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def test_wrong_tensor_shape_names_tensor_shapes_and_file(ls_bin, shared_dir, tmp_path):
    d = broken_copy(tmp_path, "qwen3", lambda c: c.update(intermediate_size=64))
    p = run_ls("logits", "--model-path", d, "--ids", "1")
    assert p.returncode == 2
    assert "model.layers.0.mlp.gate_proj.weight" in p.stderr
    assert "[96, 128]" in p.stderr and "[64, 128]" in p.stderr
    assert "model.safetensors" in p.stderr


def test_missing_tensor_is_named(ls_bin, shared_dir, tmp_path):
    d = broken_copy(tmp_path, "qwen3_next", lambda c: c.update(num_hidden_layers=5, layer_types=None))
    p = run_ls("generate", "--model-path", d, "--ids", "1")
    assert p.returncode == 2
    assert "missing tensor 'model.layers.4." in p.stderr


def test_unknown_architecture_names_key(ls_bin, shared_dir, tmp_path):
    d = broken_copy(tmp_path, "qwen3", lambda c: c.update(model_type="llama"))
    p = run_ls("logits", "--model-path", d, "--ids", "1")
    assert p.returncode == 2
    assert "config.json" in p.stderr and "'model_type'" in p.stderr and "llama" in p.stderr


def test_out_of_range_config_value_names_key(ls_bin, shared_dir, tmp_path):
    d = broken_copy(tmp_path, "qwen3_5_moe-fused",
                    lambda c: c["text_config"].update(num_experts_per_tok=9))
    p = run_ls("logits", "--model-path", d, "--ids", "1")
    assert p.returncode == 2
    assert "text_config.num_experts_per_tok" in p.stderr


@pytest.mark.parametrize("args,needle", [
    (["--ids", "1,2"], "--model-path"),
    (["--model-path", "X"], "--ids"),
    (["--model-path", "X", "--ids", "1,,2"], "--ids"),
    (["--model-path", "X", "--ids", "1", "--bogus", "3"], "--bogus"),
    (["--model-path", "/nonexistent", "--ids", "1"], "/nonexistent/config.json"),
])
def test_bad_flags_exit_2(ls_bin, args, needle):
    for cmd in ("logits", "generate"):
        p = run_ls(cmd, *args)
        assert p.returncode == 2, (cmd, p.stderr)
        assert needle in p.stderr, (cmd, p.stderr)


def test_bad_generate_values_and_ids(ls_bin, shared_dir):
    model = os.path.join(MODELS, "qwen3")
    for flag, val in (("--max-new-tokens", "-1"), ("--temperature", "hot"), ("--seed", "x")):
        p = run_ls("generate", "--model-path", model, "--ids", "1", flag, val)
        assert p.returncode == 2 and flag in p.stderr
    p = run_ls("logits", "--model-path", model, "--ids", "1,1024")
    assert p.returncode == 2 and "1024" in p.stderr


def test_cuda_device_without_gpu(ls_bin, shared_dir):
    """--device cuda without a GPU (a CUDA build on a machine without one, or a
    NO_CUDA=1 build): one clear "no CUDA device: <why>" line, exit 1, no crash."""
    for cmd in ("logits", "generate"):
        p = run_ls(cmd, "--model-path", os.path.join(MODELS, "qwen3"), "--ids", "1", "--device", "cuda")
        if p.returncode == 0:
            pytest.skip("this machine has a CUDA device")
        assert "no CUDA device: " in p.stderr, (cmd, p.stderr)
        lines = [l for l in p.stderr.splitlines() if "error" in l]
        assert len(lines) == 1, (cmd, p.stderr)
        assert p.returncode == 1, (cmd, p.returncode, p.stderr)


def test_generate_prompt_and_text_match_hf_tokenizers(ls_bin, demo_model):
    """--prompt encodes like HF tokenizers, and "text" is HF's decode of the new ids."""
    tokenizers = pytest.importorskip("tokenizers")
    tk = tokenizers.Tokenizer.from_file(os.path.join(demo_model, "tokenizer.json"))
    prompt = "Hello, world! The demo model speaks noise."
    ids = tk.encode(prompt, add_special_tokens=False).ids
    by_prompt = json.loads(run_ls("generate", "--model-path", demo_model, "--prompt", prompt,
                                  "--max-new-tokens", "10", check=True).stdout)
    by_ids = json.loads(run_ls("generate", "--model-path", demo_model, "--ids", ",".join(map(str, ids)),
                               "--max-new-tokens", "10", check=True).stdout)
    assert by_prompt == by_ids
    assert len(by_ids["ids"]) >= 1
    assert by_ids["text"] == tk.decode(by_ids["ids"], skip_special_tokens=True)


@pytest.mark.parametrize("name", ["qwen3_next", "qwen3_5_moe_text-nvfp4"])
def test_gdn_chunked_backend_matches_transformers(ls_bin, shared_dir, name):
    ref = load_ref(name)
    a = logits(os.path.join(MODELS, name), ref["input_ids"], "--gdn-backend", "cpu_chunked")
    assert rel_err_rows(a, np.array(ref["logits"])).max() < 1e-4


def test_generate_chat_renders_the_models_template(ls_bin, demo_model):
    """--chat == the chat template rendered by jinja2 (transformers' settings), encoded by HF tokenizers."""
    tokenizers = pytest.importorskip("tokenizers")
    jinja2 = pytest.importorskip("jinja2")
    tmpl_path = os.path.join(demo_model, "chat_template.jinja")
    if not os.path.exists(tmpl_path):
        pytest.skip("the demo model has no chat_template.jinja")
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
    text = env.from_string(open(tmpl_path).read()).render(
        messages=[{"role": "user", "content": "What is 2+2?"}], add_generation_prompt=True)
    tk = tokenizers.Tokenizer.from_file(os.path.join(demo_model, "tokenizer.json"))
    ids = tk.encode(text, add_special_tokens=False).ids
    by_chat = json.loads(run_ls("generate", "--model-path", demo_model, "--prompt", "What is 2+2?", "--chat",
                                "--max-new-tokens", "6", check=True).stdout)
    by_ids = json.loads(run_ls("generate", "--model-path", demo_model, "--ids", ",".join(map(str, ids)),
                               "--max-new-tokens", "6", check=True).stdout)
    assert by_chat == by_ids
    p = run_ls("generate", "--model-path", demo_model, "--ids", "1", "--chat")
    assert p.returncode == 2 and "--chat" in p.stderr


def test_unused_tensors_are_reported(ls_bin, shared_dir, tmp_path):
    d = broken_copy(tmp_path, "qwen3", lambda c: c.update(num_hidden_layers=3, layer_types=None))
    p = run_ls("logits", "--model-path", d, "--ids", "1,2")
    assert p.returncode == 0, p.stderr
    assert "not used" in p.stderr and "model.layers.3." in p.stderr
    p = run_ls("logits", "--model-path", os.path.join(MODELS, "qwen3_5_moe_vl"), "--ids", "1,2")
    assert p.returncode == 0 and "not used" not in p.stderr  # the vision tower is expected
