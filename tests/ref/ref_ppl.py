"""Negative log-likelihoods of next tokens from logits, for the perplexity
checks of the reference tests."""
from __future__ import annotations

import numpy as np


def nll(logits: np.ndarray, targets, block: int = 64) -> np.ndarray:
    """-log softmax(logits[i])[targets[i]]; logits [n, n_vocab]. Rows in blocks
    (a 1,024 x 151,936 array in float64 at once is 1.2 GB, and float64 exp over
    Gemma's 262,144 logits a row was most of test_gemma_ref's arithmetic);
    e^(x - max) in float32, its sum and the log in float64."""
    targets = np.asarray(targets)
    out = np.empty(len(targets), dtype=np.float64)
    for i in range(0, len(targets), block):
        lg = np.asarray(logits[i:i + block], dtype=np.float32)
        mx = lg.max(-1, keepdims=True)
        lse = np.log(np.exp(lg - mx).sum(-1, dtype=np.float64)) + mx[:, 0]
        out[i:i + block] = lse - lg[np.arange(len(lg)), targets[i:i + block]]
    return out
