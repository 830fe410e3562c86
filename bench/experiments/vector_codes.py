#!/usr/bin/env python3
"""Vector codes for the cache, simulated (bench/RESULTS.md, 2026-11-30 "vector codes").

An experiment, not part of zack. With bench/experiments/vector_codes.patch
applied to a throwaway copy, `ZACK_VDUMP=DIR zack eval ...` writes every key
and value row that leaves the full-precision window to DIR/{k,v}_LAYER_HEAD.f32
(float32 rows of 128 channels, in the cache's basis). This script then
  train  DUMP TEST OUT c K [--keys] [--wo DIR] [--channel-gains]: k-means
         codebooks per (layer, head, group of c channels), K centroids each,
         on rows scaled to unit RMS (the scale is a per-token f16: 0.125 bit an
         element); writes OUT/cb_L_G.f32 for
         ZACK_VQ=OUT (values) or ZACK_KQ=OUT (keys), and prints the held-out
         relative squared error next to a 2-bit per-token grid's. Each file ends
         with the gain that undoes the code's shrink (code_gain), one for the head
         or with --channel-gains one a channel. With --wo, rows
         are coded as x A, A = G^(1/2) from DIR/a_L_G.f32 (A and A^-1, G the Gram of
         the head group's folded W_o columns: `wo` below), so that k-means
         minimises the error the layer's output sees (ZACK_VQ_W=DIR in the patch);
  wo     ZACK OUT: writes OUT/a_L_G.f32 from a .zack's attn_output tensors;
  avg    TEST CB...: sums of 256 rows (uniform, and with random attention-like
         weights): their error against what independent per-token errors would
         give (1.0), and how much the code shrinks them (beta), for the 2-bit grid
         and each codebook directory.
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
    """The centroids [r / c, K, c], and the gain that multiplies every decoded row."""
    c, k, r, _ = struct.unpack('4i', open(path, 'rb').read(16))
    data = np.fromfile(path, np.float32, offset=16)
    n = r // c * k * c
    gain = data[n:] if len(data) == n + r else (float(data[n]) if len(data) > n else 1.0)
    return data[:n].reshape(r // c, k, c), gain


def write_codebook(path, cb, gain):
    g_n, k, c = cb.shape
    with open(path, 'wb') as fo:
        fo.write(struct.pack('4i', c, k, g_n * c, 1))
        fo.write(cb.astype(np.float32).tobytes())
        fo.write(np.asarray(gain, np.float32).reshape(-1).tobytes())


def code_gain(x, cb, per_channel=False):
    """sum |x|^2 / sum <x_hat, x> over the rows: k-means decodes each row shrunk towards its cell's
    centre (about 0.81 of the row along itself at 4 x 64), the same way for every token, so
    attention's sums shrink too; this gain undoes it on average."""
    y = decode(x, cb)
    if per_channel:  # one a channel (they fold into W_o as well)
        return ((x * x).sum(0) / np.maximum((y * x).sum(0), 1e-30)).astype(np.float32)
    return float((x * x).sum() / (y * x).sum())


def output_weight(wo, name):
    """(A, A^-1) of wo/a_L_G.f32: A = G^(1/2), G the Gram of the head group's folded W_o columns, so that
    |e A| is the error the layer's output sees (rows coded as x A, decoded times A^-1); identity without."""
    if not wo:
        return np.eye(R, dtype=np.float32), np.eye(R, dtype=np.float32)
    m = np.fromfile(f'{wo}/a_{name}.f32', np.float32).reshape(2, R, R)
    return m[0], m[1]


def train(dump, test, out, c, k, kind, n_train=12000, iters=10, wo=None, per_channel=False):
    rng = np.random.default_rng(0)
    os.makedirs(out, exist_ok=True)
    tot = np.zeros(3)
    for f in sorted(glob.glob(f'{dump}/{kind}_*.f32')):
        name = os.path.basename(f)[2:-4]
        a, ai = output_weight(wo, name)
        x = load(f) @ a
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
        write_codebook(f'{out}/cb_{il}_{hd}.f32', cb, code_gain(load(f) @ a, cb, per_channel))
        t = load(f'{test}/{kind}_{name}.f32')
        tot += [((decode(t @ a, cb) @ ai - t) ** 2).sum(), ((grid2(t) - t) ** 2).sum(), (t * t).sum()]  # the row error, before the gain
        print(f'{kind} {name}: held-out relative error {tot[0] / tot[2]:.4f} so far', file=sys.stderr, flush=True)
    bits = np.log2(k) / c + 16 / R
    print(f'c={c} K={k} ({bits:.3f} bits an element): held-out relative squared error {tot[0] / tot[2]:.4f}, '
          f'2-bit per-token grid {tot[1] / tot[2]:.4f}')


def write_output_weights(zack, out, n_kv=2):
    import gguf
    from gguf.quants import dequantize
    os.makedirs(out, exist_ok=True)
    for t in gguf.GGUFReader(zack).tensors:
        if not t.name.endswith('attn_output.weight'):
            continue
        il = int(t.name.split('.')[1])
        w = dequantize(t.data, t.tensor_type).astype(np.float64)  # [n_embd x n_head * R]
        group = w.shape[1] // R // n_kv
        for g in range(n_kv):
            gram = sum(w[:, i * R:(i + 1) * R].T @ w[:, i * R:(i + 1) * R] for i in range(g * group, (g + 1) * group))
            ev, vec = np.linalg.eigh(gram)
            ev = np.maximum(ev, ev.max() * 1e-6)
            with open(f'{out}/a_{il}_{g}.f32', 'wb') as fo:
                fo.write(((vec * np.sqrt(ev)) @ vec.T).astype(np.float32).tobytes())
                fo.write(((vec / np.sqrt(ev)) @ vec.T).astype(np.float32).tobytes())


def averages(test, cbs, span=256, group=32):
    """Sums of span held-out rows, uniform and randomly weighted (lognormal, sigma 1.5, as attention
    is): their error against what independent per-token errors would give, and beta = <o_hat, o> /
    <o, o> of the weighted sums (below 1: the code shrinks attention outputs). Each codebook without
    its gain, with it, and without it but with each group of rows' mean error added back
    (ZACK_VQ_MEAN=1 of the patch)."""
    acc = {}
    rng = np.random.default_rng(1)
    for f in sorted(glob.glob(f'{test}/v_*.f32'))[::4]:
        name = os.path.basename(f)[2:-4]
        t = load(f)
        t = t[:len(t) // span * span]
        errs = [('2-bit grid', grid2(t) - t)]
        for d in cbs:
            cb, gain = read_codebook(f'{d}/cb_{name}.f32')
            y = decode(t, cb)
            e = y - t
            errs += [(d, e), (d + ' with its gain', y * gain - t),
                     (d + ' + group mean', e - np.repeat(e.reshape(-1, group, R).mean(1), group, 0))]
        w = rng.lognormal(0, 1.5, (len(t) // span, span))
        w /= w.sum(1, keepdims=True)
        o = (t.reshape(-1, span, R) * w[..., None]).sum(1)
        for lab, e in errs:
            per = (e ** 2).sum(1).mean()
            uni = (e.reshape(-1, span, R).mean(1) ** 2).sum(1).mean() / (per / span)
            eo = (e.reshape(-1, span, R) * w[..., None]).sum(1)
            wtd = (eo ** 2).sum(1).mean() / (per * (w ** 2).sum(1).mean())
            beta = 1 + (eo * o).sum() / (o * o).sum()
            acc.setdefault(lab, []).append((per / (t * t).sum(1).mean(), uni, wtd, beta))
    for lab, rows in acc.items():
        per, uni, wtd, beta = np.mean(rows, 0)
        print(f'{lab}: per-token relative error {per:.4f}; error of {span}-token sums, against independent errors: '
              f'uniform {uni:.1f}x, weighted {wtd:.1f}x; beta {beta:.3f}')


if __name__ == '__main__':
    if len(sys.argv) >= 7 and sys.argv[1] == 'train':
        train(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]),
              'k' if '--keys' in sys.argv else 'v', wo=sys.argv[sys.argv.index('--wo') + 1] if '--wo' in sys.argv else None,
              per_channel='--channel-gains' in sys.argv)
    elif len(sys.argv) == 4 and sys.argv[1] == 'wo':
        write_output_weights(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == 'avg':
        averages(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
