#!/usr/bin/env python3
"""Reads gshard's checkpoint and .npy with numpy alone (the header parsed here, by the
safetensors format's definition), compares with the formula of tests/support/exact_values.hpp, then writes a
safetensors file and a .npy of its own for gshard to read on another mesh.

    interop_check.py DIR
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def values(n, salt, dtype):
    k = (np.arange(n, dtype=np.int64) * 37 + salt * 11) % 101 - 50
    if np.issubdtype(dtype, np.floating):
        return (k.astype(np.float64) / 8).astype(dtype)
    return (k * 1000 + np.arange(n)).astype(dtype)


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(data[b:e], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    # The format: tensors tile the data, back to back.
    spans = sorted(t["data_offsets"] for t in header.values())
    assert spans[0][0] == 0 and spans[-1][1] == len(data), spans
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:])), spans
    return out, meta


def write_safetensors(path, tensors, meta):
    header, offset, blobs = {"__metadata__": meta}, 0, []
    for name, a in tensors.items():
        blob = np.ascontiguousarray(a).tobytes()
        kind = {np.float32: "F32", np.float64: "F64", np.int32: "I32", np.int64: "I64"}[a.dtype.type]
        header[name] = {"dtype": kind, "shape": list(a.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    d = sys.argv[1]
    got, meta = read_safetensors(d + "/gshard.safetensors")
    want = {"a": values(35, 1, np.float32).reshape(7, 5), "b": values(90, 2, np.float64).reshape(3, 5, 6),
            "c": values(11, 3, np.int64), "d": values(15, 4, np.int32).reshape(5, 3)}
    assert sorted(got) == sorted(want), sorted(got)
    for name, w in want.items():
        assert got[name].dtype == w.dtype and got[name].shape == w.shape, (name, got[name].dtype, got[name].shape)
        assert np.array_equal(got[name], w), name
    assert meta["step"] == "42", meta
    npy = np.load(d + "/gshard_a.npy")
    assert npy.dtype == np.float32 and np.array_equal(npy, want["a"]), npy
    print("interop_check: gshard's checkpoint (4 tensors, 2x2 mesh) and .npy read by numpy: equal")

    e = values(36, 5, np.float32).reshape(9, 4)
    write_safetensors(d + "/python.safetensors",
                      {"g": values(60, 7, np.float64).reshape(3, 4, 5), "e": e, "f": values(6, 6, np.int64)},
                      {"written_by": "numpy"})
    np.save(d + "/python_e.npy", e)
    print("interop_check: wrote python.safetensors and python_e.npy")


if __name__ == "__main__":
    main()
