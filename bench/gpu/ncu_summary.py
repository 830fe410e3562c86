#!/usr/bin/env python3
"""Per-kernel totals of an Nsight Compute CSV (run_device.sh ncu mode).

ncu runs kernels one at a time, so the sum of their durations is the GPU's
busy time without the host's gaps between launches; set against the wall time
of the same steps it says whether a decode step is bound by its kernels or by
launching them. Input: `ncu --csv --print-units base --metrics
gpu__time_duration.sum,dram__bytes_read.sum ...`. Prints a markdown table:
kernel, launches, total us, us per launch, MB read, GB/s.
"""
import csv
import re
import sys
from collections import defaultdict


def short(name):
    # "void zk::cuda::(anonymous namespace)::matvec_kq_kernel<12, 2>(long, ...)" -> "matvec_kq_kernel<12, 2>"
    name = re.sub(r"\(.*$", "", name.replace("(anonymous namespace)::", ""))
    return name.split("::")[-1].replace("void ", "")


def main():
    rows = []
    with open(sys.argv[1], newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]
    for r in csv.DictReader(lines):
        rows.append(r)
    per = defaultdict(lambda: {"n": 0, "ns": 0.0, "bytes": 0.0})
    ids = set()
    for r in rows:
        k = short(r["Kernel Name"])
        v = float(r["Metric Value"].replace(",", ""))
        if r["Metric Name"] == "gpu__time_duration.sum":
            per[k]["n"] += 1
            per[k]["ns"] += v
            ids.add(r["ID"])
        elif r["Metric Name"] == "dram__bytes_read.sum":
            per[k]["bytes"] += v
    total = sum(p["ns"] for p in per.values())
    print(f"{len(ids)} kernels, {total / 1e3:.1f} us of GPU time in all")
    print("| kernel | launches | us | us/launch | MB read | GB/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for k, p in sorted(per.items(), key=lambda kv: -kv[1]["ns"]):
        gbs = p["bytes"] / p["ns"] if p["ns"] else 0
        print(f"| {k} | {p['n']} | {p['ns'] / 1e3:.1f} | {p['ns'] / 1e3 / max(p['n'], 1):.2f} | "
              f"{p['bytes'] / 1e6:.2f} | {gbs:.0f} |")


if __name__ == "__main__":
    main()
