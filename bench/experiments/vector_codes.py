#!/usr/bin/env python3
"""Vector codes for the cache, simulated (bench/RESULTS.md, 2026-11-30 "vector codes").

An experiment, not part of zack. With bench/experiments/vector_codes.patch
applied to a throwaway copy, `ZACK_VDUMP=DIR zack eval ...` writes every key
and value row that leaves the full-precision window to DIR/{k,v}_LAYER_HEAD.f32
(float32 rows of 128 channels, in the cache's basis). This script then
  train  DUMP TEST OUT c K [--keys]: k-means codebooks per (layer, head, group
         of c channels), K centroids each, on rows scaled to unit RMS (the scale
         is a per-token f16: 0.125 bit an element); writes OUT/cb_L_G.f32 for
         ZACK_VQ=OUT (values) or ZACK_KQ=OUT (keys), and prints the held-out
         relative squared error next to a 2-bit per-token grid's;
  avg    TEST CB...: the error of 256-token sums of the rows (uniform, and
         with random attention-like weights) against what independent per-token
         errors would give (1.0), for the 2-bit grid and each codebook directory:
         attention sums tokens, so errors that repeat from token to token do not
         average out.
numpy only; the train step takes about 3 minutes for 55 heads of 12K rows.
"""
import glob
import os
import struct
import sys

import numpy as np

R = 128


def load(path):
    return np.fromfile(path, np.float32).reshape(-1, R)


def grid2(x, bits=2, blk=64):
    """min/max grid per token and block of blk channels (zack's 2-bit values measure 0.231 on the same rows)."""
    y = x.copy()
    top = (1 << bits) - 1
    for b in range(0, R, blk):
        v = x[:, b:b + blk]
        lo, hi = v.min(1, keepdims=True), v.max(1, keepdims=True)
        s = np.maximum(hi - lo, 1e-12) / top
        y[:, b:b + blk] = lo + np.round((v - lo) / s) * s
    return y


def unit_rms(x):
    s = np.sqrt((x * x).mean(1, keepdims=True)) + 1e-12
    return (x / s).astype(np.float32), s


def nearest(xg, cb):  # xg [G, N, c], cb [G, K, c] -> [G, N]
    d = (cb * cb).sum(-1)[:, None, :] - 2 * np.einsum('gnc,gkc->gnk', xg, cb, optimize=True)
    return d.argmin(-1)


def decode(x, cb):
    g_n, _, c = cb.shape
    xn, s = unit_rms(x)
    idx = nearest(xn.reshape(-1, g_n, c).transpose(1, 0, 2), cb)
    return np.stack([cb[g][idx[g]] for g in range(g_n)], 1).reshape(-1, R) * s


def read_codebook(path):
    c, k, r, _ = struct.unpack('4i', open(path, 'rb').read(16))
    return np.fromfile(path, np.float32, offset=16).reshape(r // c, k, c)


def train(dump, test, out, c, k, kind, n_train=12000, iters=10):
    rng = np.random.default_rng(0)
    os.makedirs(out, exist_ok=True)
    tot = np.zeros(3)
    for f in sorted(glob.glob(f'{dump}/{kind}_*.f32')):
        name = os.path.basename(f)[2:-4]
        x = load(f)
        if len(x) > n_train:
            x = x[rng.choice(len(x), n_train, replace=False)]
        g_n = R // c
        xg = unit_rms(x)[0].reshape(-1, g_n, c).transpose(1, 0, 2).copy()
        cb = xg[:, rng.choice(xg.shape[1], k, replace=False), :].copy()
        for _ in range(iters):
            idx = nearest(xg, cb)
            for g in range(g_n):
                cnt = np.bincount(idx[g], minlength=k).astype(np.float32)
                sums = np.zeros((k, c), np.float32)
                np.add.at(sums, idx[g], xg[g])
                hit = cnt > 0
                cb[g][hit] = sums[hit] / cnt[hit, None]
                if (~hit).any():  # empty cells restart on random rows
                    cb[g][~hit] = xg[g][rng.choice(xg.shape[1], int((~hit).sum()))]
        il, hd = map(int, name.split('_'))
        with open(f'{out}/cb_{il}_{hd}.f32', 'wb') as fo:
            fo.write(struct.pack('4i', c, k, R, 1))
            fo.write(cb.astype(np.float32).tobytes())
        t = load(f'{test}/{kind}_{name}.f32')
        tot += [((decode(t, cb) - t) ** 2).sum(), ((grid2(t) - t) ** 2).sum(), (t * t).sum()]
        print(f'{kind} {name}: held-out relative error {tot[0] / tot[2]:.4f} so far', file=sys.stderr, flush=True)
    bits = np.log2(k) / c + 16 / R
    print(f'c={c} K={k} ({bits:.3f} bits an element): held-out relative squared error {tot[0] / tot[2]:.4f}, '
          f'2-bit per-token grid {tot[1] / tot[2]:.4f}')


def averages(test, cbs, span=256, group=32):
    """Errors of uniform and of randomly weighted (lognormal, sigma 1.5) sums of span rows, against
    what independent per-token errors would give; each codebook also with each group of rows' mean
    error added back (ZACK_VQ_MEAN=1 of the patch)."""
    acc = {}
    rng = np.random.default_rng(1)
    for f in sorted(glob.glob(f'{test}/v_*.f32'))[::4]:
        name = os.path.basename(f)[2:-4]
        t = load(f)
        t = t[:len(t) // span * span]
        errs = [('2-bit grid', grid2(t) - t)]
        for d in cbs:
            e = decode(t, read_codebook(f'{d}/cb_{name}.f32')) - t
            errs += [(d, e), (d + ' + group mean', e - np.repeat(e.reshape(-1, group, R).mean(1), group, 0))]
        w = rng.lognormal(0, 1.5, (len(t) // span, span))
        w /= w.sum(1, keepdims=True)
        for lab, e in errs:
            per = (e ** 2).sum(1).mean()
            uni = (e.reshape(-1, span, R).mean(1) ** 2).sum(1).mean() / (per / span)
            wtd = ((e.reshape(-1, span, R) * w[..., None]).sum(1) ** 2).sum(1).mean() / (per * (w ** 2).sum(1).mean())
            acc.setdefault(lab, []).append((per / (t * t).sum(1).mean(), uni, wtd))
    for lab, rows in acc.items():
        per, uni, wtd = np.mean(rows, 0)
        print(f'{lab}: per-token relative error {per:.4f}; error of {span}-token sums, against independent errors: '
              f'uniform {uni:.1f}x, weighted {wtd:.1f}x')


if __name__ == '__main__':
    if len(sys.argv) >= 7 and sys.argv[1] == 'train':
        train(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]),
              'k' if '--keys' in sys.argv else 'v')
    elif len(sys.argv) >= 3 and sys.argv[1] == 'avg':
        averages(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
