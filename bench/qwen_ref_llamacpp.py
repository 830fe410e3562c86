#!/usr/bin/env python3
"""llama.cpp's figures for tests/test_qwen_ref.py: on the same texts and token ids
(tests/data/qwen_ref/*.txt, tokenized by tests/ref/ref_tokenizer.py), llama.cpp
through llama-cpp-python (`pip install llama-cpp-python`; not needed by the tests)
gives the logits of every position and a 32-token greedy continuation per text;
the numpy reference (exact, and rounding like llama.cpp) runs on the same ids.
Prints the perplexities over all texts together and whether llama.cpp's greedy
continuation is the exact reference's, with the margin of its first divergence.

  python3 bench/qwen_ref_llamacpp.py MODEL.gguf [--threads 2]
"""
import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "ref"))
import ref_forward  # noqa: E402
import ref_tokenizer  # noqa: E402
from test_qwen_ref import GREEDY_N, TEXT_DIR, nll  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    import llama_cpp  # here, so --help works without it

    texts = [(p.name, p.read_bytes().decode("utf-8")) for p in sorted(TEXT_DIR.glob("*.txt"))]
    ids = {n: ref_tokenizer.encode(a.model, t) for n, t in texts}
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=1024, n_batch=512, n_threads=a.threads,
                          n_threads_batch=a.threads, logits_all=True, verbose=False)
    logits, greedy = {}, {}
    for n, t in texts:
        if llm.tokenize(t.encode("utf-8"), add_bos=False, special=False) != ids[n]:
            print(f"{n}: llama.cpp tokenizes the text differently from the reference")
            return 1
        llm.reset()
        llm.eval(ids[n])
        logits[n] = np.array(llm.scores[:len(ids[n])], dtype=np.float32)
        g = []
        for _ in range(GREEDY_N):
            g.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([g[-1]])
        greedy[n] = g
    ref = ref_forward.Model(a.model, stream=True)
    out = ref.forward_lanes([(ids[n] + greedy[n], False) for n, _ in texts] + [(ids[n], True) for n, _ in texts])
    k = len(texts)
    exact = [out[i][:len(ids[n])] for i, (n, _) in enumerate(texts)]
    ppl = {}
    for label, rows in (("llama.cpp", [logits[n] for n, _ in texts]), ("exact", exact), ("rounding", out[k:])):
        ppl[label] = float(np.exp(np.concatenate([nll(r[:-1], ids[n][1:]) for r, (n, _) in zip(rows, texts)]).mean()))
    print(f"{Path(a.model).name}: perplexity llama.cpp {ppl['llama.cpp']:.4f}, exact reference {ppl['exact']:.4f}, "
          f"rounding reference {ppl['rounding']:.4f} (llama.cpp {ppl['llama.cpp'] / ppl['exact'] - 1:+.3%} from "
          f"exact, {ppl['llama.cpp'] / ppl['rounding'] - 1:+.3%} from rounding)")
    for i, (n, _) in enumerate(texts):
        m = len(ids[n])
        rows = out[i][m - 1:m - 1 + GREEDY_N]
        diverge = [s for s in range(GREEDY_N) if int(rows[s].argmax()) != greedy[n][s]]
        if not diverge:
            print(f"  {n}: llama.cpp's greedy continuation is the exact reference's")
        else:
            s = diverge[0]
            r = rows[s]
            margin = float(r.max() - r[greedy[n][s]])
            print(f"  {n}: llama.cpp first leaves the exact reference's argmax at step {s}: margin {margin:.4f} "
                  f"= {margin / float(np.abs(r).max()):.4f} x max|logit|")
        print(f"    {ref_tokenizer.decode(a.model, greedy[n])!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
