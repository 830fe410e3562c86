"""`zack bench` end to end on the real model: JSON and CSV outputs parse, every
requested combination is a row (decode rows once per batch size, prefill rows
at batch 1), KV bytes match the engine's accounting (the cache's bytes per
token per sequence, cross-checked against the model's shape; allocated and
used bytes summed over the row's sequences), and nonsense lists are rejected
with a one-line error."""
import csv
import io
import json
import os
import subprocess
import sys

ZACK = os.environ.get("ZACK_BIN", "")
MODEL = os.environ.get("ZACK_MODEL", "")
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def zack(*args):
    return subprocess.run([ZACK, *args], capture_output=True, text=True, timeout=600)


def main():
    if not os.path.exists(ZACK):
        sys.exit(f"FAIL: zack binary not found at {ZACK!r}")
    if not os.path.exists(MODEL):
        sys.exit(f"FAIL: default model missing at {MODEL!r}; run scripts/fetch_model.sh")

    r = zack("bench", "-m", MODEL, "-p", "16,32", "-n", "4", "-d", "0,64", "-b", "1,3", "-r", "1", "-t", "1,2",
             "-o", "json")
    check(r.returncode == 0, f"json run exits 0 ({r.stderr.strip()[-200:]})")
    j = json.loads(r.stdout)
    res = j["results"]
    check(len(res) == 2 * 2 * 4, f"one row per combination (2 threads x 2 depths x (2 pp + tg at 2 batches)): {len(res)}")
    check(sorted({(row["test"], row["batch"]) for row in res}) == [("pp16", 1), ("pp32", 1), ("tg4", 1), ("tg4", 3)],
          "pp rows at batch 1, tg rows at each batch size")
    # Independent accounting from the GGUF shape: f16 K and V per layer and KV head, plus a 4-byte
    # position per token that every head of a cache without eviction shares (engine/kv_cache.h).
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
    import ref_gguf  # the header alone (gguf.GGUFReader parses the whole vocabulary: seconds)
    meta = ref_gguf.metadata(MODEL)
    f = lambda k: int(meta[k])
    n_layer, n_kv = f("llama.block_count"), f("llama.attention.head_count_kv")
    d = f("llama.embedding_length") // f("llama.attention.head_count")
    expect_per_tok = n_layer * n_kv * 2 * d * 2 + 4
    for row in res:
        check(row["kv_bytes_per_token"] == expect_per_tok,
              f"{row['test']} depth {row['depth']}: KV bytes/token {row['kv_bytes_per_token']} == {expect_per_tok}")
        # every sequence of the row holds depth + n_tokens tokens at the end
        held = (row["depth"] + row["n_tokens"]) * row["batch"]
        check(row["kv_bytes_used"] == expect_per_tok * held,
              f"{row['test']} depth {row['depth']} batch {row['batch']}: KV bytes used")
        check(row["tokens_per_s"] > 0 and row["peak_rss_bytes"] > 0, f"{row['test']}: positive speed and memory")
        # --device auto (the default): the CPU on a machine without a GPU
        check(row["device"] == "cpu", f"{row['test']}: ran on the cpu ({row.get('device')!r})")
    check(all(row["kv_bytes_allocated"] == expect_per_tok * j["n_ctx"] * row["batch"] for row in res),
          "allocated = per token x n_ctx x batch")

    # --json: the spelling of eval and info, the same document as -o json; not with -o
    r = zack("bench", "-m", MODEL, "-p", "8", "-n", "0", "-r", "1", "--json")
    check(r.returncode == 0 and [row["test"] for row in json.loads(r.stdout)["results"]] == ["pp8"],
          f"--json prints the JSON document ({r.stderr.strip()[-200:]})")
    r = zack("bench", "-m", MODEL, "-p", "8", "-n", "0", "-r", "1", "--json", "-o", "csv")
    check(r.returncode != 0 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1 and "--json" in r.stderr,
          f"--json with -o: one-line error ({r.stderr.strip()[-200:]!r})")

    r = zack("bench", "-m", MODEL, "-p", "8", "-n", "2", "-r", "2", "-o", "csv")
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    check(r.returncode == 0 and len(rows) == 2 and rows[0]["test"] == "pp8", f"csv parses ({len(rows)} rows)")

    r = zack("bench", "-m", MODEL, "-p", "8", "-n", "2", "-r", "1")
    check(r.returncode == 0 and "| pp8 |" in r.stdout and "| tg2 |" in r.stdout, "markdown table")

    # llama-bench's jsonl: one JSON object per test on its own line, the model in each
    r = zack("bench", "-m", MODEL, "-p", "8", "-n", "2", "-r", "1", "-o", "jsonl", "-t", "0", "-ngl", "99", "-fa", "1",
             "-ctk", "f16,q8_0", "-ctv", "f16,q8_0")
    lines = r.stdout.splitlines()
    objs = [json.loads(l) for l in lines]
    check(r.returncode == 0 and len(objs) == 4 and all(o["model"] == MODEL for o in objs),
          f"jsonl: one object per test ({len(objs)} lines; {r.stderr.strip()[-200:]})")
    check([o["kv"] for o in objs] == ["f16", "f16", "q8", "q8"], "-ctk/-ctv f16,q8_0 = --kv-bits 16,8")
    check(all(o["threads"] == os.cpu_count() for o in objs), f"-t 0 = all hardware threads ({os.cpu_count()})")
    # --output-file: the same format written through file_out; devices refused before any work
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.csv")
        r = zack("bench", "-m", MODEL, "-p", "8", "-n", "0", "-r", "1", "-o", "csv", "--output-file", out)
        rows = list(csv.DictReader(open(out)))
        check(r.returncode == 0 and r.stdout == "" and len(rows) == 1 and rows[0]["test"] == "pp8",
              "--output-file: the csv goes to the file, nothing to stdout")
        check(sorted(os.listdir(tmp)) == ["bench.csv"], "--output-file: no temporary file left")
    r = zack("bench", "-m", MODEL, "-p", "8", "-n", "0", "-r", "1", "--output-file", "/dev/full")
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    check(r.returncode != 0 and len(lines) == 1 and "character device" in lines[0], f"--output-file /dev/full: {lines}")
    with open("/dev/full", "w") as full:
        r = subprocess.run([ZACK, "bench", "-m", MODEL, "-p", "8", "-n", "0", "-r", "1"], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=600)
    check(r.returncode != 0 and "standard output" in r.stderr, "bench > /dev/full fails")
    # a long depth reports its prefill as it goes
    r = zack("bench", "-m", MODEL, "-p", "0", "-n", "1", "-d", "1024", "-r", "1", "-o", "jsonl")
    check(r.returncode == 0 and "depth 1024: prefilling sequence 0, 512/1024 tokens" in r.stderr,
          "bench: progress while prefilling a depth")
    # ZACK_PROFILE=1: per-op times on stderr when the backend ends; the results unchanged on stdout
    r = subprocess.run([ZACK, "bench", "-m", MODEL, "-p", "16", "-n", "4", "-r", "1", "--kv-bits", "4"],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "ZACK_PROFILE": "1"})
    prof = {}
    for l in r.stderr.splitlines():
        cells = [c.strip() for c in l.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[2].isdigit():
            prof[(cells[0], cells[1])] = (int(cells[2]), float(cells[3]))
    n_layer = f("llama.block_count")
    check(r.returncode == 0 and "zack profile (cpu backend)" in r.stderr and "| tg4 |" in r.stdout,
          f"ZACK_PROFILE=1: a profile on stderr, the table on stdout ({r.stderr.strip()[-200:]})")
    # bench runs a warm-up pass before each test: 2 passes of pp16, 2 x 4 steps of tg4
    check(prof.get(("attention", "1-8"), (0,))[0] == 8 * n_layer and prof.get(("attention", ">8"), (0,))[0] == 2 * n_layer,
          f"profile: attention once per layer and pass, decode and prefill apart ({prof.get(('attention', '1-8'))}, "
          f"{prof.get(('attention', '>8'))})")
    check(any(k[0].startswith("matmul Q4_1") and v[1] > 0 for k, v in prof.items()), "profile: matmuls by weight type")
    check("zack profile" not in zack("bench", "-m", MODEL, "-p", "8", "-n", "0", "-r", "1").stderr,
          "no profile without ZACK_PROFILE")
    r = zack("bench", "-m", MODEL, "-ctk", "q8_0", "-ctv", "q4_0")
    check(r.returncode != 0 and "differ" in r.stderr, "-ctk and -ctv lists must match")

    for args, needle in [(["-p", "-5"], "minimum"), (["-p", "1,x"], "integers"), (["-d", "4096", "-c", "1024"], "context"),
                         (["-n", ""], "empty"), (["-t", "-1"], "minimum"), (["-r", "0"], "repetitions"),
                         (["-b", "0"], "minimum"), (["-b", "1,-2"], "minimum")]:
        r = zack("bench", "-m", MODEL, *args)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        check(r.returncode != 0 and len(lines) == 1 and needle in lines[0], f"rejects {args}: {lines}")

    if failures:
        print(f"FAILED: {len(failures)} check(s)")
        sys.exit(1)
    print("all bench checks passed")


if __name__ == "__main__":
    main()
