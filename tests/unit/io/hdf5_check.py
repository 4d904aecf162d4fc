#!/usr/bin/env python3
"""HDF5 files across tools, for tests/unit/io/hdf5_test.cpp ("hdf5 interop"), values by the
formula of tests/support/exact_values.hpp:

    hdf5_check.py write DIR   h5py writes DIR/reference.h5 (contiguous, chunked + gzip in a group,
                              big-endian, int16) for gshard to read
    hdf5_check.py check DIR   h5py reads each DIR/gshard_np<ranks>.h5 gshard wrote (on 4 and 8
                              ranks), h5dump lists its datasets, and the safetensors file written
                              beside it (parsed here) holds the same bits as its dataset
"""
import json
import glob
import os
import shutil
import struct
import subprocess
import sys

import h5py
import numpy as np


def values(n, salt, dtype):
    k = (np.arange(n, dtype=np.int64) * 37 + salt * 11) % 101 - 50
    if np.issubdtype(dtype, np.floating):
        return (k.astype(np.float64) / 8).astype(dtype)
    return (k * 1000 + np.arange(n)).astype(dtype)


EXPECTED = {  # dataset: (shape, dtype, salt)
    "f32": ((5, 7), np.float32, 1),
    "group/f64": ((3, 4, 6), np.float64, 2),
    "i64": ((11,), np.int64, 3),
    "i32": ((5, 3), np.int32, 4),
}


def write(d):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    with h5py.File(os.path.join(d, "reference.h5"), "w") as f:
        f["f32"] = values(35, 1, np.float32).reshape(5, 7)
        f.create_dataset("group/f64", data=values(72, 2, np.float64).reshape(3, 4, 6),
                         chunks=(1, 2, 6), compression="gzip")
        f.create_dataset("i64_be", data=values(11, 3, np.int64), dtype=">i8")
        f["i32"] = values(15, 4, np.int32).reshape(5, 3)
        f["i16"] = np.arange(15, dtype=np.int16).reshape(5, 3)


def read_safetensors(path):
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dtype = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}[e["dtype"]]
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(e["shape"])
    return out


def check(d):
    paths = sorted(glob.glob(os.path.join(d, "gshard_np*.h5")))
    if len(paths) != 2:
        sys.exit("hdf5_check: want gshard_np4.h5 and gshard_np8.h5 in %s, found %s" % (d, paths))
    failures = []
    for path in paths:
        failures += check_file(path)
    if failures:
        sys.exit("hdf5_check: " + "; ".join(failures))
    print("hdf5_check: h5py and h5dump read the %d datasets of %s as written; each safetensors "
          "copy is bitwise the same" % (len(EXPECTED), ", ".join(os.path.basename(p) for p in paths)))


def check_file(path):
    failures = []
    with h5py.File(path, "r") as f:
        for name, (shape, dtype, salt) in EXPECTED.items():
            ds = f[name]
            want = values(int(np.prod(shape)), salt, dtype).reshape(shape)
            if ds.shape != shape or ds.dtype != np.dtype(dtype):
                failures.append("%s: %s %s, want %s %s" % (name, ds.shape, ds.dtype, shape,
                                                          np.dtype(dtype)))
            elif not np.array_equal(ds[...], want):
                failures.append("%s: values differ" % name)
        f64 = f["group/f64"][...]
    # h5dump, HDF5's own tool, reads the file too: every dataset with its type and shape.
    dump = subprocess.run(["h5dump", "-H", path], capture_output=True, text=True, check=True).stdout
    for name, (shape, dtype, _) in EXPECTED.items():
        leaf = name.split("/")[-1]
        dims = "( " + ", ".join(str(s) for s in shape) + " )"
        if 'DATASET "%s"' % leaf not in dump or dims not in dump:
            failures.append("h5dump: no dataset %s of %s" % (name, dims))
    st = read_safetensors(path[:-3] + ".safetensors")
    if st["f64"].tobytes() != f64.tobytes():
        failures.append("%s: the safetensors f64 differs from the HDF5 dataset" % path)
    return [os.path.basename(path) + ": " + f for f in failures]


if __name__ == "__main__":
    {"write": write, "check": check}[sys.argv[1]](sys.argv[2])
