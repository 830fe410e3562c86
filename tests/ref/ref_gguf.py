"""GGUF files for the reference tests, read with the gguf package or alone:
  reader(path)    one gguf.GGUFReader per file and process, for the reference
                  forward pass (tensors memory-mapped). Opening parses every
                  metadata value in Python (~8 s for Qwen2.5's 151,936-token
                  vocabulary and merges).
  metadata(path)  the metadata keys and values alone, read from the header
                  here (under a second): what the reference tokenizers need.
  open_file(path) the metadata and the tensors (a GGUFFile): names, types,
                  shapes and memory-mapped data laid out as GGUFReader lays
                  them out, from the header parsed here, so that a test reads a
                  large vocabulary's file in a second instead of 20-30 s
                  (differences_from_gguf checks it against gguf.GGUFReader:
                  test_tokenizer_ref, test_dequant_ref, test_calib_e2e).
The data is still dequantized by gguf-py (gguf.quants) alone.
"""
from __future__ import annotations

import gguf

_READERS: dict[str, "GGUFFile"] = {}


def reader(path: str) -> "GGUFFile":
    """One GGUFFile per file and process (the reference forward pass's weights)."""
    r = _READERS.get(str(path))
    if r is None:
        r = open_file(path)
        _READERS[str(path)] = r
    return r


def release(path: str) -> None:
    """Drops the cached reader (its memory map goes once nothing else holds it)."""
    _READERS.pop(str(path), None)


# GGUF metadata value types (the GGUF spec's gguf_metadata_value_type) and the
# numpy dtype of each fixed-size one.
_NUMERIC = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
            12: "<f8"}
_STRING, _ARRAY, _BOOL = 8, 9, 7


def metadata(path: str) -> dict:
    """Every metadata key of a little-endian GGUF (v2 or v3) and its value, read
    straight from the file's header: strings as str, numbers as int/float/bool,
    arrays as lists. The tensors are not read. gguf.GGUFReader builds a numpy
    view for every part of every value, ~25 s for Gemma 3's 262,144-token
    vocabulary; this reads it in under a second (test_tokenizer_ref checks that
    both give the same values)."""
    return _parse(path, False)[0]


def _parse(path: str, with_tensors: bool):
    """(metadata, tensor infos [(name, ne, type id, offset)], byte where the data starts)."""
    import struct

    import numpy as np

    with open(path, "rb") as f:
        buf = f.read(1 << 20)
        pos = 0

        def need(n):
            nonlocal buf
            while pos + n > len(buf):
                more = f.read(max(1 << 20, n))
                if not more:
                    raise ValueError(f"{path}: the metadata runs past the end of the file")
                buf += more

        def take(n):
            nonlocal pos
            need(n)
            b = buf[pos:pos + n]
            pos += n
            return b

        def u32():
            return struct.unpack("<I", take(4))[0]

        def u64():
            return struct.unpack("<Q", take(8))[0]

        def string():
            return take(u64()).decode("utf-8")

        def value(t):
            if t == _STRING:
                return string()
            if t in _NUMERIC:
                dt = np.dtype(_NUMERIC[t])
                v = np.frombuffer(take(dt.itemsize), dtype=dt)[0].item()
                return bool(v) if t == _BOOL else v
            if t == _ARRAY:
                et, n = u32(), u64()
                if et in _NUMERIC:
                    dt = np.dtype(_NUMERIC[et])
                    a = np.frombuffer(take(dt.itemsize * n), dtype=dt)
                    return [bool(x) for x in a] if et == _BOOL else a.tolist()
                return [value(et) for _ in range(n)]
            raise ValueError(f"{path}: unknown metadata value type {t} at byte {pos - 4}")

        if take(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = u32()
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} (this reader: 2 and 3, little-endian)")
        n_tensors = u64()
        out = {}
        for _ in range(u64()):
            key = string()
            out[key] = value(u32())
        if not with_tensors:
            return out, [], 0
        infos = []
        for _ in range(n_tensors):
            name = string()
            ne = [u64() for _ in range(u32())]
            infos.append((name, ne, u32(), u64()))
        align = int(out.get("general.alignment", 32))
        return out, infos, (pos + align - 1) // align * align


class _Field:
    """A metadata value as GGUFReader's ReaderField.contents() gives it."""

    def __init__(self, name, value):
        self.name, self.value = name, value

    def contents(self):
        return self.value


class GGUFTensor:
    """What a test reads of gguf's ReaderTensor: name, tensor_type
    (gguf.GGMLQuantizationType), shape (ne, fastest first, uint64), n_elements,
    n_bytes, data_offset, and data: F32/F16/F64/I8-I64 as that numpy type in
    shape reversed(ne), any other type as bytes of shape reversed(ne)[:-1] +
    (bytes a row,), the layout gguf.quants.dequantize takes."""

    def __init__(self, mm, name, ne, type_id, offset):
        import numpy as np

        self.name = name
        self.tensor_type = gguf.GGMLQuantizationType(type_id)
        self.shape = np.array(ne, dtype=np.uint64)
        self.n_elements = int(np.prod(ne, dtype=np.int64)) if ne else 1
        block, size = gguf.GGML_QUANT_SIZES[self.tensor_type]
        self.n_bytes = self.n_elements * size // block
        self.data_offset = offset
        dims = tuple(int(x) for x in reversed(ne))
        plain = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16: np.float16,
                 gguf.GGMLQuantizationType.F64: np.float64, gguf.GGMLQuantizationType.I8: np.int8,
                 gguf.GGMLQuantizationType.I16: np.int16, gguf.GGMLQuantizationType.I32: np.int32,
                 gguf.GGMLQuantizationType.I64: np.int64}
        dt = plain.get(self.tensor_type)
        if dt is None:
            dt, dims = np.uint8, dims[:-1] + (dims[-1] // block * size,)
        if offset + self.n_bytes > mm.size:
            raise ValueError(f"tensor {name}: bytes {offset}..{offset + self.n_bytes} past the end of the file")
        self.data = mm[offset:offset + self.n_bytes].view(dt).reshape(dims)


class GGUFFile:
    """A GGUF's metadata (meta: dict; fields: key -> .contents(), as GGUFReader's)
    and tensors (a list of GGUFTensor, in the file's order), the data memory-mapped."""

    def __init__(self, path: str):
        import numpy as np

        self.path = str(path)
        self.meta, infos, start = _parse(self.path, True)
        self.fields = {k: _Field(k, v) for k, v in self.meta.items()}
        mm = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.tensors = [GGUFTensor(mm, n, ne, t, start + off) for n, ne, t, off in infos]
        self._by_name = {t.name: t for t in self.tensors}

    def tensor(self, name: str):
        """The tensor called name, or None when the file has none."""
        return self._by_name.get(name)


def open_file(path: str) -> GGUFFile:
    return GGUFFile(path)


def _same_value(a, b) -> bool:
    """a == b, where NaN equals NaN (a .zack's sensitivity table marks what was not measured so)."""
    if a == b:
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b))
    try:
        return bool(a != a and b != b)
    except (TypeError, ValueError):
        return False


def differences_from_gguf(path: str, ours: GGUFFile | None = None, theirs=None) -> list[str]:
    """Where open_file(path) reads the file otherwise than gguf.GGUFReader does:
    every metadata key and value (GGUFReader's own GGUF.* entries aside), every
    tensor's name, type, shape, byte count, offset and data layout. Empty when
    they agree (tests run this on each real model and on a written .zack).
    `theirs`: a gguf.GGUFReader of the file already open (it takes seconds)."""
    import numpy as np

    ours = ours or open_file(path)
    r = theirs or gguf.GGUFReader(str(path))
    out = []
    meta = {k: f.contents() for k, f in r.fields.items() if not k.startswith("GGUF.")}
    if set(ours.meta) != set(meta):
        out.append(f"keys {sorted(set(ours.meta) ^ set(meta))[:5]} differ")
    bad = [k for k in meta if k in ours.meta and not _same_value(ours.meta[k], meta[k])]
    if bad:
        out.append(f"values of {bad[:5]} differ")
    if len(ours.tensors) != len(r.tensors):
        out.append(f"{len(ours.tensors)} tensors, gguf reads {len(r.tensors)}")
    for a, b in zip(ours.tensors, r.tensors):
        same = (a.name == b.name and a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape)
                and a.n_bytes == b.n_bytes and a.data_offset == b.data_offset and a.data.dtype == b.data.dtype
                and a.data.shape == b.data.shape)
        if same and a.data.size:
            fa, fb = a.data.reshape(-1), b.data.reshape(-1)
            same = np.array_equal(fa[:64], fb[:64]) and np.array_equal(fa[-64:], fb[-64:])
        if not same:
            out.append(f"tensor {b.name}: {a.name} {a.tensor_type.name} {list(a.shape)} at {a.data_offset}, gguf "
                       f"{b.tensor_type.name} {list(b.shape)} at {b.data_offset}")
            break
    return [f"{path}: {d}" for d in out]
