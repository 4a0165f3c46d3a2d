"""A multi-token-prediction (MTP) head for the Qwen3.5 / Qwen3-Next fixtures, built in numpy
(stdlib + numpy only: CI and the GPU machine both import it) and written by hand as safetensors,
independently of the C code.

make_mtp_checkpoint(src, dst) makes a folder that `laststand --mtp` loads: the fixture's config
with the MTP key set (Qwen3.5 `mtp_num_hidden_layers`, Qwen3-Next `num_nextn_predict_layers`),
its model.safetensors (a link) untouched, and mtp.safetensors with the head's tensors in BF16:
  mtp.layers.0.<suffix>  = model.layers.3.<suffix> * 0.8 + N(0, 0.5 * std(that tensor))
                           (the fixtures' one full-attention layer; suffixes in sorted order)
  mtp.fc.weight          ~ N(0, 1/sqrt(2H)), [H, 2H]
  mtp.pre_fc_norm_embedding.weight, mtp.pre_fc_norm_hidden.weight, mtp.norm.weight ~ N(0, 0.1)
all drawn from numpy RandomState(seed) in that order, so the values are the same on every machine.
The loader (src/fmt/safetensors.c st_open_dir) opens only model.safetensors when that file
exists, so the folder also gets a model.safetensors.index.json mapping every tensor to its file.
tests/tools/gen_mtp_ref.py (transformers) and tests/test_mtp_head.py (laststand) both build the
head with this module, so the oracle and the binary see the same bytes."""
import json
import os
import shutil
import struct

import numpy as np

MTP_LAYER_SRC = 3  # the fixtures' full-attention layer: the head's decoder layer starts from it
NORMS = ("mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight")


# ---- BF16 and safetensors ----------------------------------------------------

def f32_to_bf16(a):
    """float32 -> BF16 bit patterns (uint16), rounded to nearest even (finite values)."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)


def bf16_to_f32(u16):
    """BF16 bit patterns (uint16 array) -> float32, exactly."""
    return (np.asarray(u16, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bf16(a):
    """The float32 values a BF16 tensor of a holds."""
    return bf16_to_f32(f32_to_bf16(a)).reshape(np.shape(a))


def read_header(path):
    """(header dict without __metadata__, offset of the data) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def read_st_f32(path, names=None):
    """{name: float32 array} of a safetensors file's BF16 / F32 tensors (names: only those)."""
    header, base = read_header(path)
    out = {}
    with open(path, "rb") as f:
        for name, v in header.items():
            if names is not None and name not in names:
                continue
            a, b = v["data_offsets"]
            f.seek(base + a)
            raw = f.read(b - a)
            if v["dtype"] == "BF16":
                arr = bf16_to_f32(np.frombuffer(raw, dtype="<u2"))
            elif v["dtype"] == "F32":
                arr = np.frombuffer(raw, dtype="<f4").astype(np.float32)
            else:
                raise ValueError(f"{path}: tensor {name}: dtype {v['dtype']}, expected BF16 or F32")
            out[name] = arr.reshape(v["shape"])
    return out


def write_st_bf16(path, tensors):
    """Write {name: float array} as BF16 (rounded to nearest even), names sorted, data contiguous;
    the header padded with spaces to 8 bytes (as the HF writer does)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        a = np.asarray(tensors[name], dtype=np.float32)
        b = f32_to_bf16(a).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---- the config --------------------------------------------------------------

def text_config(cfg):
    """The dict holding the text model's keys (Qwen3.5's wrapper keeps them in text_config)."""
    return cfg["text_config"] if isinstance(cfg.get("text_config"), dict) else cfg


def mtp_config_key(cfg):
    """The config key that gives the number of MTP layers for this model type."""
    mt = text_config(cfg).get("model_type", "") or cfg.get("model_type", "")
    if mt.startswith("qwen3_5"):
        return "mtp_num_hidden_layers"
    if mt.startswith("qwen3_next"):
        return "num_nextn_predict_layers"
    raise ValueError(f"no MTP head for model_type {mt!r}")


# ---- the head ----------------------------------------------------------------

def mtp_tensors(src_dir, seed=1234):
    """{name: float32 array (BF16 values)} of the MTP head built from src_dir's layer 3."""
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    tc = text_config(cfg)
    H = int(tc["hidden_size"])
    lt = tc.get("layer_types")
    if lt is not None and lt[MTP_LAYER_SRC] != "full_attention":
        raise ValueError(f"{src_dir}: layer {MTP_LAYER_SRC} is {lt[MTP_LAYER_SRC]}, not full_attention")
    st = os.path.join(src_dir, "model.safetensors")
    header, _ = read_header(st)
    prefix = None
    for p in ("model.layers.", "model.language_model.layers."):
        if any(k.startswith(f"{p}{MTP_LAYER_SRC}.") for k in header):
            prefix = f"{p}{MTP_LAYER_SRC}."
            break
    if prefix is None:
        raise ValueError(f"{st}: no tensors of layer {MTP_LAYER_SRC}")
    src = read_st_f32(st, {k for k in header if k.startswith(prefix)})
    rng = np.random.RandomState(seed)
    out = {}
    for name in sorted(src):
        w = src[name].astype(np.float64)
        noise = rng.normal(0.0, 0.5 * float(w.std()), size=w.shape)
        out["mtp.layers.0." + name[len(prefix):]] = round_bf16((w * 0.8 + noise).astype(np.float32))
    out["mtp.fc.weight"] = round_bf16(rng.normal(0.0, 1.0 / np.sqrt(2 * H), size=(H, 2 * H)).astype(np.float32))
    for n in NORMS:
        out[n] = round_bf16(rng.normal(0.0, 0.1, size=(H,)).astype(np.float32))
    return out


def write_index(dst_dir, files):
    """model.safetensors.index.json for dst_dir: every tensor of each named file (in dst_dir)."""
    wm, total = {}, 0
    for fn in files:
        header, _ = read_header(os.path.join(dst_dir, fn))
        for name, v in header.items():
            wm[name] = fn
            total += v["data_offsets"][1] - v["data_offsets"][0]
    with open(os.path.join(dst_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(wm.items()))}, f, indent=1)


def write_mtp(dst_dir, tensors):
    """(Re)write dst_dir/mtp.safetensors from {name: array} and the index beside it."""
    write_st_bf16(os.path.join(dst_dir, "mtp.safetensors"), tensors)
    write_index(dst_dir, ["model.safetensors", "mtp.safetensors"])


def make_mtp_checkpoint(src_dir, dst_dir, seed=1234, n_mtp=1, link=True):
    """A copy of the fixture src_dir with an MTP head (see the module docstring) in dst_dir.
    Returns the head's tensors {name: float32 array} as written."""
    os.makedirs(dst_dir, exist_ok=True)
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    text_config(cfg)[mtp_config_key(cfg)] = n_mtp
    with open(os.path.join(dst_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    for fn in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(src_dir, fn)):
            shutil.copy(os.path.join(src_dir, fn), os.path.join(dst_dir, fn))
    src_st, dst_st = os.path.abspath(os.path.join(src_dir, "model.safetensors")), os.path.join(dst_dir, "model.safetensors")
    if os.path.lexists(dst_st):
        os.remove(dst_st)
    try:
        if not link:
            raise OSError
        os.symlink(src_st, dst_st)
    except OSError:
        shutil.copy(src_st, dst_st)
    t = mtp_tensors(src_dir, seed)
    write_mtp(dst_dir, t)
    return t
