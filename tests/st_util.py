"""A minimal safetensors reader/writer for the tests, written in Python independently of the C
code (src/fmt/safetensors.c): the tests build, damage and compare checkpoints with it."""
import json
import struct


def read_st(path):
    """(header dict, data bytes) of a file, as stored."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    return header, raw[8 + n:]


def write_st(path, header, data):
    """Write header (dict) + data as is: offsets are taken from the header."""
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        f.write(data)


def load_tensors(path):
    """{name: (dtype, shape, bytes)} of every tensor of a file."""
    header, data = read_st(path)
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}


def rebuild_st(path, tensors):
    """tensors: {name: (dtype, shape, bytes)} -> a valid, contiguous file."""
    header, out, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        dt, shape, b = tensors[name]
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        out.append(b)
        off += len(b)
    write_st(path, header, b"".join(out))
