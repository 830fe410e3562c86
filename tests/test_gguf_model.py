#!/usr/bin/env python3
"""Cross-checks zk::gguf_file / zk::gguf_writer against the `gguf` Python package.

1. The real model: every key (name, order, type, value) and every tensor (name,
   dtype, shape, absolute data offset, byte size) as tool_gguf_dump reports them
   equals what gguf.GGUFReader reads.
2. A file written by gguf.GGUFWriter with every value type, nested arrays and
   several tensor types reads back with the expected values in our reader.
3. Our writer: the model copied through zk::gguf_writer (tool_gguf_dump --copy)
   reads back in GGUFReader with the same keys and byte-identical tensors.

Environment: ZACK_MODEL (the model), ZACK_BUILD (build dir; the tool is in
$ZACK_BUILD/tests/). Exits non-zero with a summary on any failure.
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import gguf
except ImportError:
    print("FAIL: the python package 'gguf' is not installed (pip install gguf)")
    sys.exit(1)

TYPE_NAMES = {
    gguf.GGUFValueType.UINT8: "u8", gguf.GGUFValueType.INT8: "i8",
    gguf.GGUFValueType.UINT16: "u16", gguf.GGUFValueType.INT16: "i16",
    gguf.GGUFValueType.UINT32: "u32", gguf.GGUFValueType.INT32: "i32",
    gguf.GGUFValueType.FLOAT32: "f32", gguf.GGUFValueType.BOOL: "bool",
    gguf.GGUFValueType.STRING: "string", gguf.GGUFValueType.ARRAY: "array",
    gguf.GGUFValueType.UINT64: "u64", gguf.GGUFValueType.INT64: "i64",
    gguf.GGUFValueType.FLOAT64: "f64",
}

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        if len(failures) <= 20:
            print("  mismatch:", what)
    return cond


def tool_path():
    build = os.environ.get("ZACK_BUILD")
    if not build:
        print("FAIL: ZACK_BUILD is not set (run through ctest)")
        sys.exit(1)
    tool = os.path.join(build, "tests", "tool_gguf_dump")
    if not os.path.exists(tool):
        print(f"FAIL: {tool} is missing (build the tool_gguf_dump target)")
        sys.exit(1)
    return tool


def our_dump(tool, path):
    out = subprocess.run([tool, path], capture_output=True, text=True)
    if out.returncode != 0:
        print(f"FAIL: tool_gguf_dump {path}: {out.stderr.strip()}")
        sys.exit(1)
    return json.loads(out.stdout)


def flatten(v):
    """GGUFReader's contents() flattens nested arrays into one list."""
    if isinstance(v, list) and v and isinstance(v[0], list):
        return [x for e in v for x in flatten(e)]
    return v


def compare_with_reader(ours, path, label, r=None):
    """Compares our dump of `path` with gguf.GGUFReader's view of the same file."""
    r = r or gguf.GGUFReader(path)
    fields = [f for f in r.fields.values() if not f.name.startswith("GGUF.")]
    check(len(ours["kv"]) == len(fields), f"{label}: key count {len(ours['kv'])} vs {len(fields)}")
    for mine, f in zip(ours["kv"], fields):
        name = f.name
        check(mine["name"] == name, f"{label}: key order {mine['name']} vs {name}")
        check(mine["type"] == TYPE_NAMES[f.types[0]], f"{label}: {name} type {mine['type']} vs {f.types}")
        if f.types[0] == gguf.GGUFValueType.ARRAY:
            check(mine["elem_type"] == TYPE_NAMES[f.types[1]], f"{label}: {name} element type")
        check(flatten(mine["value"]) == f.contents(), f"{label}: {name} value differs")
    check(len(ours["tensors"]) == len(r.tensors), f"{label}: tensor count {len(ours['tensors'])} vs {len(r.tensors)}")
    for mine, t in zip(ours["tensors"], r.tensors):
        check(mine["name"] == t.name, f"{label}: tensor order {mine['name']} vs {t.name}")
        check(mine["dtype"] == t.tensor_type.name, f"{label}: {t.name} dtype {mine['dtype']} vs {t.tensor_type.name}")
        check(mine["shape"] == [int(x) for x in t.shape], f"{label}: {t.name} shape {mine['shape']} vs {list(t.shape)}")
        check(ours["data_offset"] + mine["offset"] == t.data_offset, f"{label}: {t.name} data offset")
        check(mine["n_bytes"] == t.n_bytes, f"{label}: {t.name} bytes {mine['n_bytes']} vs {t.n_bytes}")
    return r


def test_model(tool, model):
    print(f"[1] real model {model}")
    ours = our_dump(tool, model)
    r = compare_with_reader(ours, model, "model")
    print(f"    {len(ours['kv'])} keys, {len(ours['tensors'])} tensors compared")
    return ours, r


def test_python_written(tool, tmp):
    print("[2] file written by gguf.GGUFWriter")
    path = os.path.join(tmp, "py.gguf")
    w = gguf.GGUFWriter(path, arch="llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 2**64 - 1)
    w.add_int64("t.i64", -(2**63))
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "h\u00e9llo\nw\u00f6rld")
    w.add_array("t.arr_str", ["a", "", "\u0120the"])
    w.add_array("t.arr_f32", [0.5, -2.0])
    w.add_array("t.nested", [[1, 2, 3], [4]])
    rng = np.random.default_rng(0)
    tensors = {
        "f32": (rng.standard_normal((3, 8)).astype(np.float32), None),
        "f16": (rng.standard_normal((2, 2, 4)).astype(np.float16), None),
        # raw quantized bytes: 2 rows of 64 elements (2 blocks of 34 B per row)
        "q8": (rng.integers(0, 256, (2, 68), dtype=np.uint8), gguf.GGMLQuantizationType.Q8_0),
        "q41": (rng.integers(0, 256, (4, 20), dtype=np.uint8), gguf.GGMLQuantizationType.Q4_1),
    }
    for name, (arr, raw) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    ours = our_dump(tool, path)
    got = {e["name"]: e for e in ours["kv"]}
    expected = {
        "general.architecture": ("string", "llama"), "t.u8": ("u8", 200), "t.i8": ("i8", -100),
        "t.u16": ("u16", 60000), "t.i16": ("i16", -30000), "t.u32": ("u32", 4000000000),
        "t.i32": ("i32", -2000000000), "t.u64": ("u64", 2**64 - 1), "t.i64": ("i64", -(2**63)),
        "t.f32": ("f32", float(np.float32(0.1))), "t.f64": ("f64", 0.1), "t.bool": ("bool", True),
        "t.str": ("string", "h\u00e9llo\nw\u00f6rld"), "t.arr_str": ("array", ["a", "", "\u0120the"]),
        "t.arr_f32": ("array", [0.5, -2.0]), "t.nested": ("array", [[1, 2, 3], [4]]),
    }
    for key, (typ, val) in expected.items():
        if check(key in got, f"py: key {key} missing"):
            check(got[key]["type"] == typ, f"py: {key} type {got[key]['type']} vs {typ}")
            check(got[key]["value"] == val, f"py: {key} value {got[key]['value']!r} vs {val!r}")
    check(got["t.nested"]["display"] == "[[1, 2, 3], [4]]", f"py: display {got['t.nested']['display']}")
    compare_with_reader(ours, path, "py")
    shapes = {t["name"]: (t["dtype"], t["shape"]) for t in ours["tensors"]}
    check(shapes.get("f32") == ("F32", [8, 3]), f"py: f32 {shapes.get('f32')}")
    check(shapes.get("f16") == ("F16", [4, 2, 2]), f"py: f16 {shapes.get('f16')}")
    check(shapes.get("q8") == ("Q8_0", [64, 2]), f"py: q8 {shapes.get('q8')}")
    check(shapes.get("q41") == ("Q4_1", [32, 4]), f"py: q41 {shapes.get('q41')}")


def test_our_writer(tool, model, model_dump, src, tmp):
    print("[3] model copied through zk::gguf_writer, read by gguf.GGUFReader")
    out = os.path.join(tmp, "copy.gguf")
    res = subprocess.run([tool, "--copy", model, out], capture_output=True, text=True)
    if not check(res.returncode == 0, f"copy failed: {res.stderr.strip()}"):
        return
    # Same keys, tensors and layout as our reader sees them...
    copy_dump = our_dump(tool, out)
    check(copy_dump["kv"] == model_dump["kv"], "copy: keys differ in our reader")
    check(copy_dump["tensors"] == model_dump["tensors"], "copy: tensor table differs in our reader")
    # ...and as the independent reader sees them, with byte-identical tensor data.
    dst = gguf.GGUFReader(out)
    src_fields = [f for f in src.fields.values() if not f.name.startswith("GGUF.")]
    dst_fields = [f for f in dst.fields.values() if not f.name.startswith("GGUF.")]
    check([f.name for f in src_fields] == [f.name for f in dst_fields], "copy: key names/order")
    for a, b in zip(src_fields, dst_fields):
        check(a.types == b.types and a.contents() == b.contents(), f"copy: key {a.name} differs")
    check(len(src.tensors) == len(dst.tensors), "copy: tensor count")
    for a, b in zip(src.tensors, dst.tensors):
        same = (a.name == b.name and a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape)
                and a.data_offset == b.data_offset
                and np.array_equal(np.asarray(a.data).view(np.uint8), np.asarray(b.data).view(np.uint8)))
        check(same, f"copy: tensor {a.name} differs")
    # file_out's temporary files are hidden ".NAME.XXXXXX" next to the output
    check(not any(n.startswith(".") for n in os.listdir(tmp)), "copy: temporary file left")


def main():
    model = os.environ.get("ZACK_MODEL", "")
    if not model or not os.path.exists(model):
        print(f"FAIL: model '{model}' is missing: run scripts/fetch_model.sh to download it")
        return 1
    tool = tool_path()
    with tempfile.TemporaryDirectory(prefix="zk_gguf_py_") as tmp:
        model_dump, reader = test_model(tool, model)
        test_python_written(tool, tmp)
        test_our_writer(tool, model, model_dump, reader, tmp)
    if failures:
        print(f"FAIL: {len(failures)} mismatches between zack's GGUF code and the gguf package")
        return 1
    print("OK: zack's GGUF reader and writer agree with gguf.GGUFReader/GGUFWriter")
    return 0


if __name__ == "__main__":
    sys.exit(main())
