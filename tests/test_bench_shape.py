"""`zack bench --shape NAME`: benchmarks a synthetic random-weight model of a
named shape without any model file. The outputs say so (label "random weights,
shape NAME, TYPE" in the table, JSON and JSONL), the numbers are there and agree
with the shape (KV bytes per token), the temporary model is gone afterwards
(after success, an error and a SIGTERM), and bad uses are one-line errors."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cli_util import ZACK, check, finish, one_line_error  # noqa: E402


def zack(*args, env=None):
    return subprocess.run([ZACK, *args], capture_output=True, text=True, timeout=600, env=env)


def with_tmpdir(d):
    env = dict(os.environ)
    env["TMPDIR"] = d
    return env


def main():
    if not ZACK or not os.path.exists(ZACK):
        sys.exit(f"FAIL: zack binary not found (ZACK_BIN={ZACK!r}); build first")
    short = ["-p", "16", "-n", "4", "-r", "1", "-t", "1"]
    # tiny: 2 layers x 2 KV heads x K and V of 16 f16 values, + a 4-byte position all heads share
    tiny_kv_per_token = 2 * 2 * 2 * 16 * 2 + 4

    with tempfile.TemporaryDirectory() as tmp:
        r = zack("bench", "--shape", "tiny", *short, "-o", "json", env=with_tmpdir(tmp))
        check(r.returncode == 0, f"json run exits 0 ({r.stderr.strip()[-300:]})")
        j = json.loads(r.stdout)
        check(j["model"] == "random weights, shape tiny, Q4_K", f"model label: {j['model']!r}")
        check(j["random_weights"] == {"shape": "tiny", "type": "Q4_K"}, f"random_weights: {j['random_weights']!r}")
        check("random-weight" in j["model_desc"] and "tiny" in j["model_desc"], f"model_desc: {j['model_desc']!r}")
        check("2 layers, 64 dim, 4/2 heads of 16, ffn 128, vocab 512" in j["model_desc"],
              f"model_desc has tiny's shape: {j['model_desc']!r}")
        res = j["results"]
        check(sorted(x["test"] for x in res) == ["pp16", "tg4"], f"one pp and one tg row: {[x['test'] for x in res]}")
        for x in res:
            check(x["tokens_per_s"] > 0 and x["ms"] > 0 and x["peak_rss_bytes"] > 0,
                  f"{x['test']}: positive speed, time and memory")
            check(x["kv_bytes_per_token"] == tiny_kv_per_token,
                  f"{x['test']}: KV bytes/token {x['kv_bytes_per_token']} == {tiny_kv_per_token}")
        check(os.listdir(tmp) == [], f"the temporary model is removed after the run: {os.listdir(tmp)}")

        r = zack("bench", "--shape", "tiny", "--shape-type", "q8_0", *short, env=with_tmpdir(tmp))
        check(r.returncode == 0, f"md run exits 0 ({r.stderr.strip()[-300:]})")
        first = r.stdout.splitlines()[0] if r.stdout else ""
        check(first.startswith("model: random weights, shape tiny, Q8_0 (not a real model)"), f"md label: {first!r}")
        rows = [l for l in r.stdout.splitlines() if l.startswith("| pp16") or l.startswith("| tg4")]
        check(len(rows) == 2, f"md: two result rows ({rows})")

        r = zack("bench", "--shape", "tiny", "--shape-type", "F16", *short, "-o", "jsonl", "-b", "1,2",
                 env=with_tmpdir(tmp))
        check(r.returncode == 0, f"jsonl run with a batch exits 0 ({r.stderr.strip()[-300:]})")
        lines = [json.loads(l) for l in r.stdout.splitlines()]
        check(len(lines) == 3, f"jsonl: pp16, tg4 at batch 1 and 2 ({len(lines)} lines)")
        check(all(l["model"] == "random weights, shape tiny, F16" for l in lines), "jsonl: every line labelled")

        # an error after the model was written: the temporary model is still removed
        r = zack("bench", "--shape", "tiny", *short, "-c", "8", env=with_tmpdir(tmp))
        one_line_error(r, "context too small", "raise -c")
        check(os.listdir(tmp) == [], f"removed after an error: {os.listdir(tmp)}")

        # SIGTERM while a larger model is being written or benchmarked: nothing left behind
        p = subprocess.Popen([ZACK, "bench", "--shape", "qwen2.5-0.5b", "--shape-type", "q8_0", "-p", "512", "-n",
                              "64", "-t", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=with_tmpdir(tmp))
        t0 = time.time()
        while time.time() - t0 < 60 and not os.listdir(tmp):
            time.sleep(0.01)
        check(bool(os.listdir(tmp)), "the model appears under TMPDIR while it is written")
        time.sleep(0.3)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=60)
        check(p.returncode == 143, f"SIGTERM: exit 143 (got {p.returncode}; {err.strip()[-200:]!r})")
        check(os.listdir(tmp) == [], f"removed after SIGTERM: {os.listdir(tmp)}")

        missing = os.path.join(tmp, "no-such-dir")
        r = zack("bench", "--shape", "tiny", *short, env=with_tmpdir(missing))
        one_line_error(r, "TMPDIR missing", "temporary directory", "TMPDIR")

    one_line_error(zack("bench", "--shape", "huge", *short), "unknown shape", "unknown shape 'huge'",
                   "tiny, tiny-qwen2, smollm2-135m, qwen2.5-0.5b, qwen2.5-1.5b, llama-8b")
    one_line_error(zack("bench", "--shape", "tiny", "--shape-type", "q9", *short), "unknown type",
                   "unknown weight type 'q9'", "q4_k", "q6_k", "f16")
    r = zack("bench", "--shape", "tiny", "-m", "whatever.gguf", *short)
    one_line_error(r, "--shape with -m", "--shape")
    check(r.returncode == 2, f"--shape with -m: bad flags, exit 2 (got {r.returncode})")
    r = zack("bench", *short)
    one_line_error(r, "neither -m nor --shape", "-m FILE", "--shape")
    check(r.returncode == 2, f"no model: exit 2 (got {r.returncode})")
    one_line_error(zack("bench", "-m", "whatever.gguf", "--shape-type", "q8_0", *short), "--shape-type alone",
                   "--shape")
    for flags, name in [(["--kv-rate", "0.5"], "--kv-rate"), (["--kv-target", "0.3"], "--kv-target"),
                        (["--kv-plan", "0.3"], "--kv-plan")]:
        one_line_error(zack("bench", "--shape", "tiny", *short, *flags), f"--shape {name}", name, ".zack",
                       "random weights")
    # the uncompressed baseline in a --kv-rate list is fine
    r = zack("bench", "--shape", "tiny", *short, "--kv-rate", "-1", "--kv-bits", "16,4")
    check(r.returncode == 0 and r.stdout.count("| pp16") == 2, f"--kv-rate -1 with --kv-bits 16,4 runs ({r.stderr.strip()[-200:]})")
    finish()


if __name__ == "__main__":
    main()
