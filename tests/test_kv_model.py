"""KV cache precision and eviction on the real model, end to end.

1. `zack run` with a 4-bit cache (and 4-bit + GEAR, and h2o eviction) answers a
   factual question greedily and coherently (the answer names Paris);
2. bad --kv-* flags are rejected with a clear one-line error;
3. tool_kv_kl measures the KL divergence of next-token distributions against the
   f16 cache over a real text (a 192-token prompt, then 32 decode steps) for
   8-bit, 4-bit, 4-bit + GEAR and streaming / h2o / snapkv at a budget, and
   prints the figures. Only loose sanity is asserted (finite, 8-bit close to
   the baseline), as the figures are measurements, not specifications, plus one
   comparison: the default 4-bit cache (4 exact sink tokens, a 128-token f16
   window) has a lower KL than 4-bit without sinks and with a one-group window;
   and 4-bit keys whose last 16 channels are 1-bit lose more than 4-bit alone
   but stay far below a nat, and 4-bit keys whose last 8 channels are 0-bit
   group means after such a tail below one (`zack run` with either answers too);
   and decode-time key-group selection (--kv-select 64 over a 4-bit cache with a
   32-token window: the steps attend to 2 of 5-6 groups) choosing every step
   (--kv-select-every 1) loses more than the same cache attending to every
   group, and stays below half a nat; over f16 and 8-bit caches (pages chosen by
   their exact softmax mass) likewise; a choice serving the default 4 steps
   changes the figures and stays below a nat (measured, 4-bit / f16 / 8-bit:
   0.44 / 0.64 / 0.19 against 0.25 / 0.34 / 0.08 choosing every step).
"""
import os
import re
import subprocess
import sys

MODEL = os.environ.get("ZACK_MODEL", "")
ZACK = os.environ.get("ZACK_BIN", "")
BUILD = os.environ.get("ZACK_BUILD", "")
SOURCE = os.environ.get("ZACK_SOURCE", os.path.join(os.path.dirname(__file__), ".."))

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def main():
    if not MODEL or not os.path.exists(MODEL):
        print(f"FAIL: model file not found (ZACK_MODEL={MODEL!r}); run scripts/fetch_model.sh")
        return 1
    if not ZACK or not os.path.exists(ZACK):
        print(f"FAIL: zack binary not found (ZACK_BIN={ZACK!r})")
        return 1
    tool = os.path.join(BUILD, "tests", "tool_kv_kl")
    if not os.path.exists(tool):
        print(f"FAIL: {tool} not built")
        return 1

    prompt = "What is the capital of France? Answer in one sentence."
    for flags in (["--kv-bits", "4"], ["--kv-bits", "4", "--kv-gear"], ["--kv-bits", "8"],
                  ["--kv-evict", "h2o", "--kv-budget", "24", "--kv-bits", "4"], ["--kv-bits", "4", "--kv-key-tail", "16"],
                  ["--kv-bits", "4", "--kv-key-tail", "16", "--kv-key-zero", "8"], ["--kv-bits", "4", "--kv-key-mid", "32"]):
        r = subprocess.run([ZACK, "run", "-m", MODEL, "-p", prompt, "-n", "24", "--temp", "0", "-t", "2", "-v"] + flags,
                           capture_output=True, text=True, timeout=300)
        out = r.stdout.strip()
        print(f"  zack run {' '.join(flags)} -> {out!r}")
        kv_line = [l for l in r.stderr.splitlines() if "kv cache" in l]
        if kv_line:
            print("   ", kv_line[0])
        check(r.returncode == 0 and "paris" in out.lower(), f"greedy answer with {' '.join(flags)} names Paris")
        if flags[:2] == ["--kv-bits", "4"] and len(flags) == 2:
            check(bool(kv_line) and "first 4 tokens also exact" in kv_line[0], "-v shows the exact sink tokens")
        if "--kv-key-tail" in flags:
            check(bool(kv_line) and "1-bit key tails in 90 of 90 heads (16 channels" in kv_line[0],
                  "-v shows the 1-bit key tails")
        if "--kv-key-mid" in flags:
            check(bool(kv_line) and "2-bit key channels in 90 of 90 heads (32 on average)" in kv_line[0],
                  "-v shows the 2-bit key channels")
        if "--kv-key-zero" in flags:
            check(bool(kv_line) and "0-bit key channels (group means) in 90 of 90 heads (8 on average)" in kv_line[0],
                  "-v shows the 0-bit key channels")

    for flags, needle in ((["--kv-bits", "3"], "--kv-bits"), (["--kv-evict", "h2o"], "--kv-budget"),
                          (["--kv-evict", "h2o", "--kv-budget", "128", "--kv-crush", "1"], "--kv-crush"),
                          (["--kv-bits", "4", "--kv-group", "0"], "--kv-group"),
                          (["--kv-bits", "8", "--kv-gear"], "--kv-gear"),
                          (["--kv-evict", "lru", "--kv-budget", "64"], "lru"),
                          (["--kv-bits", "4", "--kv-sinks", "65"], "--kv-sinks"),
                          (["--kv-bits", "2", "--kv-key-tail", "129"], "--kv-key-tail"),
                          (["--kv-bits", "2", "--kv-key-tail", "8", "--kv-gear"], "--kv-gear"),
                          (["--kv-bits", "2", "--kv-key-zero", "513"], "--kv-key-zero"),
                          (["--kv-bits", "2", "--kv-key-zero", "8", "--kv-gear"], "--kv-gear"),
                          (["--kv-bits", "4", "--kv-key-mid", "513"], "--kv-key-mid"),
                          (["--kv-bits", "4", "--kv-key-mid", "8", "--kv-gear"], "--kv-gear"),
                          (["--kv-bits", "4", "--kv-select", "-1"], "--kv-select"),
                          (["--kv-select", "64", "--kv-select-every", "0"], "--kv-select-every")):
        r = subprocess.run([ZACK, "run", "-m", MODEL, "-p", "hi", "-n", "1"] + flags,
                           capture_output=True, text=True, timeout=120)
        check(r.returncode != 0 and needle in r.stderr, f"{' '.join(flags)} rejected: {r.stderr.strip()[:120]!r}")

    text = os.path.join(SOURCE, "tests", "data", "calib", "apache-2.0.txt")
    configs = ["bits=8", "bits=4", "bits=4,sinks=0,residual=32", "bits=4,gear=1", "evict=streaming,budget=96",
               "evict=h2o,budget=96", "evict=snapkv,budget=96", "bits=4,key_tail=16", "bits=4,key_tail=16,key_zero=8", "bits=4,key_mid=32",
               "bits=4,residual=32", "bits=4,residual=32,select=64,every=1", "select=64,every=1",
               "bits=8,select=64,every=1", "bits=4,residual=32,select=64", "select=64", "bits=8,select=64"]
    r = subprocess.run([tool, MODEL, text, "--prompt", "192", "--decode", "32", "--threads", "2"] + configs,
                       capture_output=True, text=True, timeout=900)
    print(r.stdout)
    check(r.returncode == 0, "tool_kv_kl ran" + ("" if r.returncode == 0 else ": " + r.stderr.strip()))
    kl = {}
    for line in r.stdout.splitlines():
        m = re.match(r"config=(\S+) bytes_per_token=(\S+) kl=(\S+) top1=(\S+)", line)
        if m:
            kl[m.group(1)] = float(m.group(3))
    check(len(kl) == len(configs) + 1, "every configuration measured")
    check(all(v == v and v >= -1e-9 and v < 10 for v in kl.values()), "KL values finite and non-negative")
    check(kl.get("bits=8", 1) < 0.05, f"8-bit KL {kl.get('bits=8')} < 0.05 nats")
    check(kl.get("bits=4", 1) < kl.get("bits=4,sinks=0,residual=32", 0),
          f"4-bit KL with exact sinks and the 128-token window ({kl.get('bits=4')}) below plain KIVI "
          f"({kl.get('bits=4,sinks=0,residual=32')})")
    # a 1-bit tail is coarser than the codes it replaces: more KL than 4-bit alone, still far below 1 nat
    check(kl.get("bits=4", 1) < kl.get("bits=4,key_tail=16", 0) < 0.5,
          f"4-bit keys with a 16-channel 1-bit tail: KL {kl.get('bits=4,key_tail=16')} above 4-bit's, below 0.5")
    # the last 8 channels at their group means: coarser again (this model's own basis, not a .zack's
    # whose last channels are its weakest: measured 0.48), below 1 nat
    zkl = kl.get("bits=4,key_tail=16,key_zero=8", 0)
    check(kl.get("bits=4", 1) < zkl < 1.0,
          f"4-bit keys with a 1-bit tail and 8 0-bit channels: KL {zkl} above 4-bit's, below 1")
    # 32 channels in 2-bit codes: coarser than 4-bit, far below 1 nat
    mkl = kl.get("bits=4,key_mid=32", 0)
    check(kl.get("bits=4", 1) < mkl < 0.5, f"4-bit keys with 32 2-bit channels: KL {mkl} above 4-bit's, below 0.5")
    # selection reads 2 of the 5-6 quantized groups a step: it loses something, not everything
    skl, fkl = kl.get("bits=4,residual=32,select=64,every=1", 0), kl.get("bits=4,residual=32", 1)
    check(fkl < skl < 0.5, f"4-bit with --kv-select 64: KL {skl} above the same cache's without ({fkl}), below 0.5")
    # 16- and 8-bit keys: pages of 32 slots by their exact softmax mass, 2 of 6-7 a step
    for cfg, base in (("select=64,every=1", 0.0), ("bits=8,select=64,every=1", kl.get("bits=8", 1))):
        check(base < kl.get(cfg, 0) < 0.5, f"--kv-select 64 ({cfg}): KL {kl.get(cfg)} above {base}, below 0.5")
    # a choice serving 4 steps: other steps, other figures; a tiny budget, so below a nat
    for cfg in ("bits=4,residual=32,select=64", "select=64", "bits=8,select=64"):
        one = kl.get(cfg + ",every=1", 0)
        check(kl.get(cfg, 0) != one and 0 < kl.get(cfg, 0) < 1.0,
              f"--kv-select 64 ({cfg}), a choice every 4 steps: KL {kl.get(cfg)} (every step: {one}), below 1")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
