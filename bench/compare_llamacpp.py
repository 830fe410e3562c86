#!/usr/bin/env python3
"""zack against llama.cpp on one machine, in one run.

llama.cpp is measured through llama-cpp-python (`pip install llama-cpp-python`: it builds llama.cpp from
source; scripts/setup.sh builds it for AVX2 alone), or with --llama-bench BIN through llama.cpp's own
llama-bench (bench/build_llama_bench.sh builds it at the instruction set of the zack build it meets:
compare like with like), on the same GGUF, with f16 and q4_0 KV caches; zack through `zack
bench`, uncompressed and with the given .zack at --kv-rate 0.5 (alone and with
a 4-bit cache). Both see the same kind of input (random ordinary tokens), the
same thread count, and the same depths. Prints a Markdown table with the
machine, date and the ratios; append it to bench/RESULTS.md by hand.

  python3 bench/compare_llamacpp.py --zack build/zack --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
      [--zack-model m.zack] [--threads 2] [--depths 0,2048,8192] [--prompt 512,2048] [--gen 32] [--reps 2]
      [--rounds 3] [--llama-bench "$(bash bench/build_llama_bench.sh avx512)"]
"""
import argparse
import datetime
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time


def llama_bench(model, threads, depths, prompts, gen, reps, cache):
    import llama_cpp
    kw = {}
    if cache == "q4_0":  # llama.cpp needs flash attention for a quantized V cache
        kw = dict(type_k=llama_cpp.GGML_TYPE_Q4_0, type_v=llama_cpp.GGML_TYPE_Q4_0, flash_attn=True)
    elif cache == "f16-fa":
        kw = dict(flash_attn=True)
    n_ctx = max(depths) + max(max(prompts), gen) + 16
    llm = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                          n_batch=512, n_ubatch=512, verbose=False, logits_all=False, **kw)
    rng = random.Random(1)
    n_vocab = llm.n_vocab()
    toks = lambda n: [rng.randrange(100, n_vocab - 100) for _ in range(n)]
    rows = []
    for d in depths:
        ctx = toks(d)
        llm.reset()
        if d:
            llm.eval(ctx)  # the depth is prefilled once; each repetition rewinds to it
        for kind, n in [("pp", p) for p in prompts] + [("tg", gen)]:
            if kind == "pp" and d > 0:
                continue  # prefill speed at depth 0 only
            tps = []
            for rep in range(reps + 1):
                llm.n_tokens = d  # later evals overwrite the cache from here
                t = toks(n)
                t0 = time.perf_counter()
                if kind == "pp":
                    llm.eval(t)
                else:
                    for x in t:
                        llm.eval([x])
                dt = time.perf_counter() - t0
                if rep:
                    tps.append(n / dt)
            rows.append(dict(engine=f"llama.cpp {cache}", test=f"{kind}{n}", depth=d, tps=statistics.mean(tps),
                             sd=statistics.stdev(tps) if len(tps) > 1 else 0.0, kv=llama_kv_bytes(llm, cache)))
            print(f"  llama.cpp {cache} {kind}{n} @ {d}: {rows[-1]['tps']:.1f} tok/s", file=sys.stderr)
    return rows


def llama_bench_cli(binary, model, threads, depths, prompts, gen, reps, cache):
    """The same rows from llama.cpp's llama-bench (its own warm-up; -r reps)."""
    flags = {"f16": ["-fa", "0"], "f16-fa": ["-fa", "1"],
             "q4_0": ["-fa", "1", "-ctk", "q4_0", "-ctv", "q4_0"]}[cache]
    # prefill at depth 0 only (as llama_bench), then decode at every depth
    runs = [("0", ",".join(map(str, prompts))), (",".join(map(str, depths)), "0")]
    rows = []
    for d, p in runs:
        args = [binary, "-m", model, "-t", str(threads), "-r", str(reps), "-o", "json", "-d", d, "-p", p,
                "-n", str(gen) if p == "0" else "0", *flags]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama-bench failed (exit {r.returncode}): {r.stderr.strip()[-300:]}")
        for x in json.loads(r.stdout):
            test = f"pp{x['n_prompt']}" if x["n_prompt"] else f"tg{x['n_gen']}"
            rows.append(dict(engine=f"llama.cpp {cache}", test=test, depth=x["n_depth"], tps=x["avg_ts"],
                             sd=x["stddev_ts"], kv=gguf_kv_bytes(model, cache)))
            print(f"  llama.cpp {cache} {test} @ {x['n_depth']}: {x['avg_ts']:.1f} tok/s", file=sys.stderr)
    return rows


def gguf_kv_bytes(model, cache):
    """llama_kv_bytes from the GGUF's own keys (llama-bench reports no cache size)."""
    import gguf
    r = gguf.GGUFReader(model)
    val = lambda k: r.fields[k].contents() if k in r.fields else None
    arch = val("general.architecture")
    n_layer, n_head = val(f"{arch}.block_count"), val(f"{arch}.attention.head_count")
    n_head_kv = val(f"{arch}.attention.head_count_kv") or n_head
    head = val(f"{arch}.attention.key_length") or val(f"{arch}.embedding_length") // n_head
    row = head * n_head_kv
    return 2 * n_layer * (row * 18 // 32 if cache == "q4_0" else row * 2)


def llama_kv_bytes(llm, cache):
    """KV bytes per token of llama.cpp's cache: K and V rows of n_embd_k_gqa
    elements per layer, f16 (2 bytes) or q4_0 (18 bytes per 32)."""
    import llama_cpp
    m = llm.model
    n_layer = llama_cpp.llama_model_n_layer(m)
    n_head = llama_cpp.llama_model_n_head(m)
    n_head_kv = llama_cpp.llama_model_n_head_kv(m)
    n_embd = llama_cpp.llama_model_n_embd(m)
    row = n_embd // n_head * n_head_kv
    per_row = row * 18 // 32 if cache == "q4_0" else row * 2
    return 2 * n_layer * per_row


def zack_bench(zack, model, threads, depths, prompts, gen, reps, label, extra):
    rows = []
    for d in depths:
        args = [zack, "bench", "-m", model, "-t", str(threads), "-d", str(d), "-r", str(reps), "-o", "json",
                "-p", ",".join(map(str, prompts)) if d == 0 else "0", "-n", str(gen), *extra]
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"zack bench failed: {r.stderr.strip()}")
        for x in json.loads(r.stdout)["results"]:
            rows.append(dict(engine=label, test=x["test"], depth=x["depth"], tps=x["tokens_per_s"],
                             sd=x["tokens_per_s_std"], kv=x["kv_bytes_per_token"]))
            print(f"  {label} {x['test']} @ {d}: {x['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--zack", default="build/zack")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--zack-model", default="", help="a .zack of the same model for the compressed rows")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depths", default="0,2048,8192")
    ap.add_argument("--prompt", default="512", help="prefill lengths at depth 0, comma-separated (e.g. 512,2048)")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--llama-bench", default=None, metavar="BIN",
                    help="measure llama.cpp with this llama-bench (bench/build_llama_bench.sh) "
                         "instead of llama-cpp-python")
    ap.add_argument("--llama-caches", default="f16,f16-fa,q4_0",
                    help="llama.cpp caches: f16 (no flash attention), f16-fa, q4_0 (flash attention)")
    ap.add_argument("--extra", action="append", default=[], metavar="LABEL=FLAGS",
                    help="another zack row on --zack-model (or --model), e.g. 'h2o 1024=--kv-evict h2o --kv-budget 1024'")
    ap.add_argument("--no-rate-rows", action="store_true",
                    help="with --zack-model, skip its ZACK rate 0.5 rows (only --extra rows use it)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every engine this many times in turn; rows give the median (± half the range)")
    ap.add_argument("--json", default="", help="also write every row to this JSON file")
    a = ap.parse_args()
    if a.llama_bench is not None and not (os.path.isfile(a.llama_bench) and os.access(a.llama_bench, os.X_OK)):
        # also catches "$(bash bench/build_llama_bench.sh ...)" when the build failed and printed nothing
        sys.exit(f"--llama-bench: '{a.llama_bench}' is not an executable file")
    depths = [int(x) for x in a.depths.split(",")]
    prompts = [int(x) for x in a.prompt.split(",")]

    def measure_all():
        rows = []
        print("measuring llama.cpp ...", file=sys.stderr)
        for cache in a.llama_caches.split(","):
            if a.llama_bench is not None:
                rows += llama_bench_cli(a.llama_bench, a.model, a.threads, depths, prompts, a.gen, a.reps, cache)
            else:
                rows += llama_bench(a.model, a.threads, depths, prompts, a.gen, a.reps, cache)
        print("measuring zack ...", file=sys.stderr)
        rows += zack_bench(a.zack, a.model, a.threads, depths, prompts, a.gen, a.reps, "zack f16", [])
        if a.zack_model and not a.no_rate_rows:
            rows += zack_bench(a.zack, a.zack_model, a.threads, depths, prompts, a.gen, a.reps, "zack ZACK0.5",
                               ["--kv-rate", "0.5"])
            rows += zack_bench(a.zack, a.zack_model, a.threads, depths, prompts, a.gen, a.reps,
                               "zack ZACK0.5+4bit", ["--kv-rate", "0.5", "--kv-bits", "4"])
        for e in a.extra:
            label, _, flags = e.partition("=")
            rows += zack_bench(a.zack, a.zack_model or a.model, a.threads, depths, prompts, a.gen, a.reps,
                               "zack " + label, flags.split())
        return rows

    # Rounds interleave the engines in time, so a slow spell of a shared
    # machine hits all of them rather than one: a row's tokens/s is the median
    # of its rounds' means, its spread the smallest and largest of them.
    rounds = []
    for i in range(a.rounds):
        if a.rounds > 1:
            print(f"round {i + 1}/{a.rounds}", file=sys.stderr)
        rounds.append(measure_all())
    rows = []
    for k, r in enumerate(rounds[0]):
        runs = [rd[k]["tps"] for rd in rounds]
        rows.append(dict(r, tps=statistics.median(runs), rounds=runs,
                         sd=r["sd"] if a.rounds == 1 else (max(runs) - min(runs)) / 2))

    def find(engine, test, depth):
        for r in rows:
            if r["engine"] == engine and r["test"] == test and r["depth"] == depth:
                return r
        return None

    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    print(f"### {datetime.date.today().isoformat()} — {cpu}, {a.threads} threads, {platform.system()}\n")
    print(f"model `{a.model}`" + (f", zack model `{a.zack_model}`" if a.zack_model else "") + "\n")
    if a.rounds > 1:
        print(f"tokens/s: median of {a.rounds} interleaved rounds ± half their range\n")
    print("| engine | test | depth | tokens/s | vs llama.cpp f16 | vs f16-fa | vs q4_0 | KV bytes/token |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")

    def ratio(r, engine):
        b = find(engine, r["test"], r["depth"])
        return f"{r['tps'] / b['tps']:.2f}x" if b else "-"

    for r in rows:
        kv = str(r.get("kv", "-"))
        print(f"| {r['engine']} | {r['test']} | {r['depth']} | {r['tps']:.1f} ± {r['sd']:.1f} | "
              f"{ratio(r, 'llama.cpp f16')} | {ratio(r, 'llama.cpp f16-fa')} | {ratio(r, 'llama.cpp q4_0')} | {kv} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(date=datetime.date.today().isoformat(), cpu=cpu, threads=a.threads, model=a.model,
                           zack_model=a.zack_model, rounds=a.rounds, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
