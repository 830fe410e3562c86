#!/usr/bin/env python3
"""How much of a layer's keys and values the cache already holds elsewhere (issue #16, an experiment).

An experiment, not part of zack. Reads the captures of key_quantizers.py (`capture`: post-RoPE keys
and values of Qwen2.5-Coder-1.5B on 1,024 held-out tokens and 4 x 1,024 training tokens) and fits,
for every layer and KV head, a ridge regression of that head's keys (before RoPE: RoPE is a rotation
per position that a fixed linear map cannot follow) or values from what the cache holds for the same
token already:
  keys   prev-k     the previous layer's keys before RoPE, both KV heads, any linear map (a bound: the cache
                    holds keys after RoPE, and only a map that commutes with RoPE carries over to them)
         prev-k-rot the same through a map that commutes with RoPE (one complex factor per frequency and
                    head of the previous layer): a score q.(A k' + r) is then (A^T q).k' + q.r, two passes
                    over codes the cache holds
  values prev-v     the previous layer's values, both heads (o = B sum p v' + sum p r)
         prev-v+k   those and this layer's keys after RoPE (a value-like pass over its key codes)
on the training tokens (the first 4 of each window, the sinks, left out), then reports on the held-out
tokens the share of each head's variance (about its training mean, per channel) that the prediction
leaves: a cache that codes the residual instead of the head needs about 0.5 log2(left) bits a value
fewer at the same error (high-rate reading). Predicting from the exact previous layer flatters it: a
cache has only that layer's codes, so with BITS (2 or 4) the predictors' inputs are first coded as
KIVI values are (per token, blocks of 32 channels, min/max grids), in training and test alike.

  python3 bench/experiments/cross_layer.py OUT_DIR [BITS]     # OUT_DIR of key_quantizers.py capture
"""
import sys

import numpy as np

D, BASE = 128, 1e6
SINKS = 4


def unrope(x, pos):
    """x [n, KV, D] post-RoPE (NEOX pairs i, i + D/2) at positions pos -> before RoPE."""
    half = D // 2
    ang = -pos[:, None] * BASE ** (-np.arange(half) * 2.0 / D)[None, :]
    c, s = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)


def load(path):
    z = np.load(path)
    k, v = z["k"], z["v"]  # [win, L, n, KV, D]
    pos = np.arange(k.shape[2], dtype=np.float64)
    kp = np.stack([np.stack([unrope(k[w, l], pos) for l in range(k.shape[1])]) for w in range(k.shape[0])])
    # tokens of every window after the sinks, as rows: [L, rows, KV * D]
    flat = lambda a: a[:, :, SINKS:].transpose(1, 0, 2, 3, 4).reshape(a.shape[1], -1, a.shape[3] * D)
    return flat(kp), flat(v), flat(k)


def rot_fit(Xtr, ytr, Xte):
    """The prediction of ytr's head [rows, D] from the heads of Xtr [rows, KV * D] by one complex factor per
    (frequency, source head), NEOX pairs (i, i + D/2) as complex numbers, with a complex mean; applied to Xte."""
    half, kv = D // 2, Xtr.shape[1] // D
    cplx = lambda a: a[..., :half] + 1j * a[..., half:]
    Y = cplx(ytr)
    Xs = [cplx(Xtr[:, g * D:(g + 1) * D]) for g in range(kv)]
    Xt = [cplx(Xte[:, g * D:(g + 1) * D]) for g in range(kv)]
    out = np.empty((Xte.shape[0], half), np.complex128)
    for f in range(half):
        A = np.stack([x[:, f] for x in Xs] + [np.ones(len(Y))], 1)
        c, *_ = np.linalg.lstsq(A, Y[:, f], rcond=None)
        out[:, f] = np.stack([x[:, f] for x in Xt] + [np.ones(len(Xte))], 1) @ c
    return np.concatenate([out.real, out.imag], 1)


def kivi_rows(x, bits):
    """x [rows, C] through per-row min/max codes of `bits` bits over blocks of 32 channels."""
    top = (1 << bits) - 1
    b = x.reshape(len(x), -1, 32)
    lo, hi = b.min(-1, keepdims=True), b.max(-1, keepdims=True)
    s = np.where(hi > lo, (hi - lo) / top, 1)
    return (np.clip(np.rint((b - lo) / s), 0, top) * s + lo).reshape(x.shape).astype(np.float32)


def ridge(X, Y, lam=1e-3):
    """W, b minimising ||X W + b - Y||^2 + lam tr(X'X)/d ||W||^2."""
    mx, my = X.mean(0), Y.mean(0)
    Xc, Yc = X - mx, Y - my
    A = Xc.T @ Xc
    A += lam * np.trace(A) / A.shape[0] * np.eye(A.shape[0])
    W = np.linalg.solve(A, Xc.T @ Yc)
    return W, my - mx @ W


def main(out, bits):
    ktr, vtr, krtr = load(f"{out}/train.npz")
    kte, vte, krte = load(f"{out}/test.npz")
    # what the predictions read: the cache's codes (targets stay exact)
    q = (lambda a: np.stack([kivi_rows(x, bits) for x in a])) if bits else (lambda a: a)
    qk, qv, qkr = q(ktr), q(vtr), q(krtr)
    qkt, qvt, qkrt = q(kte), q(vte), q(krte)
    L, KV = ktr.shape[0], ktr.shape[2] // D
    names = {"k": ("prev-k", "prev-k-rot"), "v": ("prev-v", "prev-v+k")}
    print("| layer | side | head | keys: prev-k / values: prev-v | keys: prev-k-rot / values: prev-v+k |")
    print("|---:|---|---:|---:|---:|")
    tot = {}
    for l in range(1, L):
        for side, (tr, te) in (("k", (ktr[l], kte[l])), ("v", (vtr[l], vte[l]))):
            for g in range(KV):
                ytr, yte = tr[:, g * D:(g + 1) * D], te[:, g * D:(g + 1) * D]
                var = ((yte - ytr.mean(0)) ** 2).sum()
                row = []
                for name in names[side]:
                    if name == "prev-k-rot":
                        pred = rot_fit(qk[l - 1], ytr, qkt[l - 1])
                    else:
                        Xtr, Xte = {"prev-k": (qk[l - 1], qkt[l - 1]), "prev-v": (qv[l - 1], qvt[l - 1]),
                                    "prev-v+k": (np.hstack([qv[l - 1], qkr[l]]),
                                                 np.hstack([qvt[l - 1], qkrt[l]]))}[name]
                        W, b = ridge(Xtr, ytr)
                        pred = Xte @ W + b
                    left = ((pred - yte) ** 2).sum() / var
                    tot.setdefault((side, name), []).append(left)
                    row.append(f"{left:.3f}")
                print(f"| {l} | {side} | {g} | " + " | ".join(row) + " |", flush=True)
    print()
    print("| side | predictor | mean share left | median | bits a value saved (0.5 log2, mean over heads) |")
    print("|---|---|---:|---:|---:|")
    for (side, name), xs in sorted(tot.items()):
        xs = np.array(xs)
        print(f"| {side} | {name} | {xs.mean():.3f} | {np.median(xs):.3f} | {(-0.5 * np.log2(xs)).mean():.2f} |")


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] not in ("2", "4")):
        sys.exit(__doc__)
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 0)
