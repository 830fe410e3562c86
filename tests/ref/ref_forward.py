#!/usr/bin/env python3
"""Independent numpy reference forward pass for llama-family GGUF models.

This is the oracle that zack's C++ engine is compared against, so it is written
to be obviously correct rather than fast: weights are dequantized to float32 with
the `gguf` package (gguf.quants.dequantize; the file's header and tensor table
read by ref_gguf, which test_dequant_ref and test_tokenizer_ref check against
gguf.GGUFReader; nothing from zack),
and every step of the decoder is plain numpy.

Supported architectures: `llama` and `qwen2` (qwen2 adds q/k/v biases).

Shapes: a GGUF tensor with ne = [n_cols, n_rows] (ne[0] fastest) is a numpy array
[n_rows, n_cols] after dequantize, so a linear layer is y = W @ x, or for a batch
of row vectors X [n_tok, n_cols]: Y = X @ W.T  [n_tok, n_rows].

RoPE pairing (checked, not assumed):
  llama.cpp src/llama-model.cpp, llama_model_rope_type(): LLM_ARCH_LLAMA returns
  LLAMA_ROPE_TYPE_NORM ("normal RoPE, operating on pairs of consecutive head
  values"), LLM_ARCH_QWEN2 returns LLAMA_ROPE_TYPE_NEOX ("the pairs of head values
  are offset by n_rot/2"). The reason is the HF->GGUF converter: for llama it
  applies permute(w, n_head) = w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2) to
  attn_q/attn_k, which turns HF's rotate_half layout (x[i], x[i+d/2]) into
  adjacent pairs (x[2i], x[2i+1]); qwen2 weights are stored unpermuted.
  The angle for pair i at position p is p * freq_base^(-2i/n_rot) in both styles.

Float precision: weights and activations are float32 (numpy/BLAS accumulate in
float32, relative error ~1e-6, far below the ~1e-2 that zack's 8-bit activation
quantization introduces); RMSNorm statistics and softmax are computed in float64.

Memory: by default every weight is dequantized once at load (fine for small
models; a 1.5B model would take ~7 GB). Model(path, stream=True) keeps only the
memory-mapped GGUF and dequantizes one layer at a time inside forward(), the
token-embedding rows it needs, and the output matrix in row blocks: peak memory is
one layer's float32 weights (~200 MB for Qwen2.5-1.5B) plus activations, at the
cost of dequantizing everything again on every forward() call (so feed a whole
sequence in one call rather than token by token).

API:
    m = load(path)                      # cached per process
    m = Model(path, stream=True)        # layer-by-layer dequantization
    m.forward(ids)  -> logits [n_tok, n_vocab] float32
    m.forward_lanes([(ids_a, False), (ids_b, True)]) -> [logits_a, logits_b]
                                        # several sequences in one pass over the
                                        # weights; True: llama.cpp-style rounding
    m.greedy(ids, n) -> list of n new ids (KV cache, argmax, no EOS stop)
    forward(path, ids), greedy(path, ids, n)   # convenience wrappers

CLI:
    python3 ref_forward.py MODEL --ids 1,2,3 --out logits.npy
    python3 ref_forward.py MODEL --ids 1,2,3 --greedy 32
    python3 ref_forward.py --selftest      # tiny synthetic llama/qwen2 checks
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import numpy as np

import gguf
import ref_gguf
from gguf.quants import dequantize


# --------------------------------------------------------------------------
# Hyper-parameters
# --------------------------------------------------------------------------

SUPPORTED_ARCHS = ("llama", "qwen2")
ROPE_STYLE = {"llama": "normal", "qwen2": "neox"}  # see module docstring


@dataclass
class HParams:
    arch: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    eps: float
    freq_base: float
    rope_scale: float  # positions are divided by this (linear scaling); 1 = none
    rope_style: str    # "normal" (adjacent pairs) or "neox" (pairs offset d/2)


def _field(reader, key: str, default=None, required=True):
    f = reader.fields.get(key)
    if f is None:
        if required and default is None:
            raise KeyError(f"GGUF key '{key}' missing")
        return default
    return f.contents()


def read_hparams(reader, path: str = "") -> HParams:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"{path}: architecture '{arch}' not supported by the reference "
                         f"(supported: {', '.join(SUPPORTED_ARCHS)})")
    n_embd = int(_field(reader, f"{arch}.embedding_length"))
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_head_kv = int(_field(reader, f"{arch}.attention.head_count_kv", default=n_head))
    head_dim = n_embd // n_head
    n_rot = int(_field(reader, f"{arch}.rope.dimension_count", default=head_dim))
    scale = 1.0
    stype = _field(reader, f"{arch}.rope.scaling.type", default="none", required=False)
    if stype == "linear":
        scale = float(_field(reader, f"{arch}.rope.scaling.factor", default=1.0))
    elif stype not in ("none", None):
        raise ValueError(f"{path}: rope scaling type '{stype}' not supported by the reference")
    if n_head % n_head_kv != 0:
        raise ValueError(f"{path}: head_count {n_head} not a multiple of head_count_kv {n_head_kv}")
    if n_rot > head_dim or n_rot % 2 != 0:
        raise ValueError(f"{path}: rope.dimension_count {n_rot} invalid for head dim {head_dim}")
    return HParams(
        arch=arch,
        n_embd=n_embd,
        n_layer=int(_field(reader, f"{arch}.block_count")),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=n_rot,
        eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        freq_base=float(_field(reader, f"{arch}.rope.freq_base", default=10000.0)),
        rope_scale=scale,
        rope_style=ROPE_STYLE[arch],
    )


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------

def _dequant(t) -> np.ndarray:
    """GGUF tensor -> float32 numpy array with shape reversed(ne) ([n_rows, n_cols])."""
    a = dequantize(t.data, t.tensor_type)
    shape = tuple(int(x) for x in reversed(t.shape))  # t.shape is ne (fastest first)
    return np.ascontiguousarray(a.reshape(shape), dtype=np.float32)


@dataclass
class Layer:
    attn_norm: np.ndarray  # [n_embd]
    wq: np.ndarray         # [n_head*hd, n_embd]
    wk: np.ndarray         # [n_head_kv*hd, n_embd]
    wv: np.ndarray         # [n_head_kv*hd, n_embd]
    bq: np.ndarray | None  # [n_head*hd] (qwen2)
    bk: np.ndarray | None
    bv: np.ndarray | None
    wo: np.ndarray         # [n_embd, n_head*hd]
    ffn_norm: np.ndarray   # [n_embd]
    w_gate: np.ndarray     # [n_ff, n_embd]
    w_up: np.ndarray       # [n_ff, n_embd]
    w_down: np.ndarray     # [n_embd, n_ff]
    # weight field name -> the activation rounding llama.cpp applies before a dot
    # product with that weight's type (act_rounding), used only by emulate_llamacpp
    act: dict | None = None


def quantize_q8_blocks(x: np.ndarray, block: int = 32, f32_scale: bool = False) -> np.ndarray:
    """Round-trip x [..., n] through 8-bit blocks (scale = amax/127 per `block`
    values along the last axis, stored as f16, or f32 with f32_scale), as llama.cpp
    does to activations before a quantized dot product (Q8_0/Q8_1: 32 values, f16
    scale; Q8_K, for k-quant weights: 256 values, f32 scale). Used only to
    *estimate* the error an engine that does this should show; the reference
    proper never calls it."""
    shp = x.shape
    xb = x.reshape(*shp[:-1], shp[-1] // block, block)
    d = (np.abs(xb).max(axis=-1, keepdims=True) / 127.0).astype(np.float32)
    if not f32_scale:
        d = d.astype(np.float16).astype(np.float32)
    q = np.round(np.divide(xb, d, out=np.zeros_like(xb), where=d > 0))
    return (q * d).reshape(shp).astype(np.float32)


_K_QUANTS = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K"}


def act_rounding(qtype) -> tuple[int, bool] | None:
    """(block, f32_scale) of the 8-bit activation blocks llama.cpp's CPU path
    dots a weight of type `qtype` with (its vec_dot_type): Q8_K for k-quants,
    Q8_0/Q8_1 for the 32-value types; None for float weights (dotted in float)."""
    name = gguf.GGMLQuantizationType(qtype).name
    if name in _K_QUANTS:
        return (256, True)
    if name in ("F32", "F16", "BF16"):
        return None
    return (32, False)


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(x.dtype)


class Model:
    def __init__(self, path: str, stream: bool = False):
        self.path = path
        self.stream = stream
        # Off for the reference proper. When set, forward() rounds like llama.cpp's
        # CPU path does, to estimate the error a faithful engine shows: activations
        # entering every weight matmul go through 8-bit blocks (quantize_q8_blocks),
        # and Q, K, V and the attention probabilities through float16 (f16 KV cache).
        self.emulate_llamacpp = False
        reader = ref_gguf.reader(path)
        self.hp = read_hparams(reader, path)
        self._reader = reader
        hp = self.hp
        embd = self._tensor("token_embd.weight")
        if int(embd.shape[0]) != hp.n_embd:  # ne = [n_embd, n_vocab]
            raise ValueError(f"{path}: token_embd has {int(embd.shape[0])} columns, "
                             f"expected embedding_length {hp.n_embd}")
        self.n_vocab = int(embd.shape[1])
        self._output_name = "output.weight" if reader.tensor("output.weight") is not None else "token_embd.weight"
        self.tied = self._output_name == "token_embd.weight"
        self._out_act = act_rounding(self._tensor(self._output_name).tensor_type)
        self.out_block_rows = 16384  # stream: output rows per block (~100 MB of float32 at n_embd 1536)
        self.output_norm = self._get("output_norm.weight")
        if not stream:
            self.tok_embd = self._get("token_embd.weight")  # [n_vocab, n_embd]
            self.output = self.tok_embd if self.tied else self._get("output.weight")
            self.layers = [self._load_layer(i) for i in range(hp.n_layer)]
        # Per-pair inverse frequencies: theta_i = base^(-2i/n_rot), i < n_rot/2.
        i = np.arange(hp.n_rot // 2, dtype=np.float64)
        self.inv_freq = hp.freq_base ** (-2.0 * i / hp.n_rot)

    # ---- weights ---------------------------------------------------------

    def _tensor(self, name):
        t = self._reader.tensor(name)
        if t is None:
            raise KeyError(f"{self.path}: tensor '{name}' missing")
        return t

    def _get(self, name, required=True):
        if not required and self._reader.tensor(name) is None:
            return None
        return _dequant(self._tensor(name))

    def _get_rows(self, name, rows) -> np.ndarray:
        """Rows `rows` (ints or a slice) of a 2-D tensor, dequantized: [n, n_cols].
        A quantized row is a whole number of blocks, so rows dequantize alone."""
        t = self._tensor(name)
        n_cols = int(t.shape[0])
        a = dequantize(t.data[rows], t.tensor_type)
        return np.ascontiguousarray(a.reshape(-1, n_cols), dtype=np.float32)

    def _load_layer(self, i: int) -> Layer:
        hp, path, get = self.hp, self.path, self._get
        p = f"blk.{i}."
        L = Layer(
            attn_norm=get(p + "attn_norm.weight"),
            wq=get(p + "attn_q.weight"), wk=get(p + "attn_k.weight"),
            wv=get(p + "attn_v.weight"),
            bq=get(p + "attn_q.bias", False), bk=get(p + "attn_k.bias", False),
            bv=get(p + "attn_v.bias", False),
            wo=get(p + "attn_output.weight"),
            ffn_norm=get(p + "ffn_norm.weight"),
            w_gate=get(p + "ffn_gate.weight"), w_up=get(p + "ffn_up.weight"),
            w_down=get(p + "ffn_down.weight"),
        )
        L.act = {f: act_rounding(self._tensor(p + n + ".weight").tensor_type) for f, n in (
            ("wq", "attn_q"), ("wk", "attn_k"), ("wv", "attn_v"), ("wo", "attn_output"),
            ("w_gate", "ffn_gate"), ("w_up", "ffn_up"), ("w_down", "ffn_down"))}
        qd, kvd = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        for name, w, rows in (("attn_q", L.wq, qd), ("attn_k", L.wk, kvd),
                              ("attn_v", L.wv, kvd)):
            if w.shape != (rows, hp.n_embd):
                raise ValueError(f"{path}: {p}{name}.weight has shape {w.shape}, "
                                 f"expected {(rows, hp.n_embd)}")
        return L

    def _layer(self, i: int) -> Layer:
        return self._load_layer(i) if self.stream else self.layers[i]

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        if not self.stream:
            return self.tok_embd[ids]
        uniq, inv = np.unique(ids, return_inverse=True)
        return self._get_rows("token_embd.weight", uniq)[inv]

    def _logits(self, xs: list, emulate) -> list:
        """Per lane x [n_tok, n_embd] (normed) -> [n_tok, n_vocab]; with stream=True
        each block of output rows is dequantized once for all lanes."""
        if not self.stream:
            return [self._linear(x, self.output, self._out_act, em) for x, em in zip(xs, emulate)]
        outs = [np.empty((x.shape[0], self.n_vocab), dtype=np.float32) for x in xs]
        step = self.out_block_rows
        for r0 in range(0, self.n_vocab, step):
            r1 = min(self.n_vocab, r0 + step)
            w = self._get_rows(self._output_name, slice(r0, r1))
            for out, x, em in zip(outs, xs, emulate):
                out[:, r0:r1] = self._linear(x, w, self._out_act, em)
        return outs

    def _linear(self, x: np.ndarray, w: np.ndarray, act=None, emulate=False) -> np.ndarray:
        # x [n_tok, n_in], w [n_out, n_in] -> [n_tok, n_out]; act: act_rounding()
        if emulate and act is not None and x.shape[-1] % act[0] == 0:
            x = quantize_q8_blocks(x, *act)
        return x @ w.T

    def _rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        # x [n_tok, n_embd]; statistics in float64
        ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        return (x / np.sqrt(ms + self.hp.eps)).astype(np.float32) * w

    def _rope(self, x: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """x [n_tok, n_heads, hd]; pos [n_tok]. Rotates the first n_rot dims."""
        hp = self.hp
        ang = (pos.astype(np.float64) / hp.rope_scale)[:, None] * self.inv_freq[None, :]
        cos = np.cos(ang)[:, None, :].astype(np.float32)  # [n_tok, 1, n_rot/2]
        sin = np.sin(ang)[:, None, :].astype(np.float32)
        y = x.copy()
        r = hp.n_rot
        if hp.rope_style == "normal":
            a, b = x[..., 0:r:2], x[..., 1:r:2]
            y[..., 0:r:2] = a * cos - b * sin
            y[..., 1:r:2] = a * sin + b * cos
        else:  # neox
            a, b = x[..., : r // 2], x[..., r // 2 : r]
            y[..., : r // 2] = a * cos - b * sin
            y[..., r // 2 : r] = a * sin + b * cos
        return y

    # ---- forward ---------------------------------------------------------

    def new_cache(self):
        """Per layer [K, V], each [n_head_kv, n_ctx, hd] (post-RoPE keys)."""
        hp = self.hp
        z = np.zeros((hp.n_head_kv, 0, hp.head_dim), dtype=np.float32)
        return [[z, z] for _ in range(hp.n_layer)]

    def forward(self, ids, cache=None, last_only=False) -> np.ndarray:
        """Logits [n_tok, n_vocab] for tokens `ids` appended after `cache`
        (a fresh sequence when cache is None). With last_only, [1, n_vocab].
        Rounds like llama.cpp when self.emulate_llamacpp is set."""
        return self.forward_lanes([(ids, self.emulate_llamacpp)], [cache], last_only)[0]

    def forward_lanes(self, lanes, caches=None, last_only=False) -> list:
        """forward() for several independent sequences ("lanes") in one pass:
        lanes = [(ids, emulate), ...] with emulate False for the exact reference
        and True for llama.cpp's rounding; each lane has its own cache (caches[i],
        None = a fresh sequence). All lanes share every layer's dequantized
        weights: with stream=True the weights are dequantized once for all.
        Returns one logits array per lane."""
        hp = self.hp
        lane_ids = []
        for ids, _ in lanes:
            ids = np.asarray(ids, dtype=np.int64).reshape(-1)
            if ids.size == 0:
                raise ValueError("forward: empty token list")
            if ids.min() < 0 or ids.max() >= self.n_vocab:
                raise ValueError(f"forward: token id out of range [0, {self.n_vocab})")
            lane_ids.append(ids)
        emulate = [bool(em) for _, em in lanes]
        caches = list(caches) if caches is not None else [None] * len(lanes)
        caches = [c if c is not None else self.new_cache() for c in caches]
        xs = [self._embed(ids) for ids in lane_ids]  # each [n_tok, n_embd]
        for li in range(hp.n_layer):
            L = self._layer(li)
            for j, em in enumerate(emulate):
                xs[j] = self._block(L, li, xs[j], caches[j], em)
        if last_only:
            xs = [x[-1:] for x in xs]
        return self._logits([self._rmsnorm(x, self.output_norm) for x in xs], emulate)

    def _block(self, L: Layer, li: int, x: np.ndarray, cache, emulate: bool) -> np.ndarray:
        """One decoder layer on x [n_tok, n_embd] at positions after cache[li]."""
        hp = self.hp
        n_tok = x.shape[0]
        n_past = cache[li][0].shape[1]
        pos = np.arange(n_past, n_past + n_tok)
        hd, nh, nkv = hp.head_dim, hp.n_head, hp.n_head_kv
        group = nh // nkv
        scale = 1.0 / np.sqrt(hd)
        # causal mask over [n_tok, n_past + n_tok]: query t sees keys <= n_past + t
        mask = np.arange(n_past + n_tok)[None, :] > pos[:, None]
        lin = lambda a, w, f: self._linear(a, w, L.act[f], emulate)  # noqa: E731
        h = self._rmsnorm(x, L.attn_norm)
        q = lin(h, L.wq, "wq")  # [n_tok, nh*hd]
        k = lin(h, L.wk, "wk")  # [n_tok, nkv*hd]
        v = lin(h, L.wv, "wv")
        if L.bq is not None: q = q + L.bq
        if L.bk is not None: k = k + L.bk
        if L.bv is not None: v = v + L.bv
        q = self._rope(q.reshape(n_tok, nh, hd), pos)
        k = self._rope(k.reshape(n_tok, nkv, hd), pos)
        v = v.reshape(n_tok, nkv, hd)
        if emulate:
            q, k, v = (_f16(t) for t in (q, k, v))
        K = np.concatenate([cache[li][0], k.transpose(1, 0, 2)], axis=1)  # [nkv, T, hd]
        V = np.concatenate([cache[li][1], v.transpose(1, 0, 2)], axis=1)
        cache[li][0], cache[li][1] = K, V
        # GQA: query head hq reads KV head hq // group
        qh = q.transpose(1, 0, 2).reshape(nkv, group, n_tok, hd)
        s = np.einsum("gqtd,gsd->gqts", qh.astype(np.float64), K.astype(np.float64)) * scale
        s = np.where(mask[None, None], -np.inf, s)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        if emulate:
            p = _f16(p)
        o = np.einsum("gqts,gsd->gqtd", p, V.astype(np.float64)).astype(np.float32)
        o = o.reshape(nh, n_tok, hd).transpose(1, 0, 2).reshape(n_tok, nh * hd)
        x = x + lin(o, L.wo, "wo")
        h = self._rmsnorm(x, L.ffn_norm)
        g = lin(h, L.w_gate, "w_gate")
        u = lin(h, L.w_up, "w_up")
        act = (g / (1.0 + np.exp(-g.astype(np.float64)))).astype(np.float32) * u  # silu(g)*u
        return x + lin(act, L.w_down, "w_down")

    def greedy(self, ids, n: int) -> list[int]:
        """n new token ids by argmax (no stop on EOS), using a KV cache."""
        cache = self.new_cache()
        logits = self.forward(ids, cache, last_only=True)
        out = []
        for _ in range(n):
            t = int(np.argmax(logits[-1]))
            out.append(t)
            if len(out) == n:
                break
            logits = self.forward([t], cache, last_only=True)
        return out


_MODELS: dict[str, Model] = {}


def load(path: str) -> Model:
    """Model for `path`, dequantized once per process."""
    m = _MODELS.get(path)
    if m is None:
        m = Model(path)
        _MODELS[path] = m
    return m


def forward(path: str, ids) -> np.ndarray:
    return load(path).forward(ids)


def greedy(path: str, ids, n: int) -> list[int]:
    return load(path).greedy(ids, n)


# --------------------------------------------------------------------------
# Self-check on tiny synthetic models
# --------------------------------------------------------------------------

def _write_tiny(path: str, arch: str, w: dict, hp: dict) -> None:
    wr = gguf.GGUFWriter(path, arch)
    wr.add_block_count(hp["n_layer"])
    wr.add_embedding_length(hp["n_embd"])
    wr.add_feed_forward_length(hp["n_ff"])
    wr.add_head_count(hp["n_head"])
    wr.add_head_count_kv(hp["n_head_kv"])
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_rope_freq_base(10000.0)
    wr.add_rope_dimension_count(hp["n_embd"] // hp["n_head"])
    for name, a in w.items():
        if name in hp.get("q8_0", ()):  # stored quantized: rows of Q8_0 blocks
            qt = gguf.GGMLQuantizationType.Q8_0
            q = gguf.quants.quantize(np.ascontiguousarray(a, dtype=np.float32), qt)
            wr.add_tensor(name, q, raw_shape=q.shape, raw_dtype=qt)
        else:
            wr.add_tensor(name, np.ascontiguousarray(a, dtype=np.float32))
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def selftest(tmpdir: str) -> list[str]:
    """Checks the reference's plumbing on two tiny random F32 models written with
    gguf.GGUFWriter; returns a list of problems (empty when all is well):
      1. qwen2 (neox RoPE, HF-layout Q/K, zero biases) == llama (normal RoPE, Q/K
         rows permuted as the HF->GGUF converter does): the two RoPE styles and
         the converter's permutation agree;
      2. q/k/v biases are read and change the result;
      3. batched forward == token-by-token forward through the KV cache;
      4. stream=True (layer-by-layer dequantization, embedding rows gathered, the
         output matrix in row blocks) == stream=False, on a qwen2 model whose
         embedding and separate output matrix are Q8_0;
      5. forward_lanes (exact and emulated lanes in one pass) == separate passes,
         and a lane of other tokens next to them changes nothing."""
    import os
    rng = np.random.default_rng(0)
    hp = dict(n_layer=2, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, n_vocab=50)
    d, hd = hp["n_embd"], hp["n_embd"] // hp["n_head"]

    def permute(w, nh):  # HF rotate_half layout -> adjacent pairs (GGUF llama)
        return w.reshape(nh, 2, w.shape[0] // nh // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)

    base = {"token_embd.weight": rng.standard_normal((hp["n_vocab"], d)),
            "output_norm.weight": 1 + 0.1 * rng.standard_normal(d)}
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        base.update({
            p + "attn_norm.weight": 1 + 0.1 * rng.standard_normal(d),
            p + "ffn_norm.weight": 1 + 0.1 * rng.standard_normal(d),
            p + "attn_q.weight": rng.standard_normal((d, d)) / 8,
            p + "attn_k.weight": rng.standard_normal((hp["n_head_kv"] * hd, d)) / 8,
            p + "attn_v.weight": rng.standard_normal((hp["n_head_kv"] * hd, d)) / 8,
            p + "attn_output.weight": rng.standard_normal((d, d)) / 8,
            p + "ffn_gate.weight": rng.standard_normal((hp["n_ff"], d)) / 8,
            p + "ffn_up.weight": rng.standard_normal((hp["n_ff"], d)) / 8,
            p + "ffn_down.weight": rng.standard_normal((d, hp["n_ff"])) / 8,
        })
    llama = dict(base)
    qwen = dict(base)
    qwen_b = dict(base)
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        llama[p + "attn_q.weight"] = permute(base[p + "attn_q.weight"], hp["n_head"])
        llama[p + "attn_k.weight"] = permute(base[p + "attn_k.weight"], hp["n_head_kv"])
        for t, n in (("q", d), ("k", hp["n_head_kv"] * hd), ("v", hp["n_head_kv"] * hd)):
            qwen[p + f"attn_{t}.bias"] = np.zeros(n)
            qwen_b[p + f"attn_{t}.bias"] = rng.standard_normal(n) / 4
    qwen_q8 = dict(qwen_b)
    qwen_q8["output.weight"] = rng.standard_normal((hp["n_vocab"], d))
    paths = {}
    for name, arch, w, h in (("llama", "llama", llama, hp), ("qwen2", "qwen2", qwen, hp),
                             ("qwen2_bias", "qwen2", qwen_b, hp),
                             ("qwen2_q8", "qwen2", qwen_q8,
                              dict(hp, q8_0=("token_embd.weight", "output.weight")))):
        paths[name] = os.path.join(tmpdir, f"tiny_{name}.gguf")
        _write_tiny(paths[name], arch, w, h)
    ids = [3, 17, 4, 42, 8, 15, 23, 0, 49, 7]
    problems = []
    ml, mq, mb = Model(paths["llama"]), Model(paths["qwen2"]), Model(paths["qwen2_bias"])
    a, b, c = ml.forward(ids), mq.forward(ids), mb.forward(ids)
    if np.abs(a - b).max() > 1e-4 * np.abs(a).max():
        problems.append(f"llama/normal vs qwen2/neox differ by {np.abs(a - b).max():.3g}")
    if np.abs(b - c).max() < 1e-2 * np.abs(b).max():
        problems.append("qwen2 q/k/v biases have no effect")
    cache = mb.new_cache()
    step = np.concatenate([mb.forward([t], cache) for t in ids])
    if np.abs(step - c).max() > 1e-4 * np.abs(c).max():
        problems.append(f"KV-cache forward differs from batched by {np.abs(step - c).max():.3g}")
    whole, streamed = Model(paths["qwen2_q8"]), Model(paths["qwen2_q8"], stream=True)
    streamed.out_block_rows = 16  # several blocks, the last one partial
    if whole.tied or streamed.tied:
        problems.append("the Q8_0 model's separate output.weight was not found")
    e, f = whole.forward(ids), streamed.forward(ids)
    if np.abs(e - f).max() > 1e-5 * np.abs(e).max() or np.abs(e - c).max() < 1e-2 * np.abs(c).max():
        problems.append(f"stream=True differs from stream=False by {np.abs(e - f).max():.3g} "
                        f"(or output.weight was ignored)")
    # 5. lanes: one pass with (exact, emulated) == two separate passes.
    whole.emulate_llamacpp = True
    g = whole.forward(ids)
    lanes = streamed.forward_lanes([(ids, False), (ids[::-1], False), (ids, True)])
    lanes = [lanes[0], lanes[2]]
    if any(np.abs(a - b).max() > 1e-5 * np.abs(b).max() for a, b in zip(lanes, (e, g))):
        problems.append("forward_lanes differs from separate forward passes")
    if np.abs(g - e).max() < 1e-4 * np.abs(e).max():
        problems.append("emulate_llamacpp has no effect")
    return problems


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="numpy reference forward pass of a llama/qwen2 GGUF")
    ap.add_argument("model", nargs="?")
    ap.add_argument("--selftest", action="store_true",
                    help="check the reference on tiny synthetic llama/qwen2 models and exit")
    ap.add_argument("--ids", help="comma- or space-separated token ids")
    ap.add_argument("--out", help="write logits [n_tok, n_vocab] float32 to this .npy file")
    ap.add_argument("--greedy", type=int, default=0, help="print N greedy continuation ids")
    args = ap.parse_args(argv)
    if args.selftest:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            problems = selftest(tmp)
        print("selftest: " + ("; ".join(problems) if problems else "ok"))
        return 1 if problems else 0
    if not args.model or args.ids is None:
        ap.error("MODEL and --ids are required (or --selftest)")
    ids = [int(t) for t in args.ids.replace(",", " ").split()]
    m = load(args.model)
    if args.out:
        np.save(args.out, m.forward(ids))
    if args.greedy:
        print(",".join(str(t) for t in m.greedy(ids, args.greedy)))
    if not args.out and not args.greedy:
        logits = m.forward(ids)
        print("argmax per position:", ",".join(str(int(t)) for t in logits.argmax(-1)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
