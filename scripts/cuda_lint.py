#!/usr/bin/env python3
"""Source checks of kernels/cuda that neither the SIMT harness nor nvcc make.

Device pointers declared without an initializer: under nvcc `dptr<T>` is a raw
`T*`, so a member `dptr<float> rows32;` of a struct made on the stack holds
garbage, while in the harness build `dptr<T>` is a class that starts null, and
the tests pass there. (Found on an H100: cuda_kv_side_store's unset row
pointers made cuda_kv_store_rows refuse 15 of 16 layout pairs.) Every dptr
declaration that ends a statement must carry `{}` or `= ...`.

Exit 1 with one line per finding (file:line: text).
"""
import re
import sys
from pathlib import Path

DECL = re.compile(r"^\s*(const\s+)?dptr<[^;()]*>\s+([A-Za-z_]\w*(\s*,\s*[A-Za-z_]\w*)*)\s*;")


def main() -> int:
    root = Path(__file__).resolve().parent.parent / "kernels" / "cuda"
    bad = []
    for f in sorted(root.glob("*")):
        if f.suffix not in (".h", ".cuh", ".cu"):
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if DECL.match(line):
                bad.append(f"{f.relative_to(root.parent.parent)}:{i}: device pointer without an initializer "
                           f"(add {{}}): {line.strip()}")
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
