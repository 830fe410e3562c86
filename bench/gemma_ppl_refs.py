#!/usr/bin/env python3
"""Gemma 3 perplexity on one text from four engines, to tell rounding noise from
an engine error (issue #17's "within 0.5% of an independent reference"):

  zack         tests/tool_logits (prefill in one chunk) and with --batch 1 (one
               token at a time: the decode path)
  llama.cpp    llama-cpp-python, logits_all
  numpy exact  a float32/float64 forward written here from the GGUF (gguf-py
               dequantization, nothing from zack): embeddings x sqrt(n_embd),
               RMSNorm, Q/K/V, QK-norm, NeoX RoPE (base 10,000 on local layers,
               the file's on every 6th, global, layer), a 512-token window on
               local layers, softmax in float64, post-attention and post-FFN
               norms, GELU-tanh GLU, tied output
  numpy rounded  the same with llama.cpp's CPU rounding: 8-bit activation
               blocks before every quantized matmul (tests/ref/ref_forward.py's
               quantize_q8_blocks / act_rounding), Q, K, V and probabilities in f16

  python3 bench/gemma_ppl_refs.py [TEXT] [N_TOKENS]   (default: the Apache licence, 1000)
Needs build/ (tool_logits, tool_tokenize), models/gemma-3-270m-it-q4_k_m.gguf,
and the test requirements (gguf, numpy, llama-cpp-python). About 3 minutes.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "ref"))
import ref_gguf  # noqa: E402
from ref_forward import _dequant, _f16, act_rounding, quantize_q8_blocks  # noqa: E402

MODEL = ROOT / "models" / "gemma-3-270m-it-q4_k_m.gguf"
BUILD = Path(os.environ.get("ZACK_BUILD", ROOT / "build"))


def nll(logits, ids):
    lg = logits[:-1].astype(np.float64)
    m = lg.max(-1, keepdims=True)
    return np.log(np.exp(lg - m).sum(-1)) + m[:, 0] - lg[np.arange(len(ids) - 1), ids[1:]]


def numpy_ppl(ids, rounded):
    r = ref_gguf.reader(str(MODEL))
    f = lambda k: r.fields[k].contents()  # noqa: E731
    E, NL = int(f("gemma3.embedding_length")), int(f("gemma3.block_count"))
    NH, NKV = int(f("gemma3.attention.head_count")), int(f("gemma3.attention.head_count_kv"))
    HD, EPS = int(f("gemma3.attention.key_length")), float(f("gemma3.attention.layer_norm_rms_epsilon"))
    SWA, BASE = int(f("gemma3.attention.sliding_window")), float(f("gemma3.rope.freq_base"))
    T = {t.name: t for t in r.tensors}

    def lin(x, name):  # x [n, in] @ W.T, W [out, in]
        a = act_rounding(T[name].tensor_type)
        if rounded and a is not None and x.shape[-1] % a[0] == 0:
            x = quantize_q8_blocks(x, *a)
        return x @ _dequant(T[name]).T

    def rms(x, name):
        ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        return (x / np.sqrt(ms + EPS)).astype(np.float32) * _dequant(T[name])

    def rope(x, pos, base):  # x [n, heads, HD], NeoX pairs (i, i + HD/2)
        i = np.arange(HD // 2, dtype=np.float64)
        ang = pos[:, None] * (base ** (-2.0 * i / HD))[None, :]
        c, s = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
        a, b = x[..., :HD // 2], x[..., HD // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)

    n, pos, grp = len(ids), np.arange(len(ids)), NH // NKV
    x = _dequant(T["token_embd.weight"])[np.array(ids)] * np.float32(np.sqrt(E))
    for li in range(NL):
        p, local = f"blk.{li}.", (li + 1) % 6 != 0
        h = rms(x, p + "attn_norm.weight")
        q = rms(lin(h, p + "attn_q.weight").reshape(n, NH, HD), p + "attn_q_norm.weight")
        k = rms(lin(h, p + "attn_k.weight").reshape(n, NKV, HD), p + "attn_k_norm.weight")
        v = lin(h, p + "attn_v.weight").reshape(n, NKV, HD)
        q, k = rope(q, pos, 10000.0 if local else BASE), rope(k, pos, 10000.0 if local else BASE)
        if rounded:
            q, k, v = _f16(q), _f16(k), _f16(v)
        kk, vv = np.repeat(k, grp, axis=1).astype(np.float64), np.repeat(v, grp, axis=1).astype(np.float64)
        s = np.einsum("tgd,sgd->gts", q.astype(np.float64), kk) / np.sqrt(HD)
        hide = pos[None, :] > pos[:, None]
        if local:
            hide |= (pos[:, None] - pos[None, :]) >= SWA
        s = np.where(hide[None], -np.inf, s)
        s -= s.max(-1, keepdims=True)
        pr = np.exp(s)
        pr /= pr.sum(-1, keepdims=True)
        if rounded:
            pr = _f16(pr)
        o = np.einsum("gts,sgd->tgd", pr, vv).astype(np.float32).reshape(n, NH * HD)
        x = x + rms(lin(o, p + "attn_output.weight"), p + "post_attention_norm.weight")
        h = rms(x, p + "ffn_norm.weight")
        g = lin(h, p + "ffn_gate.weight").astype(np.float64)
        gelu = (0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g ** 3)))).astype(np.float32)
        x = x + rms(lin(gelu * lin(h, p + "ffn_up.weight"), p + "ffn_down.weight"), p + "post_ffw_norm.weight")
    x = rms(x, "output_norm.weight")
    out = "output.weight" if "output.weight" in T else "token_embd.weight"
    total = 0.0
    for t0 in range(0, n - 1, 128):  # logits in row blocks: the vocabulary is 262,144
        t1 = min(n - 1, t0 + 128)
        lg = lin(x[t0:t1], out).astype(np.float64)  # predictions of ids[t0 + 1 .. t1]
        m = lg.max(-1, keepdims=True)
        lse = np.log(np.exp(lg - m).sum(-1)) + m[:, 0]
        total += float((lse - lg[np.arange(t1 - t0), np.array(ids[t0 + 1:t1 + 1])]).sum())
    return float(np.exp(total / (n - 1)))


def main():
    text = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "data" / "calib" / "apache-2.0.txt"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    r = subprocess.run([str(BUILD / "tests" / "tool_tokenize"), str(MODEL), str(text)], capture_output=True,
                       text=True, check=True)
    ids = ([2] + [int(t) for t in r.stdout.split()])[:n]  # <bos> first
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        idf, out = Path(tmp) / "ids.txt", Path(tmp) / "logits.f32"
        idf.write_text(" ".join(map(str, ids)))
        for label, extra in (("zack, one prefill chunk", ["--batch", str(n)]),
                             ("zack, one token at a time", ["--batch", "1"])):
            subprocess.run([str(BUILD / "tests" / "tool_logits"), str(MODEL), str(idf), str(out), "--threads", "2"]
                           + extra, check=True, capture_output=True)
            z = np.fromfile(out, dtype="<f4").reshape(len(ids), -1)
            rows.append((label, float(np.exp(nll(z, ids).mean()))))
    import llama_cpp
    ref = llama_cpp.Llama(str(MODEL), n_ctx=max(1024, n), n_batch=max(1024, n), logits_all=True, verbose=False,
                          n_threads=2)
    ref.eval(ids)
    rows.append(("llama.cpp", float(np.exp(nll(np.array(ref.scores[:len(ids)], dtype=np.float32), ids).mean()))))
    rows.append(("numpy, exact float", numpy_ppl(ids, False)))
    rows.append(("numpy, llama.cpp's rounding", numpy_ppl(ids, True)))
    exact = rows[3][1]
    print(f"{text.name}, {len(ids)} tokens (BOS + text)\n\n| engine | perplexity | vs numpy exact |\n|---|---:|---:|")
    for label, p in rows:
        print(f"| {label} | {p:.4f} | {p / exact - 1:+.2%} |")


if __name__ == "__main__":
    main()
