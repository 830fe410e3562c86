#!/usr/bin/env python3
"""Perplexity of a GGUF model on a text: `zack eval --task ppl` against llama.cpp
(through llama-cpp-python, `pip install llama-cpp-python`), same model file,
same text, same context and the same chunking as llama.cpp's perplexity tool:

  tokens = tokenize(text, add_special=True)        (BOS only if the model adds one)
  chunk i = tokens[i*c : (i+1)*c], first token -> BOS when the model adds BOS
  scored: the logits at positions c/2 .. c-2 predict the next token
  PPL = exp(mean negative log-likelihood)

llama.cpp's logits come from llama-cpp-python with logits_all=True; the
log-softmax and the averaging are done here in numpy (float64). Prints both
figures and their relative difference; exits 1 when they differ by more than
--tol (default 1%).

  python3 bench/eval_vs_llamacpp.py [--model M.gguf] [--text FILE] [-c 256] [--chunks 8]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def llamacpp_ppl(model, text, n_ctx, max_chunks, threads):
    from llama_cpp import Llama  # imported here so --help works without it

    llm = Llama(model_path=model, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                n_threads=threads, verbose=False)
    tokens = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    bos = llm.token_bos()
    probe = llm.tokenize(b"a", add_bos=True, special=False)
    add_bos = len(probe) > 0 and probe[0] == bos and bos >= 0
    if len(tokens) < 2 * n_ctx:
        raise SystemExit("text has %d tokens; need at least %d for -c %d" % (len(tokens), 2 * n_ctx, n_ctx))
    n_chunk = len(tokens) // n_ctx
    if max_chunks > 0:
        n_chunk = min(n_chunk, max_chunks)
    first = n_ctx // 2
    nll, count = 0.0, 0
    for i in range(n_chunk):
        chunk = list(tokens[i * n_ctx:(i + 1) * n_ctx])
        orig = list(chunk)
        if add_bos:
            chunk[0] = bos
        llm.reset()
        llm.eval(chunk)
        logits = np.asarray(llm.scores[:n_ctx], dtype=np.float64)  # [n_ctx x n_vocab]
        rows = logits[first:n_ctx - 1]
        mx = rows.max(axis=1, keepdims=True)
        lse = mx[:, 0] + np.log(np.exp(rows - mx).sum(axis=1))
        nxt = np.asarray(orig[first + 1:n_ctx])
        nll += float((lse - rows[np.arange(len(nxt)), nxt]).sum())
        count += len(nxt)
        print("  llama.cpp chunk %d/%d: running ppl %.4f" % (i + 1, n_chunk, math.exp(nll / count)), file=sys.stderr)
    return math.exp(nll / count), len(tokens), n_chunk, count


def zack_ppl(zack, model, text_path, n_ctx, max_chunks, threads):
    out = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    cmd = [zack, "eval", "-m", model, "--task", "ppl", "--data", text_path, "-c", str(n_ctx), "-t", str(threads),
           "--json", out, "-q"]
    if max_chunks > 0:
        cmd += ["--limit", str(max_chunks)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        j = json.load(f)
    os.unlink(out)
    d = j["baseline"]["detail"]
    return j["baseline"]["value"], d["n_tokens_text"], d["n_chunks"], d["n_tokens_scored"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("-c", "--ctx", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=8, help="at most this many chunks (0 = all)")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--zack", default=os.environ.get("ZACK_BIN", os.path.join(ROOT, "build", "zack")))
    ap.add_argument("--tol", type=float, default=0.01, help="largest relative difference accepted")
    a = ap.parse_args()
    with open(a.text, encoding="utf-8") as f:
        text = f.read()

    t0 = time.time()
    zp, zn, zc, zs = zack_ppl(a.zack, a.model, a.text, a.ctx, a.chunks, a.threads)
    t1 = time.time()
    lp, ln, lc, ls = llamacpp_ppl(a.model, text, a.ctx, a.chunks, a.threads)
    t2 = time.time()
    rel = abs(zp - lp) / lp
    print("model %s\ntext %s, context %d" % (a.model, a.text, a.ctx))
    print("| tool      | tokens in text | chunks | tokens scored | PPL      | time (s) |")
    print("|-----------|----------------|--------|---------------|----------|----------|")
    print("| zack      | %14d | %6d | %13d | %8.4f | %8.1f |" % (zn, zc, zs, zp, t1 - t0))
    print("| llama.cpp | %14d | %6d | %13d | %8.4f | %8.1f |" % (ln, lc, ls, lp, t2 - t1))
    print("relative difference %.3f%% (tolerance %.1f%%)" % (100 * rel, 100 * a.tol))
    if zn != ln:
        print("note: the two tokenizers gave different token counts")
    return 0 if rel <= a.tol and zs == ls else 1


if __name__ == "__main__":
    sys.exit(main())
