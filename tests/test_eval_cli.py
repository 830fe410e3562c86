#!/usr/bin/env python3
"""End-to-end tests of `zack eval` on the real default model: every task through
the CLI with small item counts, the JSON fields, the baseline against itself
(KL 0, top-1 agreement 100%), malformed data named by file and line, and the
--target bisection against a dense sweep of the same family.

Env: ZACK_BIN (the zack CLI), ZACK_MODEL (default model), ZACK_SOURCE (repo root).
Exits non-zero on any failure, with a summary."""
import json
import math
import os
import subprocess
import sys
import tempfile

BIN = os.environ.get("ZACK_BIN", "")
MODEL = os.environ.get("ZACK_MODEL", "")
SRC = os.environ.get("ZACK_SOURCE", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DATA = os.path.join(SRC, "tests", "data", "eval")
TMP = tempfile.mkdtemp(prefix="zack_eval_")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


def run(args, ok=True):
    cmd = [BIN, "eval", "-m", MODEL, "-t", "2", "-q"] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if ok and p.returncode != 0:
        raise RuntimeError("command failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr[-2000:]))
    return p


def run_json(name, args):
    path = os.path.join(TMP, name + ".json")
    p = run(args + ["--json", path])
    with open(path) as f:
        j = json.load(f)
    for k in ("model", "task", "settings", "baseline", "runs", "issues"):
        check(k in j, "%s: JSON has field %s" % (name, k))
    b = j["baseline"]
    for k in ("config", "metric", "value", "retention", "n_items", "kv", "detail"):
        check(k in b, "%s: baseline has field %s" % (name, k))
    check(abs(b["kv"]["fraction_of_f16"] - 1.0) < 1e-9, "%s: baseline KV fraction is 1" % name)
    check(b["config"]["name"] in p.stdout and "% of base" in p.stdout, "%s: table on stdout" % name)
    return j


def test_ppl_self():
    j = run_json("ppl", ["--task", "ppl", "--data", os.path.join(DATA, "gpl3_preamble.txt"), "-c", "64",
                         "--limit", "2", "--kv-type", "f16"])
    b = j["baseline"]
    check(b["metric"] == "ppl" and 1.0 < b["value"] < 1e4, "ppl: baseline perplexity is plausible (%s)" % b["value"])
    check(b["detail"]["n_tokens_scored"] == 2 * (64 - 1 - 32), "ppl: scores c - 1 - c/2 tokens per chunk")
    check(len(j["runs"]) == 1, "ppl: one compared configuration")
    r = j["runs"][0]
    check(r["config"]["flags"] == {"--kv-type": "f16"}, "ppl: the run carries its exact flags")
    v = r["detail"]["vs_baseline"]
    check(v["kld_mean"] == 0.0, "ppl: KL of the baseline against itself is 0 (got %r)" % v["kld_mean"])
    check(v["kld_percentiles"]["max"] == 0.0, "ppl: max KL is 0")
    check(v["same_top_p"] == 1.0, "ppl: top-1 agreement is 100%% (got %r)" % v["same_top_p"])
    check(v["rms_dp"] == 0.0, "ppl: RMS dp is 0")
    check(r["retention"] == 1.0, "ppl: 100% of baseline")
    check(abs(v["ppl_base"] - b["value"]) < 1e-6 * b["value"], "ppl: PPL(base) equals the baseline run")


def test_lastword():
    j = run_json("lastword", ["--task", "lastword", "--data", os.path.join(DATA, "gpl3_preamble.txt"),
                              "--limit", "4"])
    d = j["baseline"]["detail"]
    check(d["n_items"] == 4 and 0.0 <= d["acc"] <= 1.0, "lastword: 4 items, accuracy in [0, 1]")
    ex = d["examples"][0]
    check(ex["target"] and ":" in ex["where"], "lastword: examples name target and file:line")
    # The first passage of the file is its copyright paragraph; the target is its last word.
    check(d["examples"][0]["target"] == "allowed", "lastword: first passage's last word (%r)" % ex["target"])


def test_mc():
    # The compression flags typed on the command line become the compared configuration.
    j = run_json("mc", ["--task", "mc", "--data", os.path.join(DATA, "mc.jsonl"), "--limit", "6",
                        "--kv-bits", "4", "--kv-gear"])
    check(len(j["runs"]) == 1 and j["runs"][0]["config"]["cli"] == "--kv-bits 4 --kv-gear",
          "mc: the typed --kv-* flags are the compared configuration")
    r = j["runs"][0]
    check("error" not in r and 0 < r["kv"]["fraction_of_f16"] < 1, "mc: a 4-bit cache is smaller than f16")
    check("same_choice_as_baseline" in r["detail"], "mc: agreement with the baseline reported")
    d = j["baseline"]["detail"]
    check(d["n_items"] == 6, "mc: 6 items")
    check(0 <= d["acc"] <= 1 and 0 <= d["acc_norm"] <= 1, "mc: acc and acc_norm in [0, 1]")
    check(abs(d["random_chance"] - 0.25) < 1e-12, "mc: chance of 4 choices is 25%")


def test_passkey():
    j = run_json("passkey", ["--task", "passkey", "--passkey-lengths", "128", "--passkey-depths", "0,1",
                             "--passkey-trials", "1"])
    d = j["baseline"]["detail"]
    check(len(d["by_length_depth"]) == 2, "passkey: one cell per (length, depth)")
    check(all(a["tokens"] == 128 for a in d["answers"]), "passkey: prompts have exactly the requested length")
    check(all(len(a["key"]) == 5 for a in d["answers"]), "passkey: 5-digit keys")


def test_malformed():
    bad = os.path.join(DATA, "mc_malformed.jsonl")
    p = run(["--task", "mc", "--data", bad], ok=False)
    check(p.returncode != 0, "malformed: --on-error stop fails")
    check("mc_malformed.jsonl:3:" in p.stderr, "malformed: error names file and line (%s)" % p.stderr.strip()[-300:])
    j = run_json("malformed", ["--task", "mc", "--data", bad, "--on-error", "skip"])
    lines = [i["line"] for i in j["issues"]]
    check(lines == [3, 5, 6], "malformed: skipped lines 3, 5, 6 (got %s)" % lines)
    check(all(i["file"] == bad for i in j["issues"]), "malformed: issues name the file")
    check(j["baseline"]["n_items"] == 3, "malformed: the 3 good items are scored")
    p = run(["--task", "ppl", "--data", os.path.join(DATA, "empty.txt")], ok=False)
    check(p.returncode != 0 and "empty.txt" in p.stderr, "empty file: error names the file")


def test_target_vs_sweep():
    svg = os.path.join(TMP, "plot.svg")
    args = ["--task", "ppl", "--data", os.path.join(DATA, "gpl3_preamble.txt"), "-c", "64", "--limit", "1",
            "--ppl-piece", "8", "--methods", "evict", "zack", "--sweep", "--points", "4", "--target", "0.99",
            "--steps", "2", "--evict-min-keep", "0.25", "--plot", svg]
    j = run_json("target", args)
    t = {x["method"]: x for x in j["targets"]}
    check(not t["zack"]["found"] and ".zack" in t["zack"]["note"], "target: zack on a plain GGUF is reported unavailable")
    ev = t["evict"]
    grid = {}
    for r in j["runs"]:
        if r["config"]["method"] == "evict" and "error" not in r:
            grid[r["config"]["strength"]] = r["retention"] is not None and r["retention"] >= 0.99
    ts = sorted(grid)
    check(ts == [0.25, 0.5, 0.75, 1.0] or set([0.25, 0.5, 0.75, 1.0]) <= set(ts), "target: dense grid ran (%s)" % ts)
    passing = [x for x in (0.25, 0.5, 0.75, 1.0) if grid.get(x)]
    monotone = all(grid.get(a, False) >= grid.get(b, False) for a, b in zip(ts, ts[1:]))
    found_t = ev["best"]["config"]["strength"] if ev["found"] else None
    if monotone:
        expect = max(passing) if passing else 0.0
        check(found_t == expect, "target: bisection (%s) equals the dense sweep (%s)" % (found_t, expect))
    else:  # still the bisection invariant: what it found passes, the next grid point fails
        check(found_t is not None and (found_t == 0 or grid.get(found_t)), "target: bisection's answer passes")
    if ev["found"] and found_t and found_t > 0:
        check(ev["best"]["retention"] >= 0.99, "target: the answer keeps >= 99%")
        check(ev["best"]["kv"]["fraction_of_f16"] < 1.0, "target: the answer has a smaller KV cache")
    with open(svg) as f:
        s = f.read()
    check(s.startswith("<svg") and s.rstrip().endswith("</svg>") and "<polyline" in s, "plot: an SVG with a curve")


def main():
    if not BIN or not os.path.exists(BIN):
        print("FAIL: ZACK_BIN not set or missing (%r)" % BIN)
        return 1
    if not MODEL or not os.path.exists(MODEL):
        print("FAIL: the default model is missing (ZACK_MODEL=%r); run scripts/fetch_model.sh" % MODEL)
        return 1
    tests = [test_ppl_self, test_lastword, test_mc, test_passkey, test_malformed, test_target_vs_sweep]
    for t in tests:
        try:
            t()
            print("ran", t.__name__)
        except Exception as e:  # a crash is a failure, never a skip
            failures.append("%s raised %s" % (t.__name__, e))
            print("FAIL:", t.__name__, e)
    if failures:
        print("\n%d check(s) failed:" % len(failures))
        for f in failures:
            print("  -", f)
        return 1
    print("all eval CLI checks passed (%d tests)" % len(tests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
