#!/usr/bin/env python3
"""A .zack whose score key basis is replaced by a quantization pair (bench/RESULTS.md, 2026-12-07 "key bases").

An experiment, not part of zack: it measured the pair (calib/keybasis.h keybasis_quant_pair) end to end with a
plan held fixed, before `zack calibrate` stored the pair itself. It copies SRC.zack to DST.zack and overwrites
blk.N.zack.kqa / kqb (the score basis, which a plan's `key_basis` 1 selects) with the pair computed from a
`key_quantizers.py capture` (the training windows' queries and keys): C_q^1/2 (or C_q with `full`) and the
keys' within-group scatter (or their second moment with `total`), every direction at unit within-group RMS,
in the order of sqrt(E[q^2]) var_w. Then a plan with `key_basis` 1 for every head codes its tailed keys in it
(sessions take the score basis as given, in column order).

  python3 bench/experiments/key_pair_zack.py SRC.zack CAPTURE_DIR DST.zack [half|full|total]
"""
import shutil
import sys

import numpy as np
from gguf import GGUFReader

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from key_basis_quant import powm, score_pair  # noqa: E402
from key_quantizers import D, G, KV, L  # noqa: E402


def main(src, cap, dst, mode):
    shutil.copyfile(src, dst)
    zt = {t.name: t for t in GGUFReader(src).tensors}
    tr = np.load(f"{cap}/train.npz")
    K, Q = tr["k"], tr["q"]
    mm = np.memmap(dst, mode="r+", dtype=np.uint8)
    for il in range(L):
        mu = np.array(zt[f"blk.{il}.zack.kmean"].data, np.float32).reshape(KV, D).astype(np.float64)
        As, Bs = np.zeros((KV, D, D), np.float32), np.zeros((KV, D, D), np.float32)
        for g in range(KV):
            ktr = K[:, il, :, g, :].reshape(-1, D).astype(np.float64) - mu[g]
            qtr = Q[:, il][:, :, g * G:(g + 1) * G, :].reshape(-1, D).astype(np.float64)
            Cq = qtr.T @ qtr / len(qtr)
            dev = (ktr.reshape(-1, 32, D) - ktr.reshape(-1, 32, D).mean(1, keepdims=True)).reshape(-1, D)
            Cw = dev.T @ dev / len(dev)
            A, B = score_pair(powm(Cq, 0.5) if mode != "full" else Cq, ktr.T @ ktr / len(ktr) if mode == "total" else Cw)
            sw = np.sqrt(((dev @ B) ** 2).mean(0))
            A, B = A * sw, B / sw
            order = np.argsort(-(np.sqrt(((qtr @ A) ** 2).mean(0)) * ((dev @ B) ** 2).mean(0)), kind="stable")
            As[g], Bs[g] = A[:, order], B[:, order]
        for name, M in (("kqa", As), ("kqb", Bs)):
            t = zt[f"blk.{il}.zack.{name}"]
            b = np.frombuffer(M.astype("<f4").tobytes(), np.uint8)
            mm[t.data_offset:t.data_offset + len(b)] = b
        print(f"layer {il}", file=sys.stderr)
    mm.flush()


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "half")
