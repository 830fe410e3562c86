#!/usr/bin/env python3
"""Our dequantizers (and quantizers) against gguf-py's numpy implementation.

1. Real models: the default ($ZACK_MODEL: F32, Q4_1, Q8_0 incl.
   token_embd.weight) and Qwen2.5-Coder 0.5B ($ZACK_MODEL_QWEN05: F32, Q5_0,
   Q8_0, Q4_K, Q6_K): several tensors of every type each holds, dequantized by
   tests/tool_dequant, compared with gguf.quants.dequantize: bit-exact (equal
   float32 values; the dequantizers evaluate in gguf-py's order without fused
   multiply-adds, so there is nothing to allow for). Tensors above 32M elements
   (the 0.5B's 136M-element embedding and output) are compared on their first
   and last 256 rows.
2. A synthetic GGUF written with gguf.GGUFWriter holding Q4_0, Q4_1, Q5_0, Q5_1,
   Q8_0, F16, BF16 (from gguf.quants.quantize) and Q5_0, Q5_1, IQ4_NL, Q2_K,
   Q3_K, Q4_K, Q5_K, Q6_K as random bytes with sane f16 scales (every quant
   and sub-scale bit pattern), several rows each; same comparison.
3. Our quantizers (tool_dequant --quantize) write the same bytes as
   gguf.quants.quantize for Q4_0, Q4_1, Q8_0, F16, BF16.
4. Our type table (tool_dequant --types) has every ggml type gguf-py knows,
   with its name, block size and bytes per block.
Exits non-zero on any failure, with a summary.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError as e:  # never skip silently
    print(f"FAIL: python package gguf is required: {e}")
    sys.exit(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
import ref_gguf  # noqa: E402

failures = []


def tool_path():
    build = os.environ.get("ZACK_BUILD")
    if not build:
        print("FAIL: ZACK_BUILD is not set (run through ctest)")
        sys.exit(1)
    p = os.path.join(build, "tests", "tool_dequant")
    if not os.path.exists(p):
        print(f"FAIL: {p} not found (build the tool_dequant target)")
        sys.exit(1)
    return p


TOOL = tool_path()


def ours_dequant(path, name, tmp, rows=None):
    out = os.path.join(tmp, "out.f32")
    extra = [str(rows[0]), str(rows[1])] if rows else []
    r = subprocess.run([TOOL, path, name, out, *extra], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tool_dequant {name}: {r.stderr.strip()}")
    return np.fromfile(out, dtype=np.float32)


def compare(label, ours, ref):
    ref = np.asarray(ref, dtype=np.float32).reshape(-1)
    if ours.shape != ref.shape:
        failures.append(f"{label}: {ours.size} values, reference has {ref.size}")
        print(f"  FAIL {label}: size {ours.size} vs {ref.size}")
        return
    if not np.all(np.isfinite(ref)):
        failures.append(f"{label}: reference has non-finite values")
        return
    diff = np.abs(ours.astype(np.float64) - ref.astype(np.float64))
    ulp = np.spacing(np.abs(ref)).astype(np.float64)
    n_bad = int(np.sum(diff > 0))
    max_diff = float(diff.max()) if diff.size else 0.0
    max_ulps = float((diff / ulp).max()) if diff.size else 0.0
    status = "ok  " if n_bad == 0 else "FAIL"
    print(f"  {status} {label:48s} n={ref.size:9d} max|diff|={max_diff:.3g} max ulps={max_ulps:.2f}")
    if n_bad:
        i = int(np.argmax(diff / ulp))
        failures.append(f"{label}: {n_bad} values differ (worst at {i}: ours {ours[i]!r} ref {ref[i]!r}, {diff[i] / ulp[i]:.2f} ulps)")


MAX_WHOLE = 32 << 20   # elements; larger tensors are checked on row slices
SLICE_ROWS = 256


def check_real_model(tmp, env, wanted):
    model = os.environ.get(env, "")
    if not model or not os.path.exists(model):
        print(f"FAIL: model file not found: {env}={model!r} (fetch it with scripts/fetch_model.sh)")
        sys.exit(1)
    print(f"real model: {model}")
    reader = gguf.GGUFReader(model)
    # ref_gguf (the reference forward pass's reader) places every tensor as gguf does
    for diff in ref_gguf.differences_from_gguf(model, theirs=reader):
        failures.append("ref_gguf: " + diff)
        print("FAIL: ref_gguf: " + diff)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(QT(t.tensor_type), []).append(t)
    for qt, tensors in sorted(by_type.items(), key=lambda kv: kv[0].value):
        # The named ones of this type, plus the first, a middle and the last.
        picks = [t for t in tensors if t.name in wanted]
        for t in (tensors[0], tensors[len(tensors) // 2], tensors[-1]):
            if t not in picks:
                picks.append(t)
        print(f" {qt.name}: {len(tensors)} tensors, checking {len(picks)}")
        for t in picks:
            rows = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data.reshape(1, -1)
            if int(t.n_elements) <= MAX_WHOLE:
                ref = gguf.quants.dequantize(t.data, t.tensor_type)
                compare(f"{t.name} ({qt.name})", ours_dequant(model, t.name, tmp), ref)
                continue
            n = rows.shape[0]
            for r0 in (0, n - SLICE_ROWS):
                ref = gguf.quants.dequantize(rows[r0:r0 + SLICE_ROWS], t.tensor_type)
                compare(f"{t.name} rows {r0}+{SLICE_ROWS} ({qt.name})",
                        ours_dequant(model, t.name, tmp, (r0, SLICE_ROWS)), ref)
    return set(by_type)


# f16 fields of a block that random bytes must not fill (NaN / huge scales):
# (byte offset, low, high) per type, from the block layouts (gguf-py quants.py).
SCALE_FIELDS = {
    QT.Q5_0: [(0, -0.02, 0.02)],                       # d, 4 B high bits, 16 B nibbles
    QT.Q5_1: [(0, 0, 0.02), (2, -0.3, 0.3)],           # d, m, 4 B high bits, 16 B nibbles
    QT.IQ4_NL: [(0, -0.02, 0.02)],                     # d, 16 B nibbles
    QT.Q2_K: [(80, -0.02, 0.02), (82, 0, 0.02)],       # 16 B scales, 64 B quants, d, dmin
    QT.Q3_K: [(108, -0.02, 0.02)],                     # 32 B hmask, 64 B quants, 12 B scales, d
    QT.Q4_K: [(0, -0.02, 0.02), (2, 0, 0.02)],         # d, dmin, 12 B scales, 128 B nibbles
    QT.Q5_K: [(0, -0.02, 0.02), (2, 0, 0.02)],         # d, dmin, 12 B scales, 32 B qh, 128 B nibbles
    QT.Q6_K: [(208, -0.02, 0.02)],                     # 128 ql, 64 qh, 16 int8 scales, d
}


def random_block_bytes(rng, qt, n_rows, n_cols):
    block, size = gguf.GGML_QUANT_SIZES[qt]
    nb = n_cols // block
    data = rng.integers(0, 256, size=(n_rows, nb, size), dtype=np.uint8)
    for off, lo, hi in SCALE_FIELDS[qt]:
        v = rng.uniform(lo, hi, size=(n_rows, nb)).astype(np.float16)
        data[..., off:off + 2] = v.view(np.uint8).reshape(n_rows, nb, 2)
    return data.reshape(n_rows, -1)


def check_synthetic(tmp):
    rng = np.random.default_rng(1234)
    path = os.path.join(tmp, "synthetic.gguf")
    w = gguf.GGUFWriter(path, "llama")
    tensors = {}  # name -> (raw bytes or floats, qtype)
    shapes = [(3, 256), (16, 512), (5, 1536)]
    quantized = (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0)
    for qt, random in [(qt, False) for qt in quantized] + [(qt, True) for qt in SCALE_FIELDS]:
        for rows, cols in shapes:
            name = f"{qt.name.lower()}_{rows}x{cols}" + ("_random" if random else "")
            if random:
                raw = random_block_bytes(rng, qt, rows, cols)
            else:
                x = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 10.0)).astype(np.float32)
                raw = gguf.quants.quantize(x, qt)
            tensors[name] = (raw, qt)
            if qt == QT.F32:
                w.add_tensor(name, raw)
            else:
                w.add_tensor(name, raw, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"synthetic file: {len(tensors)} tensors")
    for name, (raw, qt) in tensors.items():
        ref = gguf.quants.dequantize(raw, qt)
        compare(f"{name} ({qt.name})", ours_dequant(path, name, tmp), ref)
    return {qt for _, qt in tensors.values()}


def check_quantizers(tmp):
    print("quantizers (bytes vs gguf.quants.quantize):")
    rng = np.random.default_rng(99)
    cols = 512
    x = (rng.standard_normal((8, cols)) * np.array([1e-3, 1e-1, 1, 10, 100, 1, 1, 1])[:, None]).astype(np.float32)
    x[6, :32] = 0.0                                    # an all-zero block
    x[7, :32] = np.arange(32, dtype=np.float32) - 15.5  # exact ties for Q8_0
    x[7, 31] = 127.0
    src = os.path.join(tmp, "x.f32")
    x.tofile(src)
    for qt in (QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.F16, QT.BF16):
        out = os.path.join(tmp, "q.bin")
        r = subprocess.run([TOOL, "--quantize", qt.name, str(cols), src, out], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"quantize {qt.name}: {r.stderr.strip()}")
            continue
        ours = np.fromfile(out, dtype=np.uint8)
        ref = gguf.quants.quantize(x, qt).view(np.uint8).reshape(-1)
        n_diff = int(np.sum(ours != ref)) if ours.size == ref.size else -1
        print(f"  {'ok  ' if n_diff == 0 else 'FAIL'} {qt.name:5s} {ref.size} bytes, {n_diff} differ")
        if n_diff != 0:
            failures.append(f"quantize {qt.name}: {n_diff} bytes differ from gguf-py")


def check_type_table():
    print("type table (tool_dequant --types vs gguf-py GGML_QUANT_SIZES):")
    r = subprocess.run([TOOL, "--types"], capture_output=True, text=True)
    ours = {}
    for line in r.stdout.splitlines():
        tid, name, block, size, sup = line.split()
        ours[int(tid)] = (name, int(block), int(size), sup == "supported")
    for qt, (block, size) in gguf.GGML_QUANT_SIZES.items():
        if qt == QT.Q8_1:
            # gguf-py still lists the old f32 d, s layout (40 B); ggml's block_q8_1
            # holds two f16 (36 B). Activation-only: never in a file.
            size = 36
        got = ours.get(qt.value)
        ok = got is not None and got[:3] == (qt.name, block, size)
        if not ok:
            failures.append(f"type table: {qt.value} is {got}, gguf-py says {(qt.name, block, size)}")
    extra = sorted(set(ours) - {qt.value for qt in gguf.GGML_QUANT_SIZES})
    # Ids gguf-py dropped (repacked Q4_0 / IQ4_NL, 32 elements in 18 B) but old files carry.
    for tid in extra:
        if tid not in (31, 32, 33, 36, 37, 38) or ours[tid][1:3] != (32, 18):
            failures.append(f"type table: unexpected id {tid} {ours[tid]}")
    supported = sorted(v[0] for v in ours.values() if v[3])
    print(f"  {len(ours)} ids known ({len(extra)} beyond gguf-py's), zack computes with {', '.join(supported)}")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        default_wanted = {"token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
                          "blk.0.attn_k.weight", "blk.0.ffn_down.weight", "blk.15.attn_output.weight",
                          "blk.29.ffn_up.weight", "blk.29.ffn_norm.weight"}
        real_types = check_real_model(tmp, "ZACK_MODEL", default_wanted)
        # Qwen2.5-Coder 0.5B: Q5_0 for most matrices and the embedding, Q8_0 for
        # attn_v and the output, Q4_K / Q6_K for ffn_down in alternate layers.
        qwen_wanted = {"token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.0.attn_k.bias",
                       "blk.0.ffn_gate.weight", "blk.0.ffn_down.weight", "blk.11.ffn_down.weight",
                       "blk.23.ffn_up.weight", "blk.5.attn_v.weight"}
        real_types |= check_real_model(tmp, "ZACK_MODEL_QWEN05", qwen_wanted)
        synth_types = check_synthetic(tmp)
        check_quantizers(tmp)
        check_type_table()
    covered = sorted(t.name for t in real_types | synth_types)
    print(f"types covered: {', '.join(covered)}")
    if failures:
        print(f"FAILED: {len(failures)} problem(s):")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("PASSED: every dequantized value equal to gguf-py's; quantizer bytes identical; type table matches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
