"""Corrupt checkpoints must be refused with exit code 2 and one line naming the
file and the tensor or config key (issue 2, "Errors"). Each test copies the
demo model (synth --preset demo, built from the repository alone) into a tmp
folder, breaks one thing with a safetensors writer written in Python (tests/st_util.py),
and runs `laststand logits` on it."""
import json
import os
import shutil
import struct

import pytest

from conftest import run_ls
from st_util import load_tensors, read_st, rebuild_st, write_st

IDS = "1,2,3"
P = "model.language_model."


# ---- fixtures ------------------------------------------------------------------

@pytest.fixture
def model_copy(demo_model, tmp_path):
    d = tmp_path / "m"
    shutil.copytree(demo_model, d)
    return d


def expect_refused(d, *needles):
    p = run_ls("logits", "--model-path", d, "--ids", IDS, timeout=120)
    err = p.stderr.strip()
    assert p.returncode == 2, f"exit {p.returncode}, stderr:\n{err[-2000:]}"
    lines = [l for l in err.splitlines() if "error" in l]
    assert len(lines) == 1, f"want one error line, got:\n{err}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"
    assert "Traceback" not in err and "AddressSanitizer" not in err


def test_intact_demo_model_runs(model_copy):
    """The baseline the other tests break: the untouched copy loads and runs."""
    p = run_ls("logits", "--model-path", model_copy, "--ids", IDS, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["shape"][0] == 3


# ---- safetensors-level damage (the reader's checks) ---------------------------

def test_truncated_file_names_file_and_tensor(model_copy):
    st = model_copy / "model.safetensors"
    size = st.stat().st_size
    with open(st, "r+b") as f:
        f.truncate(size // 2)
    expect_refused(model_copy, "model.safetensors", "tensor '", "run past the end of the file")


def test_file_truncated_inside_header(model_copy):
    st = model_copy / "model.safetensors"
    with open(st, "r+b") as f:
        f.truncate(100)
    expect_refused(model_copy, "model.safetensors", "header length")


def test_offsets_past_end_name_the_tensor(model_copy):
    st = model_copy / "model.safetensors"
    header, data = read_st(st)
    name = P + "layers.3.self_attn.q_norm.weight"
    a, b = header[name]["data_offsets"]
    header[name]["data_offsets"] = [len(data) + 8, len(data) + 8 + (b - a)]
    write_st(st, header, data)
    expect_refused(model_copy, "model.safetensors", f"tensor '{name}'", "run past the end of the file")


def test_dtype_not_matching_byte_size(model_copy):
    st = model_copy / "model.safetensors"
    header, data = read_st(st)
    name = P + "layers.0.input_layernorm.weight"
    assert header[name]["dtype"] == "BF16"
    header[name]["dtype"] = "F32"
    write_st(st, header, data)
    expect_refused(model_copy, "model.safetensors", f"tensor '{name}'", "F32")


def test_overlapping_tensors(model_copy):
    st = model_copy / "model.safetensors"
    header, data = read_st(st)
    a = P + "layers.0.input_layernorm.weight"
    b = P + "layers.0.post_attention_layernorm.weight"
    header[b]["data_offsets"] = list(header[a]["data_offsets"])
    write_st(st, header, data)
    expect_refused(model_copy, "model.safetensors", "overlap")


def test_header_not_json(model_copy):
    st = model_copy / "model.safetensors"
    header, data = read_st(st)
    h = json.dumps(header).encode()[:-1]  # drop the closing brace
    with open(st, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(data)
    expect_refused(model_copy, "model.safetensors", "not valid JSON")


def test_index_pointing_to_missing_shard(model_copy):
    tensors = load_tensors(model_copy / "model.safetensors")
    os.remove(model_copy / "model.safetensors")
    names = sorted(tensors)
    half = len(names) // 2
    rebuild_st(model_copy / "model-00001-of-00002.safetensors", {k: tensors[k] for k in names[:half]})
    wm = {k: ("model-00001-of-00002.safetensors" if i < half else "model-00002-of-00002.safetensors")
          for i, k in enumerate(names)}
    with open(model_copy / "model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
    expect_refused(model_copy, "model-00002-of-00002.safetensors", "does not exist", f"tensor '{names[half]}'")


# ---- model-level damage (config parsing and tensor binding) -------------------

def test_missing_tensor_is_named(model_copy):
    st = model_copy / "model.safetensors"
    tensors = load_tensors(st)
    name = P + "layers.3.self_attn.k_norm.weight"
    del tensors[name]
    rebuild_st(st, tensors)
    expect_refused(model_copy, name)


def test_tensor_of_wrong_shape_is_named(model_copy):
    st = model_copy / "model.safetensors"
    tensors = load_tensors(st)
    name = P + "layers.1.linear_attn.out_proj.weight"
    dt, shape, b = tensors[name]
    assert shape == [256, 256]
    tensors[name] = (dt, [256, 128], b[: len(b) // 2])
    rebuild_st(st, tensors)
    expect_refused(model_copy, name, "model.safetensors")


def edit_config(d, fn):
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    fn(cfg)
    p.write_text(json.dumps(cfg, indent=2))


def test_unknown_architecture_names_model_type(model_copy):
    def f(c):
        c["model_type"] = "llama4"
        c["text_config"]["model_type"] = "llama4_text"
    edit_config(model_copy, f)
    expect_refused(model_copy, "config.json", "model_type", "llama4")


def test_config_value_out_of_range_names_key(model_copy):
    edit_config(model_copy, lambda c: c["text_config"].__setitem__("num_attention_heads", 0))
    expect_refused(model_copy, "config.json", "num_attention_heads")


def test_config_negative_size_names_key(model_copy):
    edit_config(model_copy, lambda c: c["text_config"].__setitem__("hidden_size", -256))
    expect_refused(model_copy, "config.json", "hidden_size")


def test_config_not_json(model_copy):
    (model_copy / "config.json").write_text('{"model_type": "qwen3_5_moe", ')
    expect_refused(model_copy, "config.json")


def test_missing_folder(tmp_path):
    expect_refused(tmp_path / "nope", "nope")
