#!/usr/bin/env python3
"""Key quantizers compared outside the engine (bench/RESULTS.md, 2026-11-30 "what bounds 10%").

An experiment, not part of zack. A numpy forward pass of Qwen2.5-Coder-1.5B
(weights dequantized by gguf-py, no KV compression) records every layer's
post-RoPE queries, keys and values and residual-stream input on 1,024 tokens of
held-out text and on 4 x 1,024 tokens of training text; then each key layout is
applied to the held-out keys of some layers and the attention outputs of the
KV head's six query heads are compared with the exact ones (relative squared
error over the queries past the first 128; the first 4 tokens, the sinks, stay
exact), the values exact. The layouts, at 128 channels a row:
  kivi2      2-bit per channel over groups of 32 tokens (min/max grids), all 128 channels
  tail96     2-bit for the first 32 channels, 1-bit for the other 96
  tail64z32  2-bit 32, 1-bit 64, the last 32 at their group mean (0 bits)
  vq CxK     per-token vector codes (k-means on the training keys at unit RMS, one f16 scale a row)
  kivi2 nuq  kivi2 against 4 non-uniform levels per channel (Lloyd-Max on the training keys' places in
             their group ranges; KVQuant's nuq), no more bytes
  tail96 2-means  tail96 with each (group, channel)'s best two 1-bit levels, as clipped grids approach
in the .zack's post-RoPE basis (R_qk, mean key subtracted) as the cache keeps
them, and per channel before RoPE (pre-*: RoPE applied after decoding; channel
pairs ordered by their energy on the training keys for the tails).
The bytes in the table's header are each layout's as the engine would store it
(grids included); the simulation's grids are plain min/max, not the engine's
clipped ones.

  python3 bench/experiments/key_quantizers.py capture MODEL.gguf TEST.txt TRAIN.txt OUT_DIR
  python3 bench/experiments/key_quantizers.py compare MODEL.zack OUT_DIR [LAYER ...]
  python3 bench/experiments/key_quantizers.py allocate MODEL.zack OUT_DIR [LAYER ...]

capture takes 2-5 minutes on 2 cores and 1.4 GB of disk; compare about 4, allocate about 3.

`allocate` (bench/RESULTS.md, 2026-12-02 "key bits per channel") compares the engine's fixed key layouts (in the
pca order and in the proxy's order below) with per-channel bit widths chosen for each head: every channel of the
.zack's basis gets 0, 1, 2 (or 3) or 4 bits (0: the group mean; 1: Lloyd's two levels; 2-4: the engine's clipped
grid; grids cost two 8-bit codes a group of 32, a 0-bit channel one) by a greedy water-filling within a byte
budget, on a proxy of each channel's error, sqrt(E[q_c^2]) x (within-group key variance) x f(b), f(b) the
training keys' pooled error at b bits relative to 0; and the same on the measured training errors. The table
goes to stdout (one row a layout, the mean and every head), progress to stderr.
"""
import sys
import time

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

L, E, H, KV, D = 28, 1536, 12, 2, 128
G = H // KV
EPS, BASE = 1e-6, 1e6
WIN = 1024


def tensor(tt, name):
    t = tt[name]
    shape = [int(x) for x in reversed(t.shape)] if len(t.shape) > 1 else [-1]
    return dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)


def rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rope(x, pos):
    """NEOX RoPE (channel i pairs with i + D/2) of x [n, ..., D] at positions pos [n]."""
    half = D // 2
    ang = pos[:, None] * BASE ** (-np.arange(half) * 2.0 / D)[None, :]
    shape = (len(pos),) + (1,) * (x.ndim - 2) + (half,)
    c, s = np.cos(ang).reshape(shape).astype(np.float32), np.sin(ang).reshape(shape).astype(np.float32)
    a, b = x[..., :half], x[..., half:]
    return np.concatenate([a * c - b * s, a * s + b * c], -1)


def forward(tokens, lw, emb):
    """Per layer: (q [n, H, D], k [n, KV, D], v [n, KV, D] after RoPE, the layer's input x [n, E])."""
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    x = emb[tokens].copy()
    out = []
    for w in lw:
        h = rms(x, w["an"])
        q = rope((h @ w["wq"].T + w["bq"]).reshape(n, H, D), pos)
        k = rope((h @ w["wk"].T + w["bk"]).reshape(n, KV, D), pos)
        v = (h @ w["wv"].T + w["bv"]).reshape(n, KV, D)
        out.append((q, k, v, x.copy()))
        att = np.empty((n, H, D), np.float32)
        for i in range(H):
            s = q[:, i] @ k[:, i // G].T / np.sqrt(D) + mask
            s = np.exp(s - s.max(1, keepdims=True))
            att[:, i] = (s / s.sum(1, keepdims=True)) @ v[:, i // G]
        x = x + att.reshape(n, E) @ w["wo"].T
        h = rms(x, w["fn"])
        gt = h @ w["wg"].T
        x = x + ((gt / (1 + np.exp(-gt))) * (h @ w["wu"].T)) @ w["wd"].T
    return out


def capture(model, test, train, out):
    r = GGUFReader(model)
    tt = {t.name: t for t in r.tensors}
    t0 = time.time()
    emb = tensor(tt, "token_embd.weight")
    names = dict(an="attn_norm.weight", fn="ffn_norm.weight", wq="attn_q.weight", bq="attn_q.bias",
                 wk="attn_k.weight", bk="attn_k.bias", wv="attn_v.weight", bv="attn_v.bias",
                 wo="attn_output.weight", wg="ffn_gate.weight", wu="ffn_up.weight", wd="ffn_down.weight")
    lw = [{k: tensor(tt, f"blk.{il}.{v}") for k, v in names.items()} for il in range(L)]
    print(f"dequantized in {time.time() - t0:.0f} s", file=sys.stderr)
    import llama_cpp  # the reference tokenizer (llama.cpp's), vocabulary only

    tok = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    for name, path, nwin in (("test", test, 1), ("train", train, 4)):
        ids = tok.tokenize(open(path, "rb").read(), add_bos=False)
        if len(ids) < 100 + (nwin - 1) * 3 * WIN + WIN:
            sys.exit(f"{path}: {len(ids)} tokens, too few for {nwin} windows of {WIN}")
        runs = []
        for w in range(nwin):
            seg = np.array(ids[100 + w * 3 * WIN: 100 + w * 3 * WIN + WIN])
            runs.append(forward(seg, lw, emb))
            print(f"{name} window {w + 1}/{nwin} ({time.time() - t0:.0f} s)", file=sys.stderr)
        np.savez(f"{out}/{name}.npz", **{key: np.stack([np.stack([o[i] for o in run]) for run in runs])
                                          for i, key in enumerate("qkvx") if key != "x" or name == "test"})


def kivi(x, lead, zero, group=32):
    """Per channel over groups of `group` rows: channels < lead 2-bit, then 1-bit, the last `zero` at the mean."""
    y = x.copy()
    for s in range(0, len(x) - len(x) % group, group):
        blk = x[s:s + group]
        for c0, c1, b in ((0, lead, 2), (lead, D - zero, 1)):
            if c1 <= c0:
                continue
            seg = blk[:, c0:c1]
            lo = seg.min(0)
            step = np.maximum((seg.max(0) - lo) / (2 ** b - 1), 1e-9)
            y[s:s + group, c0:c1] = np.round((seg - lo) / step) * step + lo
        if zero:
            y[s:s + group, D - zero:] = blk[:, D - zero:].mean(0)
    return y


def group_units(x, group=32):
    """Every value at its place in its (group, channel) range, 0 at the min and 1 at the max."""
    out = []
    for s in range(0, len(x) - len(x) % group, group):
        blk = x[s:s + group]
        lo = blk.min(0)
        out.append((blk - lo) / np.maximum(blk.max(0) - lo, 1e-9))
    return np.concatenate(out)


def lloyd_levels(u, n, iters=30):
    """n levels in [0, 1] minimising the squared error of u (1-D Lloyd-Max)."""
    c = np.linspace(0, 1, n)
    for _ in range(iters):
        a = np.abs(u[:, None] - c[None]).argmin(1)
        c = np.array([u[a == k].mean() if (a == k).any() else c[k] for k in range(n)])
    return c


def kivi_nuq(x, levels, group=32):
    """2-bit per channel over groups, against each channel's own levels in its group's range (KVQuant's nuq)."""
    y = x.copy()
    for s in range(0, len(x) - len(x) % group, group):
        blk = x[s:s + group]
        lo = blk.min(0)
        r = np.maximum(blk.max(0) - lo, 1e-9)
        u = (blk - lo) / r
        for c in range(x.shape[1]):
            y[s:s + group, c] = levels[c][np.abs(u[:, c:c + 1] - levels[c][None]).argmin(1)] * r[c] + lo[c]
    return y


def two_means(x, group=32):
    """1-bit per channel over groups with the group's best two levels (what the engine's clipped grids approach)."""
    y = x.copy()
    for s in range(0, len(x) - len(x) % group, group):
        for c in range(x.shape[1]):
            v = x[s:s + group, c]
            lo, hi = v.min(), v.max()
            for _ in range(10):
                a = v > (lo + hi) / 2
                lo, hi = (v[~a].mean() if (~a).any() else lo), (v[a].mean() if a.any() else hi)
            y[s:s + group, c] = np.where(v > (lo + hi) / 2, hi, lo)
    return y


def kmeans(X, K, rng, iters=15):
    C = X[rng.choice(len(X), K, replace=False)].copy()
    for _ in range(iters):
        a = ((X * X).sum(1)[:, None] - 2 * X @ C.T + (C * C).sum(1)[None]).argmin(1)
        for k in range(K):
            m = a == k
            C[k] = X[m].mean(0) if m.any() else X[rng.integers(len(X))]
    return C


def unit(x):
    s = np.sqrt((x ** 2).mean(1, keepdims=True))
    return x / np.maximum(s, 1e-9), s


def vq(x, train, c, K, rng):
    ut, _ = unit(train)
    u, s = unit(x)
    y = np.empty_like(x)
    for g in range(D // c):
        C = kmeans(ut[:, g * c:(g + 1) * c], K, rng)
        X = u[:, g * c:(g + 1) * c]
        y[:, g * c:(g + 1) * c] = C[((X * X).sum(1)[:, None] - 2 * X @ C.T + (C * C).sum(1)[None]).argmin(1)]
    return y * s


def att_err(q, k, kh, v, sinks=4, skip=128):
    """Relative squared error of the attention outputs of queries q [n, G, D] with keys kh instead of k."""
    n = len(k)
    mask = np.triu(np.full((n, n), -np.inf, np.float32), 1)
    kh = kh.copy()
    kh[:sinks] = k[:sinks]
    e = o2 = 0.0
    for i in range(q.shape[1]):
        o = []
        for kk in (k, kh):
            s = q[:, i] @ kk.T / np.sqrt(D) + mask
            s = np.exp(s - s.max(1, keepdims=True))
            o.append((s / s.sum(1, keepdims=True)) @ v)
        e += ((o[1] - o[0])[skip:] ** 2).sum()
        o2 += (o[0][skip:] ** 2).sum()
    return e / o2


def compare(zack, out, layers):
    z = GGUFReader(zack)
    zt = {t.name: t for t in z.tensors}
    te, tr = np.load(f"{out}/test.npz"), np.load(f"{out}/train.npz")
    st = zt  # the .zack keeps the source's attn_norm and attn_k (keys are not folded)
    rng = np.random.default_rng(1)
    cols = [("kivi2", 40), ("tail96", 28), ("tail64z32", 23), ("vq 8x256", 18), ("vq 4x64", 26), ("vq 4x256", 34),
            ("pre-kivi2", 40), ("pre-tail64z32", 23), ("kivi2 nuq", 40), ("tail96 2-means", 28)]
    print("layer head | " + " | ".join(f"{n} ({b} B)" for n, b in cols))
    tot = np.zeros(len(cols))
    for il in layers:
        R = np.array(zt[f"blk.{il}.zack.rqk"].data, np.float32).reshape(KV, D, D)  # [g][i][j], column j = direction j
        mu = np.array(zt[f"blk.{il}.zack.kmean"].data, np.float32).reshape(KV, D)
        x = te["x"][0, il]
        h = rms(x, tensor(st, f"blk.{il}.attn_norm.weight"))
        kpre = (h @ tensor(st, f"blk.{il}.attn_k.weight").T + tensor(st, f"blk.{il}.attn_k.bias")).reshape(-1, KV, D)
        pos = np.arange(len(x), dtype=np.float64)
        for g in range(KV):
            P = R[g]
            k0, v = te["k"][0, il, :, g, :], te["v"][0, il, :, g, :]  # [window, layer, token, head, channel]
            q = te["q"][0, il][:, g * G:(g + 1) * G, :]
            if np.abs(rope(kpre[:, g], pos) - k0).max() > 1e-2 * np.abs(k0).max():
                sys.exit(f"layer {il}: the .zack's attn_k does not give the captured keys (another model?)")
            ktr = tr["k"][:, il, :, g, :].reshape(-1, D)
            kb, kbt = (k0 - mu[g]) @ P, (ktr - mu[g]) @ P
            back = lambda y: y @ P.T + mu[g]
            pair = (ktr[:, :D // 2] ** 2).mean(0) + (ktr[:, D // 2:] ** 2).mean(0)  # RoPE keeps a pair's energy
            order = np.concatenate([[i, i + D // 2] for i in np.argsort(-pair)])

            def pre(lead, zero):
                y = np.empty_like(kpre[:, g])
                y[:, order] = kivi(kpre[:, g][:, order], lead, zero)
                return rope(y, pos)

            khs = [back(kivi(kb, D, 0)), back(kivi(kb, 32, 0)), back(kivi(kb, 32, 32)),
                   back(vq(kb, kbt, 8, 256, rng)), back(vq(kb, kbt, 4, 64, rng)), back(vq(kb, kbt, 4, 256, rng)),
                   pre(D, 0), pre(32, 32)]
            nuq = [lloyd_levels(u, 4) for u in group_units(kbt).T]  # from the training keys
            tailed = kivi(kb, D, 0)
            tailed[:, 32:] = two_means(kb[:, 32:])
            khs += [back(kivi_nuq(kb, nuq)), back(tailed)]
            res = np.array([att_err(q, k0, kh, v) for kh in khs])
            tot += res
            print(f"{il:5d} {g:4d} | " + " | ".join(f"{e:.4f}" for e in res), flush=True)
    print(" mean      | " + " | ".join(f"{e:.4f}" for e in tot / (KV * len(layers))))


CLIP_STEPS, CLIP_STEP = 8, 0.04  # kernels/attention.h: KV_KEY_CLIP_STEPS, KV_KEY_CLIP_STEP


def q_clipped(blk, bits):
    """The engine's key grid over one group (kvq_key_grid_search): per channel, of the clipped grids
    [mn + a R s, mx - b R s] the one with the least squared error. blk [n, C] -> its quantized copy."""
    mn, mx = blk.min(0), blk.max(0)
    R = mx - mn
    top = 2 ** bits - 1
    best_e = np.full(blk.shape[1], np.inf)
    best = blk.copy()
    for a in range(CLIP_STEPS + 1):
        for b in range(CLIP_STEPS + 1):
            lo, hi = mn + R * CLIP_STEP * a, mx - R * CLIP_STEP * b
            ok = (hi > lo) | ((a == 0) & (b == 0))
            st = np.where(hi > lo, (hi - lo) / top, 1.0)
            y = np.clip(np.round((blk - lo) / st), 0, top) * st + lo
            e = np.where(ok, ((blk - y) ** 2).sum(0), np.inf)
            m = e < best_e
            best_e = np.where(m, e, best_e)
            best[:, m] = y[:, m]
    const = ~(R > 0)
    best[:, const] = blk[:, const]
    return best


def two_levels(blk):
    """Lloyd's two levels (lo, hi) [C] of each channel of blk [n, C], from the range's ends (kvq_key_levels_1bit)."""
    lo, hi = blk.min(0), blk.max(0)
    for _ in range(10):
        a = blk > (lo + hi) / 2
        na, nb = a.sum(0), (~a).sum(0)
        hi = np.where(na > 0, (blk * a).sum(0) / np.maximum(na, 1), hi)
        lo = np.where(nb > 0, (blk * ~a).sum(0) / np.maximum(nb, 1), lo)
    return lo, hi


def q_two_means(blk):
    """1 bit a channel: each value at the nearer of its channel's two_levels. blk [n, C]."""
    lo, hi = two_levels(blk)
    return np.where(blk > (lo + hi) / 2, hi, lo)


def quant_alloc(x, bits, group=32):
    """x [n, D] with channel c at bits[c] (0: the group mean, 1: two levels, 2 and 4: clipped grids) per group."""
    y = x.copy()
    for s in range(0, len(x) - len(x) % group, group):
        blk = x[s:s + group]
        for b in sorted(set(bits)):
            cs = np.where(bits == b)[0]
            if b == 0:
                y[s:s + group, cs] = blk[:, cs].mean(0)
            elif b == 1:
                y[s:s + group, cs] = q_two_means(blk[:, cs])
            else:
                y[s:s + group, cs] = q_clipped(blk[:, cs], b)
    return y


def bits_cost(b):
    """Bits a token of one channel costs at b bits with its grid: two 8-bit codes a group of 32 (0 bits: one)."""
    return b + (0.5 if b > 0 else 0.25)


def water_fill(err, choices, budget):
    """Per channel bit widths for one head: from choices[0] everywhere, raise the channel whose next width lowers
    err [len(choices), D] most per bit, while the row stays within `budget` bits."""
    lev = np.zeros(D, int)
    spent = D * bits_cost(choices[0])
    while True:
        best, bc = 0.0, -1
        for c in range(D):
            if lev[c] + 1 >= len(choices):
                continue
            dc = bits_cost(choices[lev[c] + 1]) - bits_cost(choices[lev[c]])
            if spent + dc > budget + 1e-9:
                continue
            g = (err[lev[c], c] - err[lev[c] + 1, c]) / dc
            if g > best:
                best, bc = g, c
        if bc < 0:
            return np.array([choices[i] for i in lev])
        spent += bits_cost(choices[lev[bc] + 1]) - bits_cost(choices[lev[bc]])
        lev[bc] += 1


def allocate(zack, out, layers):
    z = GGUFReader(zack)
    zt = {t.name: t for t in z.tensors}
    te, tr = np.load(f"{out}/test.npz"), np.load(f"{out}/train.npz")
    t0 = time.time()
    fixed = {"tail64z32": [2] * 32 + [1] * 64 + [0] * 32, "tail96": [2] * 32 + [1] * 96, "kivi2": [2] * D,
             "kivi4": [4] * D}
    fixed = {k: np.array(v) for k, v in fixed.items()}
    # (name, bytes a row and head, how): the engine's layouts in the pca order and in the proxy's order, then
    # water-filled widths on the proxy (weighted by sqrt E[q^2] unless said) and on the measured errors
    rows = [("tail64z32", 23, "fixed"), ("tail96", 28, "fixed"), ("kivi2", 40, "fixed"), ("kivi4", 72, "fixed"),
            ("tail64z32, proxy order", 23, "ordered"), ("tail96, proxy order", 28, "ordered")]
    rows += [(f"{{0,1,4}} at {b} B", b, "014") for b in (23, 28, 34, 40, 48)]
    rows += [(f"{{0,1,2,4}} at {b} B", b, "0124") for b in (18, 23, 28, 34, 40)]
    rows += [("{0,1,2,4} at 28 B, weight E[q^2]", 28, "w"), ("{0,1,2,4} at 28 B, unweighted", 28, "1"),
             ("{0,1,2,4} at 28 B, measured errors", 28, "m0124"), ("{0,1,2,3,4} at 28 B, measured errors", 28, "m01234")]
    res, heads = [], []
    for il in layers:
        R = np.array(zt[f"blk.{il}.zack.rqk"].data, np.float32).reshape(KV, D, D)  # column j = direction j
        mu = np.array(zt[f"blk.{il}.zack.kmean"].data, np.float32).reshape(KV, D)
        for g in range(KV):
            P = R[g]
            k0, v = te["k"][0, il, :, g, :], te["v"][0, il, :, g, :]
            q = te["q"][0, il][:, g * G:(g + 1) * G, :]
            ktr = tr["k"][:, il, :, g, :].reshape(-1, D)
            qtr = tr["q"][:, il][:, :, g * G:(g + 1) * G, :].reshape(-1, D)
            kb, kbt = (k0 - mu[g]) @ P, (ktr - mu[g]) @ P  # P is orthogonal: q.(k - mu) = (P^T q).kb
            eq = ((qtr @ P) ** 2).mean(0)
            grp = kbt[:len(kbt) - len(kbt) % 32].reshape(-1, 32, D)
            varw = ((grp - grp.mean(1, keepdims=True)) ** 2).sum((0, 1))  # within-group variance (x n)
            ks = kbt[:2048]
            sse = {b: ((ks - quant_alloc(ks, np.full(D, b))) ** 2).sum(0) for b in (0, 1, 2, 3, 4)}
            f = {b: sse[b].sum() / sse[0].sum() for b in sse}  # pooled error of b bits relative to 0
            proxy = lambda ch, w: np.stack([w * varw * f[b] for b in ch])
            meas = lambda ch: np.stack([np.sqrt(eq) * sse[b] for b in ch])
            order = np.argsort(-(np.sqrt(eq) * varw), kind="stable")
            ys = []
            for name, b, how in rows:
                if how == "fixed":
                    ys.append(quant_alloc(kb, fixed[name]))
                elif how == "ordered":
                    lay = fixed[name.split(",")[0]]
                    ys.append(quant_alloc(kb[:, order], lay)[:, np.argsort(order)])
                elif how in ("014", "0124", "w", "1"):
                    ch = (0, 1, 4) if how == "014" else (0, 1, 2, 4)
                    w = {"w": eq, "1": np.ones(D)}.get(how, np.sqrt(eq))
                    ys.append(quant_alloc(kb, water_fill(proxy(ch, w), ch, b * 8)))
                else:
                    ch = (0, 1, 2, 4) if how == "m0124" else (0, 1, 2, 3, 4)
                    ys.append(quant_alloc(kb, water_fill(meas(ch), ch, b * 8)))
            res.append([att_err(q, k0, back, v) for back in (y @ P.T + mu[g] for y in ys)])
            heads.append(f"{il}/{g}")
            print(f"layer {il} head {g}: f(1, 2, 4) {f[1]:.3f} {f[2]:.3f} {f[4]:.4f}; {time.time() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    res = np.array(res)
    print("| key layout | bytes | mean | " + " | ".join(heads) + " |")
    print("|---|---:|---:|" + "---:|" * len(heads))
    for i, (name, b, _) in enumerate(rows):
        print(f"| {name} | {b} | {res[:, i].mean():.4f} | " + " | ".join(f"{e:.4f}" for e in res[:, i]) + " |")


if __name__ == "__main__":
    if len(sys.argv) >= 6 and sys.argv[1] == "capture":
        capture(*sys.argv[2:6])
    elif len(sys.argv) >= 4 and sys.argv[1] == "allocate":
        allocate(sys.argv[2], sys.argv[3], [int(a) for a in sys.argv[4:]] or [0, 5, 13, 20, 27])
    elif len(sys.argv) >= 4 and sys.argv[1] == "compare":
        compare(sys.argv[2], sys.argv[3], [int(a) for a in sys.argv[4:]] or [0, 5, 13, 20, 27])
    else:
        sys.exit(__doc__)
