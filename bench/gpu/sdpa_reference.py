#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention on an f16 full-rank cache: the peer
of bench_cuda_attention (issue #18: zack's compressed-cache decode attention
must be faster than it by at least 0.8x the ratio of bytes saved).

Same shapes as the bench: one decode token per sequence, `batch` sequences,
n_kv KV heads of dim 128 shared by n_group query heads each (GQA), ctx slots.
Reports time per call (CUDA events, best of 3 rounds of `reps` calls) and the
bandwidth over the bytes it must read (K and V in f16, the queries, the output).
Needs a GPU and torch (the GPU machine's image has both); never used by zack.

    python3 bench/gpu/sdpa_reference.py [--shape qwen2.5-1.5b|llama-8b]
        [--ctx 8192,16384,32768] [--batch 1,8,32] [--reps 20] [--json FILE]
"""
import argparse
import json
import sys

SHAPES = {"qwen2.5-1.5b": (2, 6), "llama-8b": (8, 4)}
D = 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(SHAPES))
    ap.add_argument("--ctx", default="8192,16384,32768")
    ap.add_argument("--batch", default="1,8,32")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        sys.exit("sdpa_reference: no CUDA device")
    n_kv, g = SHAPES[a.shape]
    dev = torch.device("cuda")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; shape {a.shape}: "
          f"{n_kv} KV heads x {g} query heads, head dim {D}, f16 cache")
    print(f"{'variant':<10} {'ctx':>6} {'batch':>5} {'us':>9} {'GB/s':>8}")
    rows = []
    for ctx in map(int, a.ctx.split(",")):
        for batch in map(int, a.batch.split(",")):
            k = torch.randn(batch, n_kv, ctx, D, device=dev, dtype=torch.float16)
            v = torch.randn_like(k)
            q = torch.randn(batch, n_kv * g, 1, D, device=dev, dtype=torch.float16)
            nbytes = 2 * (k.numel() + v.numel() + 2 * q.numel())
            variants = {
                # GQA in the kernel (no copy of K/V per query head)
                "gqa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                # the query heads of a KV head as rows of one query block: [B, n_kv, g, D]
                "grouped": lambda: F.scaled_dot_product_attention(q.view(batch, n_kv, g, D), k, v),
            }
            for name, fn in variants.items():
                try:
                    fn()
                except Exception as e:  # an older torch without enable_gqa
                    print(f"{name:<10} {ctx:>6} {batch:>5} not run: {e}")
                    continue
                torch.cuda.synchronize()
                best = 1e30
                for _ in range(3):
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    for _ in range(a.reps):
                        fn()
                    e.record()
                    torch.cuda.synchronize()
                    best = min(best, s.elapsed_time(e) * 1e3 / a.reps)
                gbs = nbytes / (best * 1e-6) / 1e9
                rows.append({"variant": name, "shape": a.shape, "ctx": ctx, "batch": batch, "us": best, "gbs": gbs})
                print(f"{name:<10} {ctx:>6} {batch:>5} {best:>9.1f} {gbs:>8.0f}", flush=True)
            del k, v, q
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": rows}, f, indent=1)


if __name__ == "__main__":
    main()
