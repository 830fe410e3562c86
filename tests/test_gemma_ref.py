#!/usr/bin/env python3
"""Gemma 3 (gemma3-270m-it Q4_K_M) against independent references: HF
`tokenizers` for token ids, llama.cpp (llama-cpp-python, which runs gemma3) for
perplexity and greedy continuations.

1. Tokenizer. The reference is built here from the GGUF's own vocabulary (read
   by tests/ref/ref_gguf.metadata, which test_tokenizer_ref checks against gguf-py;
   not with zack) the way HF's converter builds Gemma's
   tokenizer.json from the SentencePiece model: models.BPE(vocab, merges,
   byte_fallback=True, fuse_unk=True) with merges taken from the vocabulary
   (every split of a normal piece into two normal pieces, ranked by the merged
   piece's score, ties by the parts' ids), a Replace(" ", "\u2581") normalizer,
   no pre-tokenizer, no space prefix, user-defined pieces (type 4: newline and
   space runs, ...) as non-special AddedTokens and control pieces (type 3) as
   special ones. For every file in tests/data/tokenizer (licences, source code,
   multilingual text, whitespace and digits, chat markup; ~190 KB), zack's ids
   (tests/tool_tokenize, no BOS) must be identical; chat_special.txt again with
   special tokens parsed.
2. Perplexity. Two texts read a priori (tests/data/tokenizer/prose_handwritten.txt
   and the first 700 tokens of code_textwrap.py.txt; both past the 512-token
   sliding window of the local layers), BOS + the reference's ids; logits of
   every position from tests/tool_logits and from llama.cpp (n_ctx 1024,
   logits_all). |ppl_zack / ppl_llamacpp - 1| <= 0.5% on the two texts together
   (their NLLs pooled), <= 1% on each. Why not 0.5% each: 8-bit activation
   blocks make the per-text figure move with the float summation order alone.
   Measured 2026-12-04 on prose (675 tokens; bench/gemma_ppl_refs.py gives the
   exact float32 numpy forward 22.1440 and the same forward with llama.cpp's
   rounding 22.1660, llama.cpp 22.1659): zack reads 22.0540 fed a token at a
   time, 22.0677 in chunks of 64 to 512 (this test's: 256), 22.2678 in one
   chunk of 675, i.e. -0.41% .. +0.56% of the exact figure with the same logits error
   (mean max|zack - exact| / max|exact| 0.038 in all three; llama.cpp's 0.039);
   without the packed weight tiles (other summation orders, the same integer
   sums) prose reads 22.1221 and code 11.2203 (11.1718 packed). When the test
   was written (2026-11-24) prose read -0.12% and code -0.13% against llama.cpp;
   on 2026-12-04 -0.44% and +0.29%, together -0.07%. Without the window
   (every layer global) zack's perplexity past position 512 goes up ~13x, so
   this also checks the window.
3. Greedy. After the first 600 tokens of the prose text (so the decode steps'
   local layers see a window that has moved on), zack's 32 greedy ids
   G (tool_logits --greedy) must be llama.cpp's greedy continuation: at every
   step G[k] is llama.cpp's argmax after ids + G[:k] (one pass over ids + G),
   or a near tie: llama.cpp's top logit beats G[k]'s by at most NEAR_TIE =
   0.05 x max|logit| (zack and llama.cpp differ by ~0.05 x max|logit| at a
   position on average: Q8 activations, f16 GELU table), at most MAX_NEAR
   steps. The count is a noisy statistic at margins of 0.1-0.8% of
   max|logit|: the same integer sums in two float summation orders (the
   Q8_0 row kernels and the packed ones, 2026-11-29) gave 3 and 4 near ties
   of 32, the same two first ones; 5 leaves room for that noise and still
   fails a continuation that departs from llama.cpp's. And `zack run --raw
   -n 32 --temp 0` prints G's text.

Env: ZACK_MODEL_GEMMA (the GGUF), ZACK_BUILD (tests/tool_logits,
tests/tool_tokenize), ZACK_BIN. A missing model, tool or llama_cpp fails.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent / "ref"))
import ref_gguf  # noqa: E402  (the GGUF metadata, read without gguf.GGUFReader's ~25 s for this vocabulary)
import ref_ppl  # noqa: E402

HERE = Path(__file__).resolve().parent
TOK_DIR = HERE / "data" / "tokenizer"
PPL_TEXTS = (("prose_handwritten.txt", 700), ("code_textwrap.py.txt", 700))
PPL_TOL = 0.005       # the two texts together
PPL_TOL_TEXT = 0.01   # each text
GREEDY_PROMPT = 600
GREEDY_N = 32
NEAR_TIE = 0.05
MAX_NEAR = 5
TYPE_NORMAL, TYPE_CONTROL, TYPE_USER = 1, 3, 4

errors: list[str] = []


def fail(msg):
    errors.append(msg)
    print("FAIL: " + msg)


def build_reference_tokenizer(model: Path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers
    meta = ref_gguf.metadata(str(model))
    toks = meta["tokenizer.ggml.tokens"]
    types = meta["tokenizer.ggml.token_type"]
    scores = meta["tokenizer.ggml.scores"]
    if meta["tokenizer.ggml.model"] != "llama":
        raise SystemExit(f"FAIL: {model}: expected a SentencePiece-style vocabulary")
    vocab: dict[str, int] = {}
    for i, t in enumerate(toks):
        vocab.setdefault(t, i)
    normal = {t for t, ty in zip(toks, types) if ty == TYPE_NORMAL}
    merges = []
    for i, (t, ty) in enumerate(zip(toks, types)):
        if ty != TYPE_NORMAL or len(t) < 2:
            continue
        splits = [(t[:k], t[k:]) for k in range(1, len(t)) if t[:k] in normal and t[k:] in normal]
        splits.sort(key=lambda p: (vocab[p[0]], vocab[p[1]]))
        merges += [(p, scores[i]) for p in splits]
    merges.sort(key=lambda m: -m[1])  # stable: ties keep the order above
    tk = Tokenizer(models.BPE(vocab=vocab, merges=[m[0] for m in merges], unk_token="<unk>", fuse_unk=True,
                              byte_fallback=True))
    tk.normalizer = normalizers.Replace(" ", "\u2581")
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
    tk.add_tokens([AddedToken(t, special=False, normalized=False) for t, ty in zip(toks, types) if ty == TYPE_USER])
    tk.add_special_tokens([AddedToken(t, special=True, normalized=False)
                           for t, ty in zip(toks, types) if ty == TYPE_CONTROL])
    return tk, len(toks), [i for i, ty in enumerate(types) if ty == TYPE_CONTROL]


def zack_tokenize(build: Path, model: Path, path: Path, special: bool) -> list[int]:
    cmd = [str(build / "tests" / "tool_tokenize"), str(model), str(path)] + (["--special"] if special else [])
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: tool_tokenize exited {r.returncode}: {r.stderr.strip()[-300:]}")
    return [int(x) for x in r.stdout.split()]


def check_tokenizer(build, model, tk):
    n_files, n_ids = 0, 0
    for p in sorted(TOK_DIR.glob("*")):
        if p.name == "README.md" or not p.is_file():
            continue
        text = p.read_bytes().decode("utf-8")  # bytes as they are: no newline translation
        for special in (False, True) if p.name == "chat_special.txt" else (False,):
            z = zack_tokenize(build, model, p, special)
            h = tk.encode(text, add_special_tokens=False).ids if special else encode_plain(tk, text)
            n_files += 1
            n_ids += len(h)
            if z != h:
                k = next((i for i in range(min(len(z), len(h))) if z[i] != h[i]), min(len(z), len(h)))
                fail(f"tokenizer: {p.name}{' (special)' if special else ''}: {len(z)} ids vs the reference's "
                     f"{len(h)}, first difference at {k}: zack {z[k:k + 4]}, reference {h[k:k + 4]}")
    print(f"tokenizer: {n_files} encodings, {n_ids} ids compared with HF tokenizers")


_PLAIN = {}


def encode_plain(tk, text):
    """The reference without special-token parsing: split the text so that no
    control piece is matched (the control pieces' own text is then tokenized
    by the BPE like any other text)."""
    if "tk" not in _PLAIN:
        from tokenizers import Tokenizer
        plain = Tokenizer.from_str(tk.to_str())
        import json
        cfg = json.loads(plain.to_str())
        cfg["added_tokens"] = [a for a in cfg["added_tokens"] if not a["special"]]
        _PLAIN["tk"] = Tokenizer.from_str(json.dumps(cfg))
    return _PLAIN["tk"].encode(text, add_special_tokens=False).ids


def nll(logits: np.ndarray, ids) -> np.ndarray:
    """Of each next token: logits[i] predicts ids[i + 1]."""
    return ref_ppl.nll(logits[:-1], ids[1:])


def zack_logits(build, model, ids, n_vocab, tmp, greedy=0):
    ids_file, out_file = Path(tmp) / "ids.txt", Path(tmp) / "logits.f32"
    ids_file.write_text(" ".join(str(i) for i in ids))
    cmd = [str(build / "tests" / "tool_logits"), str(model), str(ids_file), str(out_file), "--threads", "2"]
    if greedy:
        cmd += ["--greedy", str(greedy)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"FAIL: tool_logits exited {r.returncode}: {r.stderr.strip()[-300:]}")
    a = np.fromfile(out_file, dtype="<f4")
    if a.size != len(ids) * n_vocab or not np.all(np.isfinite(a)):
        raise SystemExit(f"FAIL: tool_logits wrote {a.size} floats (expected {len(ids)} x {n_vocab}, finite)")
    return a.reshape(len(ids), n_vocab), [int(x) for x in r.stdout.split()]


def main() -> int:
    build = os.environ.get("ZACK_BUILD")
    model = os.environ.get("ZACK_MODEL_GEMMA")
    zbin = os.environ.get("ZACK_BIN", str(Path(build or ".") / "zack"))
    if not build:
        print("FAIL: ZACK_BUILD is not set")
        return 1
    build = Path(build)
    if not model or not Path(model).is_file():
        print(f"FAIL: model file not found: ZACK_MODEL_GEMMA={model!r} (run scripts/fetch_model.sh gemma3-270m)")
        return 1
    model = Path(model)
    try:
        import llama_cpp
    except ImportError:
        print("FAIL: the llama_cpp package (llama-cpp-python) is the reference and is not installed")
        return 1
    t0 = time.time()
    tk, n_vocab, control = build_reference_tokenizer(model)
    check_tokenizer(build, model, tk)
    t_tok = time.time() - t0

    ref = llama_cpp.Llama(str(model), n_ctx=1024, n_batch=1024, logits_all=True, verbose=False, n_threads=2)
    bos = 2
    with tempfile.TemporaryDirectory(prefix="zack_gemma_ref_") as tmp:
        sums = np.zeros(3)  # NLL sums of zack and llama.cpp, scored tokens
        for name, n_max in PPL_TEXTS:
            text = (TOK_DIR / name).read_bytes().decode("utf-8")
            ids = ([bos] + encode_plain(tk, text))[:n_max]
            z, _ = zack_logits(build, model, ids, n_vocab, tmp)
            ref.reset()
            ref.eval(ids)
            r = np.array(ref.scores[:len(ids)], dtype=np.float32)
            nz, nr = nll(z, ids), nll(r, ids)
            sums += (nz.sum(), nr.sum(), len(nz))
            pz, pr = float(np.exp(nz.mean())), float(np.exp(nr.mean()))
            rel = float((np.abs(z - r).max(-1) / np.abs(r).max(-1)).mean())
            agree = float((z.argmax(-1) == r.argmax(-1)).mean())
            print(f"perplexity {name} ({len(ids)} tokens): zack {pz:.4f}, llama.cpp {pr:.4f} ({pz / pr - 1:+.3%}); "
                  f"mean max|diff|/max|logit| {rel:.4f}, argmax agreement {agree:.1%}")
            if abs(pz / pr - 1) > PPL_TOL_TEXT:
                fail(f"{name}: perplexity {pz:.4f} is {pz / pr - 1:+.3%} from llama.cpp's {pr:.4f} "
                     f"(bound {PPL_TOL_TEXT:.1%} a text)")
        pz, pr = float(np.exp(sums[0] / sums[2])), float(np.exp(sums[1] / sums[2]))
        print(f"perplexity of the {len(PPL_TEXTS)} texts together ({int(sums[2])} scored tokens): zack {pz:.4f}, "
              f"llama.cpp {pr:.4f} ({pz / pr - 1:+.3%})")
        if abs(pz / pr - 1) > PPL_TOL:
            fail(f"perplexity of the texts together {pz:.4f} is {pz / pr - 1:+.3%} from llama.cpp's {pr:.4f} "
                 f"(bound {PPL_TOL:.1%})")

        # greedy continuation
        text = (TOK_DIR / PPL_TEXTS[0][0]).read_bytes().decode("utf-8")
        ids = ([bos] + encode_plain(tk, text))[:GREEDY_PROMPT]
        _, g = zack_logits(build, model, ids, n_vocab, tmp, greedy=GREEDY_N)
        if len(g) != GREEDY_N:
            fail(f"tool_logits printed {len(g)} greedy ids, expected {GREEDY_N}")
        ref.reset()
        ref.eval(ids + g)
        rows = np.array(ref.scores[len(ids) - 1:len(ids) - 1 + len(g)], dtype=np.float32)
        near, hard = [], 0
        for k, t in enumerate(g):
            top = int(np.argmax(rows[k]))
            if top == t:
                continue
            scale = float(np.abs(rows[k]).max())
            margin = float(rows[k][top] - rows[k][t])
            if margin <= NEAR_TIE * scale:
                near.append(f"step {k}: zack {t}, llama.cpp {top}, margin {margin / scale:.4f} x max|logit|")
            else:
                hard += 1
                fail(f"greedy step {k}: zack chose {t}, llama.cpp's argmax is {top} by "
                     f"{margin / scale:.4f} x max|logit| (near tie <= {NEAR_TIE})")
        if len(near) > MAX_NEAR:
            fail(f"greedy: {len(near)} near-tie steps (allowed {MAX_NEAR})")
        print(f"greedy after {len(ids)} tokens: {GREEDY_N - len(near) - hard} of {GREEDY_N} steps llama.cpp's "
              f"argmax" + ("; " + "; ".join(near) if near else ""))
        # zack run prints the same continuation (up to an end-of-generation token)
        eog = {1, 106}  # <eos>, <end_of_turn>
        want = []
        for t in g:
            if t in eog:
                break
            if t not in control:
                want.append(t)
        want_text = tk.decode(want, skip_special_tokens=False).encode()
        prompt = tk.decode(ids[1:], skip_special_tokens=False)
        r = subprocess.run([zbin, "run", "-m", str(model), "--raw", "-p", prompt, "-n", str(GREEDY_N),
                            "--temp", "0", "-t", "2"], capture_output=True, timeout=300)
        if r.returncode != 0:
            fail(f"zack run exited {r.returncode}: {r.stderr.decode(errors='replace').strip()[-300:]}")
        elif r.stdout != want_text:
            fail(f"`zack run --raw -n {GREEDY_N} --temp 0` printed {r.stdout[:200]!r}, the greedy ids give "
                 f"{want_text[:200]!r}")
        print(f"  {want_text.decode(errors='replace')!r}")
    print(f"({t_tok:.1f} s tokenizer, {time.time() - t0:.1f} s in all)")
    if errors:
        print("\nFAILURES:\n" + "\n".join("  - " + e for e in errors))
        return 1
    print("\ntest_gemma_ref: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
