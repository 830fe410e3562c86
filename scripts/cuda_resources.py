#!/usr/bin/env python3
"""Resource usage of every CUDA kernel from a build log with ptxas -v output
(.ci/cuda.sh): registers, static shared memory, stack frame and spills per
kernel and architecture, as a table. Exit status 1 when an attention kernel
(a name with "attn") spills, or when the log has no kernel at all."""
import re
import subprocess
import sys


def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return out.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return names


def short(name):
    # zk::cuda::(anonymous namespace)::attn_decode_kernel(...) -> attn_decode_kernel
    base = name.split("(")[0] if "(anonymous namespace)" not in name else name.split("(anonymous namespace)::")[-1].split("(")[0]
    return base.split("::")[-1]


def main(path):
    text = open(path, errors="replace").read()
    rows = {}  # (name, arch) -> dict
    cur = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if m:
            cur = (m.group(1), m.group(2))
            rows[cur] = {"regs": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0}
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            rows[cur]["stack"], rows[cur]["spill_st"], rows[cur]["spill_ld"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            rows[cur]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            rows[cur]["smem"] = int(s.group(1)) if s else 0
    if not rows:
        print("cuda_resources: no ptxas -v output in " + path, file=sys.stderr)
        return 1
    keys = sorted(rows)
    names = demangle([k[0] for k in keys])
    print("| kernel | arch | registers | static smem (B) | stack (B) | spill stores (B) | spill loads (B) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    bad = []
    for (mangled, arch), name in sorted(zip(keys, names), key=lambda x: (short(x[1]), x[0][1])):
        r = rows[(mangled, arch)]
        print(f"| {short(name)} | {arch} | {r['regs']} | {r['smem']} | {r['stack']} | {r['spill_st']} | {r['spill_ld']} |")
        if "attn" in short(name) and (r["spill_st"] or r["spill_ld"]):
            bad.append(f"{short(name)} ({arch})")
    if bad:
        print("cuda_resources: attention kernels spill: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
