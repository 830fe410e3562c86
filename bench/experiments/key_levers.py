#!/usr/bin/env python3
"""Three levers on the 10% plans' key (and value) error, simulated before building any (bench/RESULTS.md,
2026-12-04 "three levers simulated"). An experiment, not part of zack.

Each mode reads a `key_quantizers.py capture` directory (queries, keys and values of a numpy forward pass of
Qwen2.5-Coder-1.5B: one held-out window of 1,024 tokens, four training windows) and a .zack's key basis
(R_qk, mean key), gives every KV head of the chosen layers the {0,1,2,4}-bit key widths water-filled at 28 bytes
a row as `key_quantizers.py allocate` does, and reports the relative squared error of the six query heads'
attention outputs against the exact ones (the first 4 tokens, the sinks, exact; queries past the first 128).

  gptq     A key's score error is e.q for its rounding error e: over the queries e^T H e with H = E[q q^T] in
           the cache's key basis. The engine rounds each channel to its nearest level, minimising only
           sum_c H_cc e_c^2; rounding the channels in turn (coarsest first) and moving each one's error onto
           the channels not yet rounded (GPTQ, H's inverse Cholesky factor) lowers e^T H e for the same grids
           and bytes, and the kernels would read nothing new. Reports H's off-diagonal share too.
  groups   The 0- and 1-bit channels' grids over 64 or 128 tokens instead of 32 (a 1-bit channel's two 8-bit
           level codes are a third of its bits at 32), the bytes saved water-filled back into wider channels.
  salient  Mixed precision by attention (MiKV, ZipCache): the keys and values of the tokens that received the
           most attention from the 128 queries after them (what the cache knows when it quantizes a token as
           it leaves the exact window) kept exact, 2/5/10% of the tokens; against the tokens the whole window's
           queries attend most (an oracle) and random ones. Values as 8 x 256 vector codes (k-means at unit RMS).

  python3 bench/experiments/key_levers.py gptq|groups|salient MODEL.zack CAPTURE_DIR [LAYER ...]
"""
import sys
import time

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import key_quantizers as kq  # noqa: E402

D, G, KV = kq.D, kq.G, kq.KV


def levels_of(blk, bits):
    """Per channel of blk [n, C] at `bits`: (lo, step, top) of its levels lo + step j, j = 0..top, as the
    engine picks them (0: the mean; 1: Lloyd's two levels; 2+: the clipped grid with the least error)."""
    C = blk.shape[1]
    if bits == 0:
        return blk.mean(0), np.ones(C), 0
    if bits == 1:
        lo, hi = kq.two_levels(blk)
        return lo, np.maximum(hi - lo, 1e-12), 1
    mn, mx = blk.min(0), blk.max(0)
    R, top = mx - mn, 2 ** bits - 1
    best_e, blo, bst = np.full(C, np.inf), mn.copy(), np.maximum(R / top, 1e-12)
    for a in range(kq.CLIP_STEPS + 1):
        for b in range(kq.CLIP_STEPS + 1):
            lo, hi = mn + R * kq.CLIP_STEP * a, mx - R * kq.CLIP_STEP * b
            ok = (hi > lo) | ((a == 0) & (b == 0))
            st = np.where(hi > lo, (hi - lo) / top, 1.0)
            e = np.where(ok, ((blk - (np.clip(np.round((blk - lo) / st), 0, top) * st + lo)) ** 2).sum(0), np.inf)
            m = e < best_e
            best_e, blo, bst = np.where(m, e, best_e), np.where(m, lo, blo), np.where(m, st, bst)
    return blo, np.maximum(bst, 1e-12), top


def quantize(x, bits, H=None, group=32, damp=0.01):
    """x [n, D] with channel c at bits[c] per group of `group` rows; nearest levels (H None) or GPTQ's rounding
    against H [D, D], the channels in order of width (coarsest first)."""
    y = x.copy()
    perm = np.argsort(bits, kind="stable")
    if H is not None:
        Hp = H[np.ix_(perm, perm)].astype(np.float64)
        Hp += damp * np.mean(np.diag(Hp)) * np.eye(D)
        U = np.linalg.cholesky(np.linalg.inv(Hp)).T  # upper: Hp^-1 = U^T U
    for s in range(0, len(x) - len(x) % group, group):
        blk = x[s:s + group]
        par = {b: levels_of(blk[:, bits == b], b) for b in set(bits.tolist())}
        lo, st, top = np.zeros(D), np.ones(D), np.zeros(D)
        for b, (l, t, tp) in par.items():
            cs = np.where(bits == b)[0]
            lo[cs], st[cs], top[cs] = l, t, tp
        lo, st, top = lo[perm], st[perm], top[perm]
        W = blk[:, perm].astype(np.float64)
        Q = np.empty_like(W)
        for i in range(D):
            Q[:, i] = np.clip(np.round((W[:, i] - lo[i]) / st[i]), 0, top[i]) * st[i] + lo[i]
            if H is not None and i + 1 < D:
                err = (W[:, i] - Q[:, i]) / U[i, i]
                W[:, i + 1:] -= err[:, None] * U[i, i + 1:][None]
        y[s:s + group, perm] = Q
    return y


def heads(zack, out, layers):
    """Per KV head of the layers: (layer, head, P, mu, k0, v, q, kbt, vtr, eq, H): its basis [D, D] (column j
    = direction j) and mean key, held-out keys, values [n, D] and queries [n, G, D], training keys in the basis
    and training values, E[q_c^2] and H = E[q q^T] in the basis (the training queries of its query heads)."""
    zt = {t.name: t for t in GGUFReader(zack).tensors}
    te, tr = np.load(f"{out}/test.npz"), np.load(f"{out}/train.npz")
    for il in layers:
        R = np.array(zt[f"blk.{il}.zack.rqk"].data, np.float32).reshape(KV, D, D)
        mu = np.array(zt[f"blk.{il}.zack.kmean"].data, np.float32).reshape(KV, D)
        for g in range(KV):
            P = R[g]
            ktr = tr["k"][:, il, :, g, :].reshape(-1, D)
            qb = tr["q"][:, il][:, :, g * G:(g + 1) * G, :].reshape(-1, D) @ P
            H = qb.T @ qb / len(qb)
            yield (il, g, P, mu[g], te["k"][0, il, :, g, :], te["v"][0, il, :, g, :],
                   te["q"][0, il][:, g * G:(g + 1) * G, :], (ktr - mu[g]) @ P,
                   tr["v"][:, il, :, g, :].reshape(-1, D), np.diag(H).copy(), H)


def quantize_groups(x, bits, low_group):
    """x [n, D] with channel c at bits[c]: channels of 0 or 1 bits over groups of low_group rows, the rest 32."""
    y = x.copy()
    for b in set(bits.tolist()):
        cs = np.where(bits == b)[0]
        g = low_group if b <= 1 else 32
        for s in range(0, len(x) - len(x) % g, g):
            blk = x[s:s + g][:, cs]
            lo, st, top = levels_of(blk, b)
            y[s:s + g, cs] = np.clip(np.round((blk - lo) / st), 0, top) * st + lo
    return y


def widths(kbt, eq, nbytes, low_group=32):
    """{0,1,2,4}-bit widths water-filled at nbytes a row on the proxy sqrt(E[q^2]) x the training keys' error
    at each width, grids costing two 8-bit codes a group (a 0-bit channel one), low_group for 0/1 bits."""
    ks, ch = kbt[:2048], (0, 1, 2, 4)
    sse = np.stack([np.sqrt(eq) * ((ks - quantize_groups(ks, np.full(D, b), low_group)) ** 2).sum(0) for b in ch])
    cost = {0: 8 / low_group, 1: 1 + 16 / low_group, 2: 2.5, 4: 4.5}
    lev, spent = np.zeros(D, int), D * cost[0]
    while True:
        best, bc = 0.0, -1
        for c in range(D):
            if lev[c] + 1 >= len(ch):
                continue
            dc = cost[ch[lev[c] + 1]] - cost[ch[lev[c]]]
            gain = (sse[lev[c], c] - sse[lev[c] + 1, c]) / dc
            if spent + dc <= nbytes * 8 + 1e-9 and gain > best:
                best, bc = gain, c
        if bc < 0:
            return np.array([ch[i] for i in lev])
        spent += cost[ch[lev[bc] + 1]] - cost[ch[lev[bc]]]
        lev[bc] += 1


def attn(q, k, v):
    """Causal attention of q [n, G, D] over k, v [n, D]: outputs [n, G, D] and weights [G, n, n]."""
    n = len(k)
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    outs, ws = [], []
    for i in range(q.shape[1]):
        s = q[:, i] @ k.T / np.sqrt(D) + mask
        s = np.exp(s - s.max(1, keepdims=True))
        s /= s.sum(1, keepdims=True)
        outs.append(s @ v)
        ws.append(s)
    return np.stack(outs, 1), np.stack(ws)


def out_err(q, k, v, kh, vh, sinks=4, skip=128):
    kh, vh = kh.copy(), vh.copy()
    kh[:sinks], vh[:sinks] = k[:sinks], v[:sinks]
    o0, o1 = attn(q, k, v)[0], attn(q, kh, vh)[0]
    return ((o1 - o0)[skip:] ** 2).sum() / (o0[skip:] ** 2).sum()


def mode_gptq(zack, out, layers, nbytes=28):
    rows = []
    print("| layer/head | off-diagonal share of H | nearest | GPTQ | GPTQ / nearest |")
    print("|---|---:|---:|---:|---:|")
    for il, g, P, mu, k0, v, q, kbt, _, eq, H in heads(zack, out, layers):
        off = 1 - (np.diag(H) ** 2).sum() / (H ** 2).sum()
        bits = widths(kbt, eq, nbytes)
        kb = (k0 - mu) @ P
        en = kq.att_err(q, k0, quantize(kb, bits) @ P.T + mu, v)
        eg = kq.att_err(q, k0, quantize(kb, bits, H) @ P.T + mu, v)
        rows.append((off, en, eg))
        print(f"| {il}/{g} | {off:.3f} | {en:.4f} | {eg:.4f} | {eg / en:.3f} |", flush=True)
    r = np.array(rows).mean(0)
    print(f"| mean | {r[0]:.3f} | {r[1]:.4f} | {r[2]:.4f} | {r[2] / r[1]:.3f} |")


def mode_groups(zack, out, layers, nbytes=28):
    sizes = (32, 64, 128)
    rows = []
    print("| layer/head | " + " | ".join(f"0/1-bit grids over {s}: widths 0/1/2/4, error" for s in sizes) + " |")
    print("|---|" + "---:|" * len(sizes))
    for il, g, P, mu, k0, v, q, kbt, _, eq, _ in heads(zack, out, layers):
        kb, cells, errs = (k0 - mu) @ P, [], []
        for s in sizes:
            bits = widths(kbt, eq, nbytes, s)
            errs.append(kq.att_err(q, k0, quantize_groups(kb, bits, s) @ P.T + mu, v))
            cells.append(f"{'/'.join(str(c) for c in np.bincount(bits, minlength=5)[[0, 1, 2, 4]])}, {errs[-1]:.4f}")
        rows.append(errs)
        print(f"| {il}/{g} | " + " | ".join(cells) + " |", flush=True)
    print("| mean | " + " | ".join(f"{e:.4f}" for e in np.array(rows).mean(0)) + " |")


def mode_salient(zack, out, layers, nbytes=28, window=128):
    rng = np.random.default_rng(1)
    fracs = (0, 0.02, 0.05, 0.1)
    acc = {}
    for il, g, P, mu, k0, v, q, kbt, vtr, eq, _ in heads(zack, out, layers):
        kh = quantize((k0 - mu) @ P, widths(kbt, eq, nbytes)) @ P.T + mu
        vh = kq.vq(v, vtr[:8192], 8, 256, rng)
        w = attn(q, k0, v)[1]
        n = len(k0)
        past = np.array([w[:, t + 1:t + 1 + window, t].sum() for t in range(n)])
        for name, score in (("past", past), ("oracle", w.sum((0, 1))), ("random", rng.random(n))):
            for f in fracs:
                m = np.zeros(n, bool)
                m[np.argsort(-score)[:int(f * n)]] = True
                k1, v1 = kh.copy(), vh.copy()
                k1[m], v1[m] = k0[m], v[m]
                acc.setdefault((name, f), []).append(
                    (out_err(q, k0, v, k1, v), out_err(q, k0, v, k0, v1), out_err(q, k0, v, k1, v1)))
        print(f"layer {il} head {g} done", file=sys.stderr, flush=True)
    print("| tokens kept exact | share | keys' error | values' error | both |")
    print("|---|---:|---:|---:|---:|")
    for (name, f), vals in acc.items():
        a = np.array(vals).mean(0)
        print(f"| {name} | {f:.0%} | {a[0]:.4f} | {a[1]:.4f} | {a[2]:.4f} |")


if __name__ == "__main__":
    modes = {"gptq": mode_gptq, "groups": mode_groups, "salient": mode_salient}
    if len(sys.argv) < 4 or sys.argv[1] not in modes:
        sys.exit(__doc__)
    modes[sys.argv[1]](sys.argv[2], sys.argv[3], [int(a) for a in sys.argv[4:]] or [0, 5, 13, 20, 27])
