"""One gguf.GGUFReader per file and process, shared by the reference tokenizer
and the reference forward pass: opening a file parses every metadata value in
Python, ~8 s for a 151,936-token vocabulary with its merges (Qwen2.5), and both
read the same file. The tensors stay memory-mapped."""
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
