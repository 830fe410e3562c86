#!/usr/bin/env python3
"""Summarises ncu's per-instruction source page of one kernel (CSV, from
`ncu --import R --page source --csv --print-source sass`): executed
instructions per opcode, and the hottest instructions by warp-stall samples
and by executions, with their neighbours' addresses. Column names differ
between ncu versions, so they are found by substring; the header is printed
when one is missing.

    python3 bench/gpu/ncu_source_top.py source.csv [--top 60]
"""
import argparse
import csv
import re
import sys
from collections import Counter


def number(s):
    try:
        return float(str(s).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=60)
    a = ap.parse_args()
    with open(a.csv, newline="", errors="replace") as f:
        lines = f.read().splitlines()
    # skip ncu's banner lines before the CSV header
    start = next((i for i, l in enumerate(lines) if l.startswith('"') and "Source" in l), None)
    if start is None:
        print("no CSV header with a Source column; first lines:", *lines[:20], sep="\n")
        return 1
    rows = list(csv.reader(lines[start:]))
    head, body = rows[0], rows[1:]

    def col(*parts):
        for i, h in enumerate(head):
            if all(p.lower() in h.lower() for p in parts):
                return i
        return None

    c_src, c_exec = col("Source"), col("Instructions Executed")
    c_stall = col("Stall Sampling (All") or col("Sampling (All")
    c_addr = col("Address")
    if c_src is None or c_exec is None:
        print("columns:", head)
        return 1
    ops, total, stall_total = Counter(), 0.0, 0.0
    recs = []
    for r in body:
        if len(r) <= max(c_src, c_exec):
            continue
        n = number(r[c_exec])
        st = number(r[c_stall]) if c_stall is not None and len(r) > c_stall else 0.0
        m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", r[c_src])
        op = m.group(2) if m else r[c_src][:12]
        ops[op] += n
        total += n
        stall_total += st
        recs.append((st, n, r[c_addr] if c_addr is not None else "", r[c_src].strip()))
    print(f"executed warp instructions: {total:,.0f}; stall samples: {stall_total:,.0f}")
    print("\nby opcode (share of executed instructions):")
    for op, n in ops.most_common(30):
        print(f"  {op:10s} {n:14,.0f} {100 * n / max(total, 1):6.2f}%")
    print(f"\nhottest {a.top} instructions by stall samples (samples, executions, address, SASS):")
    for st, n, ad, src in sorted(recs, key=lambda x: -x[0])[: a.top]:
        print(f"  {st:8.0f} {n:12,.0f} {ad} {src[:110]}")
    print(f"\nhottest {a.top} by executions:")
    for st, n, ad, src in sorted(recs, key=lambda x: -x[1])[: a.top]:
        print(f"  {n:12,.0f} {st:8.0f} {ad} {src[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
