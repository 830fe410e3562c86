#!/usr/bin/env python3
"""Our dequantizers (and quantizers) against gguf-py's numpy implementation.

1. Real model ($ZACK_MODEL): several tensors of every type it holds (F32, Q4_1,
   Q8_0 incl. token_embd.weight), dequantized by tests/tool_dequant, compared
   with gguf.quants.dequantize: |ours - ref| <= 1 ulp of f32 (numpy.spacing).
2. A synthetic GGUF written with gguf.GGUFWriter holding Q4_0, Q4_1, Q8_0, F16,
   BF16 (from gguf.quants.quantize) and Q4_K, Q6_K (random bytes with sane f16
   d/dmin), same comparison; also shapes with several rows.
3. Our quantizers (tool_dequant --quantize) write the same bytes as
   gguf.quants.quantize for Q4_0, Q4_1, Q8_0, F16, BF16.
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


def ours_dequant(path, name, tmp):
    out = os.path.join(tmp, "out.f32")
    r = subprocess.run([TOOL, path, name, out], capture_output=True, text=True)
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
    n_bad = int(np.sum(diff > ulp))
    max_diff = float(diff.max()) if diff.size else 0.0
    max_ulps = float((diff / ulp).max()) if diff.size else 0.0
    status = "ok  " if n_bad == 0 else "FAIL"
    print(f"  {status} {label:48s} n={ref.size:9d} max|diff|={max_diff:.3g} max ulps={max_ulps:.2f}")
    if n_bad:
        i = int(np.argmax(diff / ulp))
        failures.append(f"{label}: {n_bad} values beyond 1 ulp (worst at {i}: ours {ours[i]!r} ref {ref[i]!r})")


def check_real_model(tmp):
    model = os.environ.get("ZACK_MODEL", "")
    if not model or not os.path.exists(model):
        print(f"FAIL: model file not found: ZACK_MODEL={model!r} (fetch it with scripts/fetch_model.sh)")
        sys.exit(1)
    print(f"real model: {model}")
    reader = gguf.GGUFReader(model)
    by_type = {}
    for t in reader.tensors:
        by_type.setdefault(QT(t.tensor_type), []).append(t)
    wanted = {"token_embd.weight", "output_norm.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
              "blk.0.attn_k.weight", "blk.0.ffn_down.weight", "blk.15.attn_output.weight",
              "blk.29.ffn_up.weight", "blk.29.ffn_norm.weight"}
    for qt, tensors in sorted(by_type.items(), key=lambda kv: kv[0].value):
        # The named ones of this type, plus the first, a middle and the last.
        picks = [t for t in tensors if t.name in wanted]
        for t in (tensors[0], tensors[len(tensors) // 2], tensors[-1]):
            if t not in picks:
                picks.append(t)
        print(f" {qt.name}: {len(tensors)} tensors, checking {len(picks)}")
        for t in picks:
            ref = gguf.quants.dequantize(t.data, t.tensor_type)
            compare(f"{t.name} ({qt.name})", ours_dequant(model, t.name, tmp), ref)
    return set(by_type)


def random_kquant_bytes(rng, qt, n_rows, n_cols):
    block, size = gguf.GGML_QUANT_SIZES[qt]
    data = rng.integers(0, 256, size=(n_rows, n_cols // block, size), dtype=np.uint8)
    d = rng.uniform(-0.02, 0.02, size=(n_rows, n_cols // block)).astype(np.float16)
    if qt == QT.Q4_K:  # f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes
        data[..., 0:2] = d.view(np.uint8).reshape(n_rows, n_cols // block, 2)
        dmin = rng.uniform(0, 0.02, size=(n_rows, n_cols // block)).astype(np.float16)
        data[..., 2:4] = dmin.view(np.uint8).reshape(n_rows, n_cols // block, 2)
    elif qt == QT.Q6_K:  # 128 ql, 64 qh, 16 int8 scales, f16 d last
        data[..., 208:210] = d.view(np.uint8).reshape(n_rows, n_cols // block, 2)
    else:
        raise ValueError(qt)
    return data.reshape(n_rows, -1)


def check_synthetic(tmp):
    rng = np.random.default_rng(1234)
    path = os.path.join(tmp, "synthetic.gguf")
    w = gguf.GGUFWriter(path, "llama")
    tensors = {}  # name -> (raw bytes or floats, qtype)
    shapes = [(3, 256), (16, 512)]
    for qt in (QT.F32, QT.F16, QT.BF16, QT.Q4_0, QT.Q4_1, QT.Q8_0, QT.Q4_K, QT.Q6_K):
        for rows, cols in shapes:
            name = f"{qt.name.lower()}_{rows}x{cols}"
            if qt in (QT.Q4_K, QT.Q6_K):
                raw = random_kquant_bytes(rng, qt, rows, cols)
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


def main():
    with tempfile.TemporaryDirectory() as tmp:
        real_types = check_real_model(tmp)
        synth_types = check_synthetic(tmp)
        check_quantizers(tmp)
    covered = sorted(t.name for t in real_types | synth_types)
    print(f"types covered: {', '.join(covered)}")
    if failures:
        print(f"FAILED: {len(failures)} problem(s):")
        for f in failures:
            print(f"  - {f}")
        return 1
    print("PASSED: every dequantized value within 1 ulp of gguf-py; quantizer bytes identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
