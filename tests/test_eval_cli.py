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

from cli_util import MODEL, ZACK as BIN, check, require_binary_and_model, run_tests

SRC = os.environ.get("ZACK_SOURCE", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DATA = os.path.join(SRC, "tests", "data", "eval")
TMP = tempfile.mkdtemp(prefix="zack_eval_")


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


def test_held_fraction():
    """"KV size" is what one more token costs; "held" is the whole cache at the task's context over an f16
    cache of the same capacity (times the share of tokens kept, which is 1 without eviction). A 4-bit cache holds the codes of every slot plus its f16 residual window
    (128 tokens) and the exact sinks (4 tokens, f32, keys and values: 8 f16 rows' worth), so at a context
    of C it holds about (128 + 8) / C of an f16 cache more than its per-token figure says."""
    C = 384
    j = run_json("held", ["--task", "ppl", "--data", os.path.join(DATA, "gpl3_preamble.txt"), "-c", str(C),
                          "--limit", "1", "--kv-bits", "4"])
    b, r = j["baseline"]["kv"], j["runs"][0]["kv"]
    check(abs(b["held_fraction_of_f16"] - 1.0) < 1e-9, "held: the f16 baseline holds an f16 cache (%r)" % b)
    want = r["fraction_of_f16"] + (128 + 2 * 4) / C
    check(abs(r["held_fraction_of_f16"] - want) < 0.005,
          "held: 4-bit at %d tokens holds its codes, window and sinks (%.4f, expected %.4f)"
          % (C, r["held_fraction_of_f16"], want))


def test_tier():
    """--kv-tier keeps the tokens before the residual window in 4-bit codes in front of narrower ones: on a
    2-bit cache of the default model it lowers the KL to the baseline at a fixed cost in bytes (the held
    fraction rises, the per-token one does not); bad values are one-line errors naming the flag."""
    args = ["--task", "ppl", "--data", os.path.join(DATA, "gpl3_preamble.txt"), "-c", "384", "--limit", "1",
            "--kv-bits", "2"]
    plain = run_json("tier0", args)["runs"][0]
    tier = run_json("tier128", args + ["--kv-tier", "128"])["runs"][0]
    k0, k1 = plain["detail"]["vs_baseline"]["kld_mean"], tier["detail"]["vs_baseline"]["kld_mean"]
    check(k1 < 0.8 * k0, "tier: a 128-token 4-bit tier lowers a 2-bit cache's KL (%.4f -> %.4f)" % (k0, k1))
    check(tier["kv"]["fraction_of_f16"] == plain["kv"]["fraction_of_f16"]
          and tier["kv"]["held_fraction_of_f16"] > plain["kv"]["held_fraction_of_f16"],
          "tier: a fixed cost (per token %r, held %r -> %r)" % (tier["kv"]["fraction_of_f16"],
                                                              plain["kv"]["held_fraction_of_f16"],
                                                              tier["kv"]["held_fraction_of_f16"]))
    for extra, needle in [(["--kv-bits", "2", "--kv-tier", "48"], "multiple of the group"),
                          (["--kv-bits", "16", "--kv-tier", "64"], "has none"),
                          (["--kv-bits", "4", "--kv-tier", "64"], "has none"),
                          (["--kv-bits", "2", "--kv-tier", "-32"], "positive multiple")]:
        p = run(args[:-2] + extra, ok=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode != 0 and len(lines) == 1 and "--kv-tier" in lines[0] and needle in lines[0],
              "tier: %s refused in one line (%s)" % (" ".join(extra), lines))


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
    # A configuration the model cannot take fails before the baseline runs (on a real model a
    # baseline takes minutes): one line naming the flag, no baseline progress line.
    p = subprocess.run([BIN, "eval", "-m", MODEL, "-t", "2", "--task", "ppl", "--data",
                        os.path.join(DATA, "gpl3_preamble.txt"), "-c", "64", "--limit", "1", "--kv-plan", "0.13"],
                       capture_output=True, text=True, timeout=600)
    err = p.stderr.strip().splitlines()
    check(p.returncode != 0 and err and err[-1].startswith("zack: error: --kv-plan 0.13: ")
          and "plain GGUF" in err[-1], "bad configuration: one error line naming the flag (%s)" % err[-1:])
    check(not any(l.startswith("[baseline]") for l in err), "bad configuration: refused before the baseline ran")
    # a plan search's band upside down, and a family that searches tiers given one of the user's own
    for extra, needle in [(["--plan-min", "0.3", "--plan-max", "0.2"], "--plan-min (0.3) must be below --plan-max"),
                          (["--methods", "plan+tier", "--kv-tier", "32"], "drop --kv-tier or plan+tier")]:
        p = run(["--task", "ppl", "--data", os.path.join(DATA, "gpl3_preamble.txt"), "-c", "128", "--limit", "1",
                 "--target", "0.9"] + extra, ok=False)
        err = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode != 0 and len(err) == 1 and needle in err[0], "%s: one line (%s)" % (extra, err))


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


def read_logits(path):
    """The baseline logits file by its documented format (engine/eval/eval_logits.h)."""
    import struct
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    check(raw[:8] == b"ZKLOGITS", "logits: magic")
    version, n_vocab = struct.unpack_from("<II", raw, 8)
    (vocab_hash,) = struct.unpack_from("<Q", raw, 16)
    window, stride, step, first, per_chunk, n_chunks = struct.unpack_from("<6q", raw, 24)
    bos, model_len = struct.unpack_from("<iI", raw, 72)
    at = 80 + model_len
    (n_tokens,) = struct.unpack_from("<q", raw, at)
    tokens = np.frombuffer(raw, dtype="<i4", count=n_tokens, offset=at + 8)
    data = (at + 8 + 4 * n_tokens + 63) // 64 * 64
    check(len(raw) == data + n_chunks * per_chunk * n_vocab * 2, "logits: size = data offset + f16 rows")
    lp = np.frombuffer(raw, dtype="<f2", offset=data).astype(np.float64).reshape(n_chunks, per_chunk, n_vocab)
    return dict(version=version, n_vocab=n_vocab, window=window, stride=stride, step=step, first=first,
                per_chunk=per_chunk, n_chunks=n_chunks, bos=bos, model=raw[80:80 + model_len].decode(),
                tokens=tokens, lp=lp)


def test_kl_divergence_file():
    """llama-perplexity's workflow: save the baseline's log-probabilities once (-f, --chunks as its spellings),
    then compare later runs with the file instead of running the baseline again."""
    import numpy as np
    text = os.path.join(DATA, "gpl3_preamble.txt")
    base = os.path.join(TMP, "base.logits")
    a = run_json("kld_save", ["--task", "ppl", "-f", text, "-c", "64", "--chunks", "2", "--kl-divergence-base", base])
    same = run_json("kld_plain", ["--task", "ppl", "--data", text, "-c", "64", "--limit", "2"])
    check(a["baseline"]["value"] == same["baseline"]["value"], "-f/--chunks are --data/--limit")
    h = read_logits(base)
    check(h["version"] == 1 and h["n_vocab"] == 49152 and (h["window"], h["stride"], h["step"], h["first"],
          h["per_chunk"], h["n_chunks"]) == (64, 0, 64, 32, 31, 2), "logits: header fields %r" % (
          [h[k] for k in ("window", "stride", "step", "first", "per_chunk", "n_chunks")],))
    check(MODEL in h["model"], "logits: names the baseline model")
    lse = np.log(np.exp(h["lp"]).sum(axis=2))
    check(np.abs(lse).max() < 2e-3, "logits: each row is a log-softmax (max |logsumexp| %.2g)" % np.abs(lse).max())
    # The baseline perplexity from the file alone, by the documented positions: chunk i scores
    # tokens[i*step + first + j + 1] with row j.
    nll = [-h["lp"][i, j, h["tokens"][i * h["step"] + h["first"] + j + 1]]
           for i in range(h["n_chunks"]) for j in range(h["per_chunk"])]
    ppl = math.exp(sum(nll) / len(nll))
    check(abs(ppl / a["baseline"]["value"] - 1) < 2e-3, "logits: PPL from the file %.4f = the run's %.4f" % (
          ppl, a["baseline"]["value"]))

    # the same model against its saved self: KLD ~ 0 (f16 rounding), no --data needed
    b = run_json("kld_self", ["--task", "ppl", "--kl-divergence-base", base, "--kl-divergence"])
    check(abs(b["baseline"]["value"] / a["baseline"]["value"] - 1) < 2e-3, "kld: saved baseline PPL reported")
    v = b["runs"][0]["detail"]["vs_baseline"]
    check(v["kld_mean"] < 1e-5 and v["same_top_p"] >= 0.98, "kld: self against the file: KLD %.2g, same top %.3f" % (
          v["kld_mean"], v["same_top_p"]))
    # a 4-bit cache: the file gives the KLD the in-memory baseline gives
    c = run_json("kld_q4", ["--task", "ppl", "--kl-divergence-base", base, "--kl-divergence", "--kv-bits", "4"])
    d = run_json("mem_q4", ["--task", "ppl", "--data", text, "-c", "64", "--limit", "2", "--kv-bits", "4"])
    kf, km = c["runs"][0]["detail"]["vs_baseline"]["kld_mean"], d["runs"][0]["detail"]["vs_baseline"]["kld_mean"]
    check(km > 1e-4 and abs(kf - km) < 0.02 * km + 1e-5, "kld: 4-bit KLD from the file %.6f = in memory %.6f" % (kf, km))
    check(c["runs"][0]["config"]["cli"] == "--kv-bits 4", "kld: the typed flags are the compared configuration")
    ct = run_json("kld_ctk", ["--task", "ppl", "--kl-divergence-base", base, "--kl-divergence", "-ctk", "q4_0", "-ctv",
                              "q4_0"])
    check(ct["runs"][0]["config"]["cli"] == "--cache-type-k q4_0 --cache-type-v q4_0" and
          ct["runs"][0]["detail"]["vs_baseline"]["kld_mean"] == kf, "kld: -ctk/-ctv q4_0 is --kv-bits 4 in eval too")
    e = run_json("kld_one", ["--task", "ppl", "--kl-divergence-base", base, "--kl-divergence", "--chunks", "1"])
    check(e["baseline"]["n_items"] == 1 and e["runs"][0]["n_items"] == 1, "kld: --chunks limits the saved chunks")
    # bad uses: one line each
    junk = os.path.join(TMP, "junk.logits")
    with open(junk, "wb") as f:
        f.write(b"not logits at all" * 10)
    cut = os.path.join(TMP, "cut.logits")
    with open(base, "rb") as f, open(cut, "wb") as g:
        g.write(f.read()[:-100])
    for args, needle in [(["--kl-divergence"], "--kl-divergence-base"),
                         (["--kl-divergence-base", base, "--kl-divergence", "-f", text], "no --data"),
                         (["--kl-divergence-base", base, "--kl-divergence", "-c", "128"], "-c 64"),
                         (["--kl-divergence-base", junk, "--kl-divergence"], "not a zack logits file"),
                         (["--kl-divergence-base", cut, "--kl-divergence"], "truncated"),
                         (["--kl-divergence-base", "/dev/full", "-f", text], "character device")]:
        p = run(["--task", "ppl"] + args, ok=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode != 0 and len(lines) == 1 and needle in lines[0], "kld error %s: %s" % (needle, lines))


def test_outputs():
    """--json/--plot/--csv never clobber: devices and directories refused before the run, a symlink's target
    replaced with the link kept; binary data and write errors on stdout are errors."""
    text = os.path.join(DATA, "gpl3_preamble.txt")
    args = ["--task", "ppl", "--data", text, "-c", "64", "--limit", "1"]
    for out in ("/dev/full", TMP):
        p = run(args + ["--json", out], ok=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode != 0 and len(lines) == 1 and ("device" in lines[0] or "directory" in lines[0]),
              "--json %s refused: %s" % (out, lines))
    check(os.path.exists("/dev/full") and not os.path.isfile("/dev/full"), "/dev/full is still a device")
    real = os.path.join(TMP, "real.json")
    link = os.path.join(TMP, "link.json")
    with open(real, "w") as f:
        f.write("old")
    os.symlink("real.json", link)
    csv_path = os.path.join(TMP, "out.csv")
    run(args + ["--json", link, "--csv", csv_path])
    check(os.path.islink(link) and json.load(open(real))["task"] == "ppl", "--json through a symlink: target replaced")
    rows = open(csv_path).read().splitlines()
    check(rows[0].startswith("config,method,metric,value,retention") and rows[1].startswith("baseline,baseline,ppl,"),
          "--csv: header and baseline row (%r)" % rows[:2])
    head = rows[0].split(",")
    check(len(rows[1].split(",")) == len(head) and rows[1].split(",")[head.index("kv_held_fraction")] == "1",
          "--csv: every column in the baseline row, the held fraction 1 (%r)" % rows[:2])
    binary = os.path.join(TMP, "binary.bin")
    with open(binary, "wb") as f:
        f.write(bytes(range(256)) * 40)
    p = run(["--task", "ppl", "--data", binary], ok=False)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode != 0 and len(lines) == 1 and "binary.bin:1: not UTF-8 text" in lines[0],
          "binary data is refused, naming the file (%s)" % lines)
    with open("/dev/full", "w") as full:
        p = subprocess.run([BIN, "eval", "-m", MODEL, "-t", "2", "-q"] + args, stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=600)
    check(p.returncode != 0 and "standard output" in p.stderr, "eval > /dev/full fails")


def main():
    require_binary_and_model()
    tests = [test_ppl_self, test_held_fraction, test_tier, test_lastword, test_mc, test_passkey, test_malformed, test_target_vs_sweep,
             test_kl_divergence_file, test_outputs]
    return run_tests(tests, "eval CLI")


if __name__ == "__main__":
    sys.exit(main())
