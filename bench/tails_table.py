#!/usr/bin/env python3
"""The table of `bash bench/kv_plans.sh tails`: each simulated tail's held-out
perplexity and KL next to the bytes the tail would save.

The simulation (bench/experiments/one_bit_tails.patch) keeps the 2-bit layout's
bytes, so eval's KV fraction is the plan's; a tail of 1-bit codes would save one
bit a channel of every 2-bit side from its first tail channel up to the side's
rank, a 0-bit mean tail two bits and a rank cut 2.5 (its grid too). The plans'
per-head precisions and ranks come from the .zack (zack.plans), read with
gguf-py, or from the plan file a run names.

  python3 bench/tails_table.py /tmp/kv_plans/q15.zack /tmp/kv_plans/tails_*.json
  python3 bench/tails_table.py --hand-plan /tmp/kv_plans/q15.zack plan_l0q4.json

--hand-plan writes the hand plan the table compares the calibrated ones with:
layer 0 at 4 bits, 2 bits everywhere else, every rank full (the .zack's first
plan with its bits and ranks replaced).
"""
import json
import os
import re
import sys

import gguf


def zack_plans(path):
    r = gguf.GGUFReader(path)
    f = r.fields["zack.plans"]
    plans = [json.loads(bytes(f.parts[i]).decode()) for i in f.data]
    shape = json.loads(bytes(f.parts[f.data[0]]).decode())["model"]
    return {round(p["target"], 6): p for p in plans}, shape


def write_hand_plan(zack, out):
    plans, shape = zack_plans(zack)
    p = next(iter(plans.values()))
    n, kv = shape["n_layer"] * shape["n_kv"], shape["n_kv"]
    p["zack_plan"] = 2  # per-head bits (the first plan may have had one precision)
    p["bits"] = 4  # the widest
    p["bits_k"] = p["bits_v"] = [4] * kv + [2] * (n - kv)
    p["ranks_k"] = p["ranks_v"] = [shape["head_dim"]] * n
    p["source"] = "bench/tails_table.py --hand-plan: layer 0 at 4 bits, 2 bits elsewhere, full rank"
    with open(out, "w") as f:
        json.dump(p, f)


def saved_bits(plan, env):
    """Bits a token a tail saves, summed over the plan's 2-bit sides."""
    sims = dict(kv.split("=") for kv in env)
    s = 0.0
    for bk, rk, bv, rv in zip(plan["bits_k"], plan["ranks_k"], plan["bits_v"], plan["ranks_v"]):
        if bk == 2:
            for name, per in (("ZK_SIM_K1", 1), ("ZK_SIM_KM", 2), ("ZK_SIM_K0", 2.5)):
                if name in sims:
                    s += per * max(0, rk - int(sims[name]))
        if bv == 2 and "ZK_SIM_V1" in sims:
            s += max(0, rv - int(sims["ZK_SIM_V1"]))
    return s


def main():
    if sys.argv[1] == "--hand-plan":
        return write_hand_plan(sys.argv[2], sys.argv[3])
    plans, shape = zack_plans(sys.argv[1])
    f16_bits = shape["n_layer"] * shape["n_kv"] * 2 * shape["head_dim"] * 16
    print("| plan | simulated tail | KV bytes (of f16) | ppl | % of base | KLD | same top |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for path in sys.argv[2:]:
        d = json.load(open(path))
        env = re.findall(r"ZK_SIM_[A-Z0-9]+_\d+", path)
        env = [e.rsplit("_", 1)[0] + "=" + e.rsplit("_", 1)[1] for e in env]
        for run in d["runs"]:
            spec = run["config"]["cli"].split("--kv-plan")[1].split()[0]
            try:
                plan, target = plans[round(float(spec), 6)], f"{float(spec):g}"
            except ValueError:  # a plan file (e.g. kv_plans.sh's plan_l0q4.json)
                file = spec if os.path.isabs(spec) else os.path.join(os.path.dirname(path), spec)
                plan, target = json.load(open(file)), os.path.basename(spec)
            frac = run["kv"]["fraction_of_f16"] - saved_bits(plan, env) / f16_bits
            vs = run["detail"].get("vs_baseline", {})
            print(f"| {target} | {' '.join(env) or 'none (2-bit)'} | {100 * frac:.2f}% | {run['detail']['ppl']:.4f} "
                  f"| {100 * run['retention']:.2f}% | {vs.get('kld_mean', 0):.4f} | {100 * vs.get('same_top_p', 0):.1f}% |")


if __name__ == "__main__":
    main()
