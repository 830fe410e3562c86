#!/usr/bin/env python3
"""Qwen2.5-Coder 1.5B (Q4_K_M) and 0.5B against the independent numpy reference:
perplexity on real text and greedy continuations.

For each model (ZACK_MODEL_QWEN15, ZACK_MODEL_QWEN05) and each text in
tests/data/qwen_ref/*.txt (Python code and English prose, used byte for byte):
  1. ids = the text tokenized by tests/ref/ref_tokenizer.py (HF `tokenizers`
     built from the GGUF; test_tokenizer_ref.py shows zack's ids are the same);
  2. zack: `tests/tool_logits MODEL IDS OUT --greedy 32` gives the logits of every
     position and then 32 greedy ids G (argmax, lowest id on ties);
  3. reference: tests/ref/ref_forward.py in stream mode (weights dequantized by
     gguf-py one layer at a time, so peak memory stays ~1 GB for the 1.5B), one
     pass holding three kinds of lanes: the exact float32 reference on ids + G
     per text, and the same reference rounding like llama.cpp's CPU path on ids
     per text (8-bit activation blocks: Q8_K, 256 values with an f32 scale,
     before k-quant weights, Q8_0 before Q5_0/Q8_0; f16 Q/K/V and
     probabilities), see ref_forward.act_rounding;
  4. `zack run -m MODEL --raw -p TEXT -n 32 --temp 0` on the first text must
     print exactly the text of G (up to an end-of-generation token, where it
     stops).

Checks, with the figures that set their bounds
----------------------------------------------
Perplexity (ppl = exp(mean NLL of each next token), the first token unscored).
  * Issue #15's bound, |ppl_zack / ppl_llamacpp - 1| <= 0.5%, against llama.cpp
    itself (llama-cpp-python 0.3.36, built for AVX2 by scripts/setup.sh: the
    same arithmetic on every CI machine) on the first PPL_TOKENS tokens of four
    files of tests/data/tokenizer (Python, prose, a licence, C; zack's side from
    one `tool_logits --nll 1` run over the four, checked against nll() of its
    own logits on the first short text). The per-file figures swing by up to
    +-0.8% and partly cancel, so the bound is on the four together, and the
    1.5B, whose figures move most with the prefix, reads more tokens:
    measured 2026-12-03 (one run, every prefix of the first 512 tokens):
      1.5B: 256 a file -0.30% (per file -1.10% .. +0.76%), 384 -0.15%
            (-0.79% .. +0.74%), 512 +0.12% (-0.37% .. +0.64%);
      0.5B: 128 a file +0.23% (-1.23% .. +1.48%), 256 +0.06% (-0.80% ..
            +0.54%), 512 +0.06% (-0.32% .. +0.40%).
    Earlier runs at 512: 1.5B -0.10%, 0.5B +0.28%; at 1,024 (twice the time),
    1.5B +0.07% (-0.24% .. +0.58%), 0.5B +0.08% (-0.13% .. +0.32%). So 384
    tokens a file for the 1.5B (1,532 scored) and 256 for the 0.5B (1,020):
    the llama.cpp check was most of either test's time at 512.
    Why not on the short texts below against the numpy rounding reference:
    8-bit activations make the 1.5B's perplexity chaotic in the float order
    (its first-token activations are huge and share 256-value Q8_K blocks), so
    on 249 tokens the rounding reference moved from 10.2279 to 10.2995 (+0.7%)
    between an AVX2 and an AVX-512 machine, zack from 10.2355 to 10.2024, and
    llama.cpp reads 10.3311: any two of them differ by up to 1.3% there.
  * On the short texts, |ppl_zack / ppl_exact - 1| <= |ppl_rounding / ppl_exact
    - 1| + 0.5%: 8-bit activations cost perplexity by themselves (1.5B: the
    rounding reference +2.4% .. +3.1% from exact, zack +2.1% .. +2.5%, llama.cpp
    +2.7% .. +3.4%); zack must not lose more than that rounding explains.
Logits at every position against the exact reference, bounded by what the
rounding reference itself shows in the same run (no fixed constants):
  * mean over positions of max|zack - exact| / max|exact| <= 2x the rounding
    reference's (both ~0.03 on the 1.5B);
  * argmax flips against the exact reference <= 2x the rounding reference's + 2.
Greedy: G must be the exact reference's greedy continuation, i.e. at every step
G[k] is the argmax of the reference's logits after ids + G[:k] (one batched pass
checks all 32 steps). A step where G[k] is not the argmax passes only as a
near tie: the reference's top logit beats its logit for G[k] by at most
NEAR_TIE = 0.02 x max|logit| (over 300 positions of prose on the 1.5B, the
largest honest argmax flip against the exact reference was 0.0145 x max|logit|
for the rounding reference, 0.0123 for zack, 0.0074 for llama.cpp), and at most
MAX_NEAR steps per continuation; every such step is printed with its margin.
Later steps are then checked on zack's own tokens. (zack's continuations are
identical on both models and texts; llama.cpp's on the 1.5B code text is not:
see the report of issue #15.)

Argument: a model name (qwen2.5-coder-1.5b or qwen2.5-coder-0.5b) checks that one
alone; ctest runs the two as test_qwen_ref_1.5b and test_qwen_ref_0.5b.
Env: ZACK_MODEL_QWEN15, ZACK_MODEL_QWEN05 (GGUFs), ZACK_BUILD (tests/tool_logits),
ZACK_BIN (zack). A missing model, tool or llama_cpp fails the test.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one BLAS thread: ctest runs two tests at once
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "ref"))
import ref_forward  # noqa: E402
import ref_gguf  # noqa: E402
from ref_ppl import nll  # noqa: E402
import ref_tokenizer  # noqa: E402

MODELS = (("qwen2.5-coder-1.5b", "ZACK_MODEL_QWEN15"), ("qwen2.5-coder-0.5b", "ZACK_MODEL_QWEN05"))
TEXT_DIR = HERE / "data" / "qwen_ref"
# the perplexity against llama.cpp: the first PPL_TOKENS[model] tokens of each
PPL_FILES = ("code_textwrap.py.txt", "prose_handwritten.txt", "license_Apache-2.0.txt", "code_xxmodule.c.txt")
PPL_DIR = HERE / "data" / "tokenizer"
PPL_TOKENS = {"qwen2.5-coder-1.5b": 384, "qwen2.5-coder-0.5b": 256}
GREEDY_N = 32
PPL_TOL = 0.005
NEAR_TIE = 0.02
MAX_NEAR = 2


class Fail(Exception):
    pass


def zack_logits_greedy(tool, model, ids, n_vocab, tmp, n_greedy=GREEDY_N):
    ids_file, out_file = Path(tmp) / "ids.txt", Path(tmp) / "logits.f32"
    ids_file.write_text(" ".join(str(i) for i in ids))
    if out_file.exists():
        out_file.unlink()
    r = subprocess.run([str(tool), str(model), str(ids_file), str(out_file), "--threads", "2",
                        "--greedy", str(n_greedy)], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise Fail(f"tool_logits exited {r.returncode}: {r.stderr.strip()[-500:]}")
    a = np.fromfile(out_file, dtype="<f4")
    if a.size != len(ids) * n_vocab:
        raise Fail(f"tool_logits wrote {a.size} floats, expected {len(ids)} x {n_vocab}")
    if not np.all(np.isfinite(a)):
        raise Fail("tool_logits wrote non-finite logits")
    g = [int(x) for x in r.stdout.split()]
    if len(g) != n_greedy:
        raise Fail(f"tool_logits printed {len(g)} greedy ids, expected {n_greedy}")
    return a.reshape(len(ids), n_vocab), g


def zack_nll(tool, model, seqs, tmp):
    """zack's NLL of every next token of each sequence, end to end (tool_logits
    --nll: the model loaded once, ref_ppl.nll's arithmetic in C++)."""
    ids_file, out_file = Path(tmp) / "seqs.txt", Path(tmp) / "nll.f64"
    ids_file.write_text("".join(" ".join(str(i) for i in ids) + "\n" for ids in seqs))
    if out_file.exists():
        out_file.unlink()
    r = subprocess.run([str(tool), str(model), str(ids_file), str(out_file), "--threads", "2", "--nll", "1"],
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise Fail(f"tool_logits --nll exited {r.returncode}: {r.stderr.strip()[-500:]}")
    a = np.fromfile(out_file, dtype="<f8")
    want = sum(len(ids) - 1 for ids in seqs)
    if a.size != want or not np.all(np.isfinite(a)) or np.any(a < 0):
        raise Fail(f"tool_logits --nll wrote {a.size} values (expected {want}, finite, >= 0)")
    return a


def zack_run_text(zbin, model, text) -> bytes:
    cmd = [zbin, "run", "-m", str(model), "--raw", "-p", text, "-n", str(GREEDY_N), "--temp", "0", "-t", "2"]
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    if r.returncode != 0:
        raise Fail(f"zack run exited {r.returncode}: {r.stderr.decode(errors='replace').strip()[-500:]}")
    return r.stdout


def expected_run_output(model, g) -> bytes:
    """What `zack run` prints for the greedy ids g: the tokens' bytes up to the
    first end-of-generation token (Qwen: <|im_end|>, <|endoftext|>)."""
    info = ref_tokenizer.info(model)
    tok = ref_tokenizer.load(model)
    eog = {info["eos"]} | {tok.token_to_id(t) for t in ("<|im_end|>", "<|endoftext|>")}
    control = set(info["control"])
    out = b""
    for t in g:
        if t in eog:
            break
        if t not in control:
            out += ref_tokenizer.token_bytes(model, t)
    return out


def check_greedy(label, ref_rows, g):
    """ref_rows[k] = the exact reference's logits for predicting g[k], after
    ids + g[:k]. Returns (report lines, errors)."""
    near, errors, n_hard = [], [], 0
    for k, t in enumerate(g):
        row = ref_rows[k]
        top = int(np.argmax(row))
        if top == t:
            continue
        scale = float(np.abs(row).max())
        margin = float(row[top] - row[t])
        if margin <= NEAR_TIE * scale:
            near.append(f"step {k}: zack {t}, reference {top}, margin {margin:.4f} "
                        f"= {margin / scale:.4f} x max|logit| (near tie)")
        else:
            n_hard += 1
            if n_hard <= 3:
                errors.append(f"{label}: greedy step {k}: zack chose {t}, the reference's argmax is {top} "
                              f"by {margin:.4f} = {margin / scale:.4f} x max|logit| (near tie <= {NEAR_TIE})")
    if len(near) > MAX_NEAR:
        errors.append(f"{label}: {len(near)} near-tie steps in one continuation (allowed {MAX_NEAR})")
    srt = np.sort(ref_rows, -1)
    gaps = srt[:, -1] - srt[:, -2]
    k = int(np.argmin(gaps))
    if n_hard:
        status = f"NOT the reference's continuation: {n_hard} step(s) beyond a near tie"
    elif near:
        status = f"{len(near)} near-tie step(s): " + "; ".join(near)
    else:
        status = f"identical to the reference's greedy continuation ({GREEDY_N} tokens)"
    lines = [status, f"smallest top-2 gap on the path: {gaps[k]:.4f} at step {k}"]
    return lines, errors


def check_ppl_llamacpp(name, model, tool, n_vocab, tmp):
    """Issue #15's bound: zack's perplexity within PPL_TOL of llama.cpp's on PPL_FILES."""
    import llama_cpp

    n_tok = PPL_TOKENS[name]
    llm = llama_cpp.Llama(model_path=str(model), n_ctx=n_tok, n_batch=512, n_threads=2, n_threads_batch=2,
                          logits_all=True, verbose=False)
    nz, nl, parts = [], [], []
    seqs = [ref_tokenizer.encode(model, (PPL_DIR / f).read_bytes().decode("utf-8"))[:n_tok] for f in PPL_FILES]
    z_all = zack_nll(tool, model, seqs, tmp)
    for f, ids in zip(PPL_FILES, seqs):
        llm.reset()
        llm.eval(ids)
        lc = np.array(llm.scores[:len(ids)], dtype=np.float32)
        nz.append(z_all[:len(ids) - 1])
        z_all = z_all[len(ids) - 1:]
        nl.append(nll(lc[:-1], ids[1:]))
        parts.append(f"{f} {np.exp(nz[-1].mean()) / np.exp(nl[-1].mean()) - 1:+.2%}")
    del llm
    pz, pl = float(np.exp(np.concatenate(nz).mean())), float(np.exp(np.concatenate(nl).mean()))
    d = pz / pl - 1
    print(f"  perplexity against llama.cpp on {sum(len(v) for v in nz)} tokens of {len(PPL_FILES)} files: zack "
          f"{pz:.4f}, llama.cpp {pl:.4f} ({d:+.3%}; per file {', '.join(parts)})")
    if abs(d) > PPL_TOL:
        return [f"{name}: perplexity {pz:.4f} is {d:+.3%} from llama.cpp's {pl:.4f} (bound {PPL_TOL:.1%})"]
    return []


def check_model(name, model, tool, zbin, texts, tmp):
    t0 = time.time()
    errors = []
    ids = {p.name: ref_tokenizer.encode(model, text) for p, text in texts}
    info = ref_tokenizer.info(model)
    zack = {}
    for p, text in texts:
        zack[p.name] = zack_logits_greedy(tool, model, ids[p.name], info["n_vocab"], tmp)
    t_zack = time.time() - t0

    ref = ref_forward.Model(str(model), stream=True)
    lanes = [(ids[p.name] + zack[p.name][1], False) for p, _ in texts]
    lanes += [(ids[p.name], True) for p, _ in texts]
    out = ref.forward_lanes(lanes)
    exact = {p.name: out[i] for i, (p, _) in enumerate(texts)}
    rounding = {p.name: out[len(texts) + i] for i, (p, _) in enumerate(texts)}
    t_ref = time.time() - t0 - t_zack

    # perplexity over all texts together
    nz, ne, nr = [], [], []
    stats = dict(rel_zack=[], rel_round=[], flips_zack=0, flips_round=0, n=0)
    for p, _ in texts:
        n = len(ids[p.name])
        tgt = ids[p.name][1:]
        z, e, r = zack[p.name][0], exact[p.name][:n], rounding[p.name]
        nz.append(nll(z[:-1], tgt))
        ne.append(nll(e[:-1], tgt))
        nr.append(nll(r[:-1], tgt))
        scale = np.abs(e).max(-1)
        stats["rel_zack"].append(np.abs(z - e).max(-1) / scale)
        stats["rel_round"].append(np.abs(r - e).max(-1) / scale)
        stats["flips_zack"] += int((z.argmax(-1) != e.argmax(-1)).sum())
        stats["flips_round"] += int((r.argmax(-1) != e.argmax(-1)).sum())
        stats["n"] += n
    ppl = {k: float(np.exp(np.concatenate(v).mean())) for k, v in (("zack", nz), ("exact", ne), ("round", nr))}
    n_scored = sum(len(v) for v in nz)
    d_round = ppl["zack"] / ppl["round"] - 1  # printed: see the module docstring for why it is not bounded
    d_exact = ppl["zack"] / ppl["exact"] - 1
    d_rounding_exact = ppl["round"] / ppl["exact"] - 1
    print(f"\n{name}: {n_scored} tokens scored in {len(texts)} texts")
    print(f"  perplexity: zack {ppl['zack']:.4f}, reference with llama.cpp rounding {ppl['round']:.4f} "
          f"({d_round:+.3%}), exact reference {ppl['exact']:.4f} ({d_exact:+.3%}; the rounding "
          f"reference {d_rounding_exact:+.3%})")
    if abs(d_exact) > abs(d_rounding_exact) + PPL_TOL:
        errors.append(f"{name}: perplexity {ppl['zack']:.4f} is {d_exact:+.3%} from the exact reference's "
                      f"{ppl['exact']:.4f}, more than rounding explains ({d_rounding_exact:+.3%}) + {PPL_TOL:.1%}")
    rel_z = float(np.concatenate(stats["rel_zack"]).mean())
    rel_r = float(np.concatenate(stats["rel_round"]).mean())
    print(f"  logits vs exact: mean max|diff|/max|ref| zack {rel_z:.4f}, rounding reference {rel_r:.4f}; "
          f"argmax flips zack {stats['flips_zack']}, rounding reference {stats['flips_round']} "
          f"of {stats['n']} positions")
    if rel_z > 2 * rel_r:
        errors.append(f"{name}: mean relative logit error {rel_z:.4f} > 2x the rounding reference's {rel_r:.4f}")
    if stats["flips_zack"] > 2 * stats["flips_round"] + 2:
        errors.append(f"{name}: {stats['flips_zack']} argmax flips against the exact reference, more than "
                      f"2x the rounding reference's {stats['flips_round']} + 2")

    # tool_logits --nll (the llama.cpp check below) is ref_ppl.nll of the same logits
    first = texts[0][0].name
    zn = zack_nll(tool, model, [ids[first]], tmp)
    dn = float(np.abs(zn - nll(zack[first][0][:-1], ids[first][1:])).max())
    print(f"  tool_logits --nll against nll() of its logits on {first}: max |diff| {dn:.2e}")
    if dn > 1e-5:
        errors.append(f"{name}: tool_logits --nll differs from nll() of the logits by {dn:.2e}")

    for k, (p, text) in enumerate(texts):
        n = len(ids[p.name])
        g = zack[p.name][1]
        lines, errs = check_greedy(f"{name}/{p.name}", exact[p.name][n - 1:n - 1 + GREEDY_N], g)
        errors += errs
        print(f"  greedy after {p.name} ({n} tokens): " + "\n    ".join(lines))
        print(f"    {ref_tokenizer.decode(model, g)!r}")
        if k > 0:  # the CLI once per model: the greedy ids above are the same code's
            continue
        want = expected_run_output(model, g)
        got = zack_run_text(zbin, model, text)
        if got != want:
            errors.append(f"{name}/{p.name}: `zack run --raw -n {GREEDY_N} --temp 0` printed {got!r}, "
                          f"the greedy ids give {want!r}")
    errors += check_ppl_llamacpp(name, model, tool, info["n_vocab"], tmp)
    print(f"  ({t_zack:.1f} s zack logits, {t_ref:.1f} s reference, {time.time() - t0:.1f} s in all)")
    ref_gguf.release(str(model))  # the next model's pages need not stay mapped
    return errors


def main() -> int:
    # one model a run when named (ctest runs the two as two tests, side by side)
    names = [n for n, _ in MODELS]
    only = sys.argv[1] if len(sys.argv) > 1 else None
    if len(sys.argv) > 2 or (only and only not in names):
        print(f"FAIL: usage: test_qwen_ref.py [{'|'.join(names)}] (got {' '.join(sys.argv[1:])})")
        return 1
    build = os.environ.get("ZACK_BUILD")
    if not build:
        print("FAIL: ZACK_BUILD is not set (run through ctest, or export ZACK_BUILD=<build dir>)")
        return 1
    tool = Path(build) / "tests" / "tool_logits"
    zbin = os.environ.get("ZACK_BIN", str(Path(build) / "zack"))
    for path, what in ((tool, "build the tool_logits target"), (Path(zbin), "set ZACK_BIN")):
        if not path.is_file():
            print(f"FAIL: {path} not found ({what})")
            return 1
    texts = [(p, p.read_bytes().decode("utf-8")) for p in sorted(TEXT_DIR.glob("*.txt"))]
    if len(texts) < 2:
        print(f"FAIL: expected the texts in {TEXT_DIR}")
        return 1
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        print("FAIL: the llama_cpp package (llama-cpp-python) is the perplexity reference and is not installed "
              "(scripts/setup.sh installs it)")
        return 1
    errors = []
    with tempfile.TemporaryDirectory(prefix="zack_qwen_ref_") as tmp:
        problems = ref_forward.selftest(tmp)
        print("reference selftest: " + ("; ".join(problems) if problems else "ok"))
        errors += [f"reference selftest: {p}" for p in problems]
        for name, var in MODELS:
            if only and name != only:
                continue
            model = os.environ.get(var)
            if not model or not Path(model).is_file():
                errors.append(f"{name}: model file not found: {var}={model!r} "
                              f"(run scripts/fetch_model.sh {name})")
                continue
            try:
                errors += check_model(name, Path(model), tool, zbin, texts, tmp)
            except (Fail, subprocess.TimeoutExpired) as e:
                errors.append(f"{name}: {e}")
    if errors:
        print("\nFAILURES:")
        for e in errors:
            print("  - " + e)
        return 1
    print("\ntest_qwen_ref: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
