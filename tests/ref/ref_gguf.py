"""GGUF files for the reference tests, read with the gguf package or alone:
  reader(path)    one gguf.GGUFReader per file and process, for the reference
                  forward pass (tensors memory-mapped). Opening parses every
                  metadata value in Python (~8 s for Qwen2.5's 151,936-token
                  vocabulary and merges).
  metadata(path)  the metadata keys and values alone, read from the header
                  here (under a second): what the reference tokenizers need.
"""
from __future__ import annotations

import gguf

_READERS: dict[str, gguf.GGUFReader] = {}


def reader(path: str) -> gguf.GGUFReader:
    r = _READERS.get(str(path))
    if r is None:
        r = gguf.GGUFReader(path)
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
        u64()  # tensor count
        out = {}
        for _ in range(u64()):
            key = string()
            out[key] = value(u32())
        return out
