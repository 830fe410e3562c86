#!/usr/bin/env python3
"""Key bases for quantization, simulated (bench/RESULTS.md, 2026-12-07 "key bases for quantized keys").

An experiment, not part of zack. On a `key_quantizers.py capture` (held-out and
training q, k, v of Qwen2.5-Coder-1.5B from a numpy forward pass), each KV head's
keys are coded in a basis, per-channel widths {0, 1, 2, 4} water-filled on the
engine's proxy (sqrt E[q_c^2] x within-group variance x f(b)) at a byte budget a
row, and the six query heads' attention outputs compared with the exact ones
(values exact; key_quantizers.att_err). The bases, each a pair (A, B) with
A B^T = I (queries q A, keys (k - mu) B; calib/keybasis.h):
  pca     the .zack's R_qk (eigenvectors of C_q + C_k; what the plans use)
  score   calib/keybasis.h's score basis: SVD of L_q^T L_k (C = L L^T)
  wscore  the same with the keys' within-group scatter C_w (what a per-channel
          grid over 32 tokens codes) in place of their total second moment
  wscore½ wscore with C_q^1/2 in place of C_q (the proxy's square root of the
          query energy, calib/keybasis.h, as the basis's weight too); ¼, ¾ likewise
  pair    wscore½ at unit within-group RMS a direction, the widths water-filled
          on sqrt(E[q_c^2] var_w,c) (calib/keybasis.h keybasis_quant_pair, as built)
  pair²   the same on E[q_c^2] var_w,c (the expected score error itself)
The other bases take the engine's proxy sqrt(E[q_c^2]) var_w,c, whose value
depends on a direction's scale (the pca basis is orthonormal; the score bases
carry S^1/2).
BASES=pca,pair,... picks some.

  python3 bench/experiments/key_basis_quant.py MODEL.zack CAPTURE_DIR [LAYER ...]
"""
import os
import sys
import time

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from key_quantizers import D, G, KV, att_err, quant_alloc, water_fill  # noqa: E402


def chol(C):
    C = 0.5 * (C + C.T)
    return np.linalg.cholesky(C + 1e-6 * np.trace(C) / len(C) * np.eye(len(C)))


def score_pair(Cq, Ck):
    """A, B with A B^T = I from the SVD of L_q^T L_k (keybasis_score)."""
    Lq, Lk = chol(Cq), chol(Ck)
    X, S, Yt = np.linalg.svd(Lq.T @ Lk)
    A = np.linalg.solve(Lq.T, X) * np.sqrt(S)
    B = np.linalg.solve(Lk.T, Yt.T) * np.sqrt(S)
    return A, B


def powm(C, a):
    w, U = np.linalg.eigh(0.5 * (C + C.T))
    return (U * np.maximum(w, 0) ** a) @ U.T


def main(zack, out, layers):
    z = GGUFReader(zack)
    zt = {t.name: t for t in z.tensors}
    te, tr = np.load(f"{out}/test.npz"), np.load(f"{out}/train.npz")
    t0 = time.time()
    budgets = (23, 28, 34)
    bases = tuple(os.environ.get("BASES", "pca,score,wscore,wscore¾,wscore½,wscore¼,pair,pair²").split(","))
    res, heads = [], []
    for il in layers:
        R = np.array(zt[f"blk.{il}.zack.rqk"].data, np.float32).reshape(KV, D, D).astype(np.float64)
        mu = np.array(zt[f"blk.{il}.zack.kmean"].data, np.float32).reshape(KV, D).astype(np.float64)
        for g in range(KV):
            k0, v = te["k"][0, il, :, g, :].astype(np.float64), te["v"][0, il, :, g, :]
            q = te["q"][0, il][:, g * G:(g + 1) * G, :]
            ktr = tr["k"][:, il, :, g, :].reshape(-1, D).astype(np.float64) - mu[g]
            qtr = tr["q"][:, il][:, :, g * G:(g + 1) * G, :].reshape(-1, D).astype(np.float64)
            Cq = qtr.T @ qtr / len(qtr)
            Ck = ktr.T @ ktr / len(ktr)
            grp = ktr[:len(ktr) - len(ktr) % 32].reshape(-1, 32, D)
            dev = (grp - grp.mean(1, keepdims=True)).reshape(-1, D)
            Cw = dev.T @ dev / len(dev)
            pairs = {"pca": (R[g], R[g]), "score": score_pair(Cq, Ck), "wscore": score_pair(Cq, Cw),
                     "wscore½": score_pair(powm(Cq, 0.5), Cw),
                     "wscore¼": score_pair(powm(Cq, 0.25), Cw), "wscore¾": score_pair(powm(Cq, 0.75), Cw)}
            A, B = pairs["wscore½"]
            sw = np.sqrt(((dev @ B) ** 2).mean(0))
            pairs["pair"] = pairs["pair²"] = (A * sw, B / sw)
            row = []
            for name in bases:
                A, B = pairs[name]
                assert np.abs(A @ B.T - np.eye(D)).max() < 1e-6, name
                kb, kbt = (k0 - mu[g]) @ B, ktr @ B
                eq = ((qtr @ A) ** 2).mean(0)
                gb = kbt[:len(kbt) - len(kbt) % 32].reshape(-1, 32, D)
                varw = ((gb - gb.mean(1, keepdims=True)) ** 2).sum((0, 1))
                ks = kbt[:2048]
                sse = {b: ((ks - quant_alloc(ks, np.full(D, b))) ** 2).sum(0) for b in (0, 1, 2, 4)}
                f = {b: sse[b].sum() / sse[0].sum() for b in sse}
                ch = (0, 1, 2, 4)
                w = {"pair": np.sqrt(eq * varw), "pair²": eq * varw}.get(name, np.sqrt(eq) * varw)
                proxy = np.stack([w * f[b] for b in ch])
                for bud in budgets:
                    y = quant_alloc(kb, water_fill(proxy, ch, bud * 8))
                    back = (y @ A.T + mu[g]).astype(np.float32)
                    row.append(att_err(q, k0.astype(np.float32), back, v))
            res.append(row)
            heads.append(f"{il}/{g}")
            print(f"layer {il} head {g}: " + " ".join(f"{e:.4f}" for e in row) + f"; {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    res = np.array(res)
    print("| basis | bytes | mean | " + " | ".join(heads) + " |")
    print("|---|---:|---:|" + "---:|" * len(heads))
    i = 0
    for name in bases:
        for bud in budgets:
            print(f"| {name} | {bud} | {res[:, i].mean():.4f} | " + " | ".join(f"{e:.4f}" for e in res[:, i]) + " |")
            i += 1


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], [int(a) for a in sys.argv[3:]] or [0, 5, 13, 20, 27])
