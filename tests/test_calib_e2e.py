"""End to end: `zack calibrate` on the real default model and a small real corpus,
checked with numpy, the gguf Python package's dequantization and tests/ref/ref_gguf's
reader (independent of zack's; on the main .zack checked against gguf.GGUFReader):
every key and tensor, orthonormal rotations, descending spectra, the source's
SHA-256 (hashlib), the rank table against an independent implementation of the
removal-rate rule, the folded W_v / W_o against R_v and the source weights, the
untouched tensors byte for byte, --compare of a file with itself, the default
(generated) corpus, and clear one-line errors without a half-written file for bad
input."""
import hashlib
import shutil
import json
import os
import subprocess
import sys
import re
import tempfile

import numpy as np

try:
    import gguf
    from gguf.quants import dequantize
except ImportError:
    print("FAIL: the gguf python package is required (pip install gguf)")
    sys.exit(1)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "ref"))
# the files read by ref_gguf (gguf.GGUFReader takes 6 s a file here, parsing the vocabulary value by
# value); the written .zack is also read by gguf.GGUFReader once, which must read it the same
import ref_gguf  # noqa: E402

MODEL = os.environ.get("ZACK_MODEL", "")
ZACK = os.environ.get("ZACK_BIN", "")
SRC = os.environ.get("ZACK_SOURCE", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(SRC, "tests", "data", "calib", "apache-2.0.txt")
CORPUS2 = os.path.join(SRC, "tests", "data", "calib", "cc0-1.0.txt")

failures = []
_TMP_DIRS = []  # made by main(), removed at exit


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def field(r, key):
    """A metadata value of a ref_gguf.GGUFFile: numeric arrays as numpy arrays."""
    v = r.meta.get(key)
    if isinstance(v, list) and not (v and isinstance(v[0], str)):
        return np.array(v)
    return v


def deq(t):
    return dequantize(t.data, t.tensor_type).reshape(int(t.shape[-1]) if len(t.shape) == 2 else -1, -1)


def run(args, expect_ok=True):
    p = subprocess.run([ZACK, "calibrate", "-t", "2", "-q"] + args, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        print(p.stdout, p.stderr)
    return p


def rank_for_eps(s, eps):
    total = s.sum()
    r, tail = len(s), 0.0
    while r > 0 and tail + s[r - 1] <= eps * total:
        tail += s[r - 1]
        r -= 1
    return r


def main():
    for what, v in (("ZACK_MODEL", MODEL), ("ZACK_BIN", ZACK)):
        if not v or not os.path.exists(v):
            print(f"FAIL: {what} is not set or missing ({v!r}); run scripts/fetch_model.sh and build zack")
            return 1
    tmp = tempfile.mkdtemp(prefix="zack_calib_e2e_")
    _TMP_DIRS.append(tmp)
    out = os.path.join(tmp, "a.zack")
    # a short sensitivity pass (the plans below need its curves) and no rank-weight fit
    # (test_gemma_cli.py runs the fit through the CLI; test_alloc_model checks what it chooses)
    # 1024 tokens: 4 rows a centroid for the 8 x 256 value codebooks
    # the plan it records keeps KIVI keys for --kv-select (--kv-kivi-keys)
    # layer gains on one short window, at the recorded plan's target (256 tokens: at 512 they
    # were 75 of this calibration's 96 s; what they are worth is measured on the 1.5B)
    p = run(["-m", MODEL, "-o", out, "--corpus", CORPUS, "--tokens", "1024", "--ctx", "256", "--sens-tokens", "256",
             "--fit-tokens", "0", "--gain-tokens", "256", "--kv-target", "0.2", "--kv-kivi-keys"])
    check(p.returncode == 0, f"calibrate exits 0 (got {p.returncode}: {p.stderr.strip()[-300:]})")
    if p.returncode != 0:
        return 1
    m = re.search(r"(\d+) of (\d+) layers cost other than .* \(plan 0\.200, KLD ([0-9.]+) over 256 tokens\)", p.stderr)
    check(m is not None, f"calibrate reports the layer gains at plan 0.2 on 256 tokens: {p.stderr.strip()[-300:]}")
    check("90%" in p.stdout and "eps" in p.stdout, "summary printed on stdout")

    src = ref_gguf.open_file(MODEL)
    z = ref_gguf.open_file(out)
    for d in ref_gguf.differences_from_gguf(out, z):
        check(False, f"the written .zack read by gguf.GGUFReader: {d}")
    L = int(field(src, "llama.block_count"))
    H = int(field(src, "llama.attention.head_count"))
    KV = int(field(src, "llama.attention.head_count_kv"))
    E = int(field(src, "llama.embedding_length"))
    D = E // H
    G = H // KV

    # keys
    for k in src.meta:
        check(k in z.meta, f"source key {k} kept")
    for k in ("general.architecture", "general.name", "llama.rope.freq_base", "tokenizer.ggml.model"):
        check(field(z, k) == field(src, k), f"key {k} unchanged")
    check(int(field(z, "zack.version")) == 1, "zack.version = 1")
    check(field(z, "zack.source.name") == os.path.basename(MODEL), "zack.source.name")
    with open(MODEL, "rb") as f:
        want_sha = hashlib.sha256(f.read()).hexdigest()
    check(field(z, "zack.source.sha256") == want_sha, "zack.source.sha256 matches hashlib")
    check(int(field(z, "zack.calib.tokens")) == 1024, "zack.calib.tokens = 1024")
    check("apache-2.0.txt" in field(z, "zack.calib.corpus"), "zack.calib.corpus names the file")
    align = int(field(z, "zack.rank_align"))
    check(align == 4, "zack.rank_align = 4")

    # rotations and spectra
    sig_k = np.zeros((L, KV, D))
    sig_v = np.zeros((L, KV, D))
    rv = np.zeros((L, KV, D, D))
    for il in range(L):
        for name, shape in (("rqk", [D, D, KV]), ("rv", [D, D, KV]), ("sigma_k", [D, KV]), ("sigma_v", [D, KV])):
            t = z.tensor(f"blk.{il}.zack.{name}")
            check(t is not None and list(t.shape) == shape and t.tensor_type == gguf.GGMLQuantizationType.F32,
                  f"blk.{il}.zack.{name} F32 {shape}")
        for name in ("rqk", "rv"):
            R = np.asarray(z.tensor(f"blk.{il}.zack.{name}").data, dtype=np.float64).reshape(KV, D, D)
            for g in range(KV):
                err = np.abs(R[g].T @ R[g] - np.eye(D)).max()
                check(err < 1e-5, f"layer {il} head {g} {name} orthonormal (err {err:.1e})")
            if name == "rv":
                rv[il] = R
        sig_k[il] = np.asarray(z.tensor(f"blk.{il}.zack.sigma_k").data).reshape(KV, D)
        sig_v[il] = np.asarray(z.tensor(f"blk.{il}.zack.sigma_v").data).reshape(KV, D)
        # the key quantization pair (calib/keybasis.h keybasis_quant_pair): kwa kwb^T = I, its proxy descending
        for name, shape in (("kwa", [D, D, KV]), ("kwb", [D, D, KV]), ("kwscore", [D, KV])):
            t = z.tensor(f"blk.{il}.zack.{name}")
            check(t is not None and list(t.shape) == shape and t.tensor_type == gguf.GGMLQuantizationType.F32,
                  f"blk.{il}.zack.{name} F32 {shape}")
        A = np.asarray(z.tensor(f"blk.{il}.zack.kwa").data, dtype=np.float64).reshape(KV, D, D)
        B = np.asarray(z.tensor(f"blk.{il}.zack.kwb").data, dtype=np.float64).reshape(KV, D, D)
        ws = np.asarray(z.tensor(f"blk.{il}.zack.kwscore").data, dtype=np.float64).reshape(KV, D)
        for g in range(KV):
            err = np.abs(A[g] @ B[g].T - np.eye(D)).max()
            check(err < 1e-3, f"layer {il} head {g} kwa kwb^T = I (err {err:.1e})")
        check((ws >= 0).all() and (np.diff(ws, axis=-1) <= 0).all(), f"layer {il} kwscore non-negative, descending")
    for name, s in (("sigma_k", sig_k), ("sigma_v", sig_v)):
        check((s >= 0).all() and (np.diff(s, axis=-1) <= 0).all(), f"{name} non-negative and descending")
        check(s[..., 0].min() > 0, f"{name} largest value positive")

    # rank table vs an independent implementation of the eps rule
    rates = field(z, "zack.rank_table.rates")
    tk = field(z, "zack.rank_table.k").reshape(len(rates), L, KV)
    tv = field(z, "zack.rank_table.v").reshape(len(rates), L, KV)
    check(len(rates) >= 5 and abs(rates[0]) < 1e-9, f"rank table rates {list(rates)}")
    step = align / (2 * D * L * KV)
    for i, rate in enumerate(rates):
        k, v = tk[i], tv[i]
        got = 1 - (k.sum() + v.sum()) / (2 * D * L * KV)
        check(((k % align) == 0).all() and ((v % align) == 0).all() and k.min() >= align and k.max() <= D,
              f"rate {rate:.1f}: ranks aligned and in range")
        check(rate - 1e-6 <= got <= rate + 4 * step, f"rate {rate:.1f}: achieved {got:.4f}")

        # smallest eps reaching the rate, found by our own bisection in numpy
        def ranks(eps):
            a = lambda s: min(D, max(align, -(-rank_for_eps(s, eps) // align) * align))
            return (np.array([[a(sig_k[l, g]) for g in range(KV)] for l in range(L)]),
                    np.array([[a(sig_v[l, g]) for g in range(KV)] for l in range(L)]))
        lo, hi = 0.0, np.nextafter(1.0, 0)
        if 1 - sum(x.sum() for x in ranks(0.0)) / (2 * D * L * KV) >= rate:
            hi = 0.0
        else:
            for _ in range(40):
                mid = (lo + hi) / 2
                if 1 - sum(x.sum() for x in ranks(mid)) / (2 * D * L * KV) >= rate:
                    hi = mid
                else:
                    lo = mid
        rk, rv_ = ranks(hi)
        check((rk == k).all() and (rv_ == v).all(), f"rate {rate:.1f}: ranks equal the numpy reference")
        if i > 0:
            check((k <= tk[i - 1]).all() and (v <= tv[i - 1]).all(), f"rate {rate:.1f}: ranks shrink with rate")

    # folded weights: W_v,g <- R^T W_v,g ; W_o[:, head i] <- W_o[:, head i] R_g
    for il in (0, L // 2, L - 1):
        wv_s = deq(src.tensor(f"blk.{il}.attn_v.weight"))   # [KV*D, E]
        wo_s = deq(src.tensor(f"blk.{il}.attn_output.weight"))  # [E, H*D]
        tv_z = z.tensor(f"blk.{il}.attn_v.weight")
        check(tv_z.tensor_type == gguf.GGMLQuantizationType.Q8_0, "folded Q4_1 W_v stored as Q8_0")
        wv_z = deq(tv_z)
        wo_z = deq(z.tensor(f"blk.{il}.attn_output.weight"))
        want_v = np.concatenate([rv[il, g].T @ wv_s[g * D:(g + 1) * D] for g in range(KV)])
        want_o = np.concatenate([wo_s[:, i * D:(i + 1) * D] @ rv[il, i // G] for i in range(H)], axis=1)
        ev = np.abs(wv_z - want_v).max() / np.abs(want_v).max()
        eo = np.abs(wo_z - want_o).max() / np.abs(want_o).max()
        check(ev < 1e-2 and eo < 1e-2, f"layer {il}: folded W_v / W_o match R (rel err {ev:.1e}, {eo:.1e})")
        # attention output invariance at full rank, random inputs and attention weights
        rng = np.random.default_rng(il)
        X = rng.standard_normal((7, E))
        A = rng.random((H, 7, 7))
        A /= A.sum(-1, keepdims=True)

        def attn(wv, wo):
            v = X @ wv.T  # [T, KV*D]
            o = np.concatenate([A[i] @ v[:, (i // G) * D:(i // G + 1) * D] for i in range(H)], axis=1)
            return o @ wo.T
        ref, got = attn(wv_s, wo_s), attn(wv_z, wo_z)
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        check(rel < 3e-2, f"layer {il}: attention output unchanged at full rank (rel err {rel:.1e})")
    # every other tensor is copied byte for byte
    folded = {f"blk.{il}.{n}.weight" for il in range(L) for n in ("attn_v", "attn_output")}
    for t in src.tensors:
        if t.name in folded:
            continue
        u = z.tensor(t.name)
        check(u is not None and u.tensor_type == t.tensor_type and np.array_equal(np.asarray(u.data), np.asarray(t.data)),
              f"tensor {t.name} unchanged")

    # --compare: a file against itself is 0; against another corpus small but not 0
    p = subprocess.run([ZACK, "calibrate", "-m", out, "--compare", out], capture_output=True, text=True)
    check(p.returncode == 0 and "K distance mean 0.00000 max 0.00000; V distance mean 0.00000 max 0.00000" in p.stdout,
          f"--compare self is 0: {p.stdout.strip().splitlines()[-1:] if p.stdout else p.stderr}")
    out2 = os.path.join(tmp, "b.zack")
    p = run(["-m", MODEL, "-o", out2, "--corpus", CORPUS2, "--tokens", "256", "--ctx", "256", "--sens-tokens", "0",
             "--compare", out])
    check(p.returncode == 0 and "Rotation stability" in p.stdout, "calibrate + --compare in one run")
    if p.returncode == 0:
        print("compare apache vs cc0 (512 / 256 tokens):", p.stdout.strip().splitlines()[-1])
    # the statistics pass spreads --tokens over every --corpus file: cc0 alone holds 512 tokens,
    # yet cc0 then apache gives other rotations than cc0 alone
    out3, out4 = os.path.join(tmp, "c.zack"), os.path.join(tmp, "d.zack")
    p = run(["-m", MODEL, "-o", out4, "--corpus", CORPUS2, "--tokens", "512", "--ctx", "256", "--sens-tokens", "0",
             "--fit-tokens", "0", "--value-codes", "0"])
    check(p.returncode == 0, f"calibrate on cc0 alone: {p.stderr.strip()[-200:]}")
    p = run(["-m", MODEL, "-o", out3, "--corpus", CORPUS2, "--corpus", CORPUS, "--tokens", "512", "--ctx", "256",
             "--sens-tokens", "0", "--fit-tokens", "0", "--value-codes", "0", "--compare", out4])
    dist = re.search(r"K distance mean ([0-9.]+)", p.stdout) if p.returncode == 0 else None
    check(dist is not None and float(dist.group(1)) > 0.01,
          f"two corpora share the statistics pass: {p.stdout.strip().splitlines()[-1:] if p.stdout else p.stderr}")

    # zack run on the .zack: compressed attention through the CLI, with accounting
    for rate in ("0.3", "0.5"):
        p = subprocess.run([ZACK, "run", "-m", out, "--kv-rate", rate, "-p", "The capital of France is", "--raw",
                            "-n", "8", "--temp", "0", "-v"], capture_output=True, text=True)
        check(p.returncode == 0 and p.stdout.strip() and "% of an f16 full-rank cache" in p.stderr,
              f"run --kv-rate {rate}: output {p.stdout.strip()!r}")
        removed = [l for l in p.stderr.splitlines() if "of K/V dims removed" in l]
        if removed:
            pct = float(removed[0].split("(")[1].split("%")[0])
            check(abs(pct / 100 - float(rate)) < 0.07, f"run --kv-rate {rate}: {pct}% of K/V dims removed")
    p = subprocess.run([ZACK, "bench", "-m", out, "-p", "8", "-n", "4", "-r", "1", "--kv-rate", "-1,0.5", "-o", "json"],
                       capture_output=True, text=True)
    if p.returncode == 0:
        res = json.loads(p.stdout)["results"]
        full, half = [r for r in res if r["test"] == "tg4"]
        check(half["kv_bytes_per_token"] < 0.6 * full["kv_bytes_per_token"],
              f"bench --kv-rate 0.5 holds fewer KV bytes ({half['kv_bytes_per_token']} vs {full['kv_bytes_per_token']})")
    else:
        check(False, f"bench --kv-rate: {p.stderr.strip()}")
    # bench takes every --kv-* flag of run: the rank, sink and plan flags on a sweep
    p = subprocess.run([ZACK, "bench", "-m", out, "-p", "0", "-n", "2", "-r", "1", "--kv-rate", "-1,0.5", "--kv-alloc",
                        "uniform", "--kv-sinks", "8", "--kv-target", "0.3", "--kv-rank-weight", "3", "-o", "json"],
                       capture_output=True, text=True)
    if p.returncode == 0:
        res = json.loads(p.stdout)["results"]
        kvs = [r["kv"] for r in res]
        check(kvs == ["f16 sinks8", "f16 zack0.50 uniform sinks8", "plan t0.3 sinks8"], f"bench shared KV flags: {kvs}")
        b = [r["kv_bytes_per_token"] for r in res]
        check(len(b) == 3 and b[1] < 0.6 * b[0] and b[2] < 0.35 * b[0], f"bench: rate and plan bytes/token {b}")
    else:
        check(False, f"bench with the shared KV flags: {p.stderr.strip()}")
    # plans alone run alone; a sweep flag given explicitly adds its configurations
    for extra, want in [([], ["plan t0.3"]), (["--kv-bits", "16"], ["f16", "plan t0.3"])]:
        p = subprocess.run([ZACK, "bench", "-m", out, "-p", "0", "-n", "1", "-r", "1", "--kv-target", "0.3", *extra,
                            "-o", "json"], capture_output=True, text=True)
        kvs = [r["kv"] for r in json.loads(p.stdout)["results"]] if p.returncode == 0 else p.stderr.strip()
        check(kvs == want, f"bench --kv-target 0.3 {extra}: {kvs}")
    for args, needle in [(["--kv-alloc", "uniform"], "needs --kv-rate"), (["--kv-rank-weight", "3"], "goes with"),
                         (["--kv-crush", "0.5"], "crush"), (["--kv-target", "0.3", "--kv-rank-weight", "0"], "positive")]:
        p = subprocess.run([ZACK, "bench", "-m", out, "-p", "8", "-n", "0", "-r", "1", *args], capture_output=True,
                           text=True)
        check(p.returncode != 0 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1,
              f"bench {args}: {p.stderr.strip()!r}")
    for args, needle in [(["--kv-rate", "1.2"], "rate"), (["--kv-eps", "0.1", "--kv-rate", "0.2"], "not both"),
                         (["--kv-rate", "-0.5"], "rate"), (["--kv-rank-weight", "3"], "goes with --kv-target"),
                         (["--kv-target", "0.3", "--kv-rank-weight", "-2"], "must be positive")]:
        p = subprocess.run([ZACK, "run", "-m", out, "-p", "hi", *args], capture_output=True, text=True)
        check(p.returncode != 0 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1,
              f"run {args}: {p.stderr.strip()!r}")
    # plans for decode-time selection: every head's keys in 4- or 2-bit KIVI codes, recorded by
    # calibrate --kv-kivi-keys (above) or predicted for --kv-target with --kv-select
    recorded = [json.loads(x) for x in z.meta["zack.plans"]]
    check(len(recorded) == 1 and max(recorded[0]["bits_k"]) <= 4 and "--kv-kivi-keys" in recorded[0]["source"],
          f"calibrate --kv-kivi-keys records a plan with KIVI keys: {[(r.get('bits_k'), r['source']) for r in recorded]}")
    def plan_keys(args):
        p = subprocess.run([ZACK, "run", "-m", out, "-p", "hi", "-n", "1", "--temp", "0", "-v", *args],
                           capture_output=True, text=True)
        line = [l for l in p.stderr.splitlines() if "KV plan: per head K" in l]
        check(p.returncode == 0 and len(line) == 1, f"run {args}: {p.stderr.strip()[-200:]!r}")
        return line[0].split(" K ")[1].split(";")[0] if line else ""
    free, sel = plan_keys(["--kv-target", "0.3"]), plan_keys(["--kv-target", "0.3", "--kv-select", "64"])
    print(f"plan 0.3 keys: {free}; with --kv-select 64: {sel}")
    check(sel and "16-bit" not in sel and "8-bit" not in sel, f"--kv-target with --kv-select plans KIVI keys: {sel}")
    p = run(["-m", MODEL, "-o", os.path.join(tmp, "e.zack"), "--corpus", CORPUS, "--kv-kivi-keys"])
    check(p.returncode != 0 and "goes with --kv-target" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          f"calibrate --kv-kivi-keys alone: {p.stderr.strip()!r}")
    # a plan that cannot fit is refused once the sensitivity pass has measured the heads' options,
    # before the layer gains (and the rank-weight fit) run: no gains line, no output file
    listed = sorted(os.listdir(tmp))
    for flags, what in ((["--kv-target", "0.3,0.01"], "--kv-target 0.01: no plan fits 1.0%"),
                        (["--gain-target", "0.015"], "--gain-target 0.015: no plan fits 1.5%")):
        o = os.path.join(tmp, "f.zack")
        p = run(["-m", MODEL, "-o", o, "--corpus", CORPUS, "--tokens", "256", "--ctx", "256", "--sens-tokens", "256",
                 "--fit-tokens", "0", "--gain-tokens", "256", "--value-codes", "0", *flags])
        err = p.stderr.strip().splitlines()
        check(p.returncode != 0 and err and err[-1].startswith("zack: error: " + what) and "layers cost" not in
              p.stderr and sorted(os.listdir(tmp)) == listed, f"calibrate {flags}: {p.stderr.strip()[-300:]!r}")
    p = subprocess.run([ZACK, "run", "-m", MODEL, "-p", "hi", "--kv-rate", "0.5"], capture_output=True, text=True)
    check(p.returncode != 0 and ".zack" in p.stderr, f"--kv-rate on a plain GGUF is refused: {p.stderr.strip()!r}")

    # value codebooks per (layer, KV head), gains per channel: 4 channels x 64 centroids for
    # value precision 1 (zack.vq), 8 x 256 for precision 0 (zack.vq0); and the sensitivity
    # table measuring vector-coded values at both precisions with quantized keys
    for name, C, K in (("vq", 4, 64), ("vq0", 8, 256)):
        check(int(field(z, f"zack.{name}.dim")) == C and int(field(z, f"zack.{name}.size")) == K,
              f"zack.{name}.dim {C}, zack.{name}.size {K}")
        for il in range(L):
            t, tg = z.tensor(f"blk.{il}.zack.{name}"), z.tensor(f"blk.{il}.zack.{name}_gain")
            check(t is not None and list(t.shape) == [C, K, D // C, KV], f"blk.{il}.zack.{name} [{C}, {K}, {D // C}, {KV}]")
            check(tg is not None and list(tg.shape) == [D, KV], f"blk.{il}.zack.{name}_gain [{D}, {KV}]")
            if t is None or tg is None:
                continue
            cb = np.asarray(t.data, dtype=np.float64).reshape(KV, D // C, K, C)
            gain = np.asarray(tg.data, dtype=np.float64)
            # centroids of unit-RMS rows: finite, distinct within a group, and about unit RMS overall
            check(np.isfinite(cb).all() and 0.2 < np.sqrt((cb ** 2).mean()) < 3, f"layer {il} {name} codebooks at unit RMS")
            check(all(len(np.unique(cb[g, q], axis=0)) > K // 2 for g in range(KV) for q in range(D // C)),
                  f"layer {il} {name} codebooks have distinct centroids")
            # the codes shrink rows towards their cell centres; the gains undo it (>= 1 on average)
            check(((gain >= 0.25) & (gain <= 4)).all() and gain.mean() > 1.0,
                  f"layer {il} {name} gains in range ({gain.mean():.3f})")
    gains = np.asarray(field(z, "zack.sens.layer_gain"), dtype=np.float64)
    check(gains.shape == (L,) and ((gains >= 0.25) & (gains <= 8)).all(), f"zack.sens.layer_gain: {L} gains in [1/4, 8]")
    if m:
        check(int(m.group(2)) == L and int(m.group(1)) == int((gains != 1).sum()),
              f"the gains that are not 1 are the layers reported ({m.group(1)} of {m.group(2)})")
    qb = list(field(z, "zack.sens.qbits"))
    q = np.asarray(field(z, "zack.sens.q"), dtype=np.float64).reshape(len(qb), len(qb), L * KV)
    for code in (1, 0):
        iv = qb.index(code)
        check(all(np.isfinite(q[qb.index(b), iv]).all() for b in (8, 4, 2, 1, 0)) and np.isnan(q[0, iv]).all(),
              f"zack.sens.q measures vector-coded values (precision {code}) with 8/4/2-bit and tailed keys")
    # end to end on text the calibration never saw: every value head vector-coded (1.625 bits
    # an element plus the residual window) loses less KL than every value head at 2 bits
    base = os.path.join(tmp, "base.bin")
    p = subprocess.run([ZACK, "eval", "-m", out, "--task", "ppl", "-f", CORPUS2, "-c", "512", "--limit", "2", "-t", "2",
                        "-q", "--kl-divergence-base", base], capture_output=True, text=True)
    check(p.returncode == 0, f"eval baseline for the value codes: {p.stderr.strip()[-200:]}")
    kld = {}
    for bv in (1, 0, 2):
        plan = {"zack_plan": 2, "model": {"source_sha256": "", "n_layer": L, "n_kv": KV, "head_dim": D}, "bits": 16,
                "bits_k": [16] * (L * KV), "bits_v": [bv] * (L * KV), "ranks_k": [], "ranks_v": [], "evict": "none",
                "budget": 0}
        pf = os.path.join(tmp, f"values{bv}.json")
        with open(pf, "w") as f:
            json.dump(plan, f)
        js = os.path.join(tmp, f"values{bv}.eval.json")
        p = subprocess.run([ZACK, "eval", "-m", out, "--task", "ppl", "--kl-divergence-base", base, "--kl-divergence",
                            "-t", "2", "-q", "--kv-plan", pf, "--json", js], capture_output=True, text=True)
        check(p.returncode == 0, f"eval --kv-plan with {bv}-bit values: {p.stderr.strip()[-200:]}")
        if p.returncode == 0:
            r = json.load(open(js))["runs"][0]
            kld[bv] = (r["detail"]["vs_baseline"]["kld_mean"], r["kv"]["bytes_per_token"])
    if len(kld) == 3:
        (k1, b1), (k0, b0), (k2, b2) = kld[1], kld[0], kld[2]
        print(f"values coded 4 x 64: KLD {k1:.4f} at {b1} bytes/token; 8 x 256: {k0:.4f} at {b0}; 2-bit: {k2:.4f} at {b2}")
        check(k1 < k2 and b1 < b2, f"vector-coded values: KLD {k1:.4f} at {b1} bytes/token, 2-bit {k2:.4f} at {b2}")
        # the 8 x 256 books: fewer bytes than the 4 x 64 ones, and more KL
        check(b0 < b1 and k1 < k0, f"8 x 256 codes: KLD {k0:.4f} at {b0} bytes/token, 4 x 64 {k1:.4f} at {b1}")
    # a plan's tier ("tier": tokens, as `eval --target --kv-tier N --plan-out` writes it): --kv-plan
    # runs it as --kv-tier does on the same plan without it (the same KL, the same held bytes,
    # above the plan's alone at the same per-token bytes), and another --kv-tier is refused in one line
    tiered = {}
    for name, tier, extra in (("plain", 0, []), ("flag", 0, ["--kv-tier", "64"]), ("file", 64, [])):
        pt = dict(plan, bits_k=[4] * (L * KV), bits_v=[2] * (L * KV))
        if tier:
            pt["tier"] = tier
        pf = os.path.join(tmp, f"tier_{name}.json")
        with open(pf, "w") as f:
            json.dump(pt, f)
        js = os.path.join(tmp, f"tier_{name}.eval.json")
        p = subprocess.run([ZACK, "eval", "-m", out, "--task", "ppl", "--kl-divergence-base", base, "--kl-divergence",
                            "-t", "2", "-q", "--kv-plan", pf, "--json", js] + extra, capture_output=True, text=True)
        check(p.returncode == 0, f"eval --kv-plan with a tier ({name}): {p.stderr.strip()[-200:]}")
        if p.returncode == 0:
            r = json.load(open(js))["runs"][0]
            tiered[name] = (r["detail"]["vs_baseline"]["kld_mean"], r["kv"]["fraction_of_f16"],
                            r["kv"]["held_fraction_of_f16"], r["session"].get("kv_tier", 0))
    if len(tiered) == 3:
        print(f"a plan's tier: {tiered}")
        check(tiered["file"] == tiered["flag"] and tiered["file"][3] == 64,
              f"a plan's tier runs as --kv-tier: {tiered['file']} vs {tiered['flag']}")
        check(tiered["file"][1] == tiered["plain"][1] and tiered["file"][2] > tiered["plain"][2]
              and tiered["file"][0] < tiered["plain"][0],
              f"a plan's tier: less KL at the same per-token bytes, more held: {tiered}")
    p = subprocess.run([ZACK, "run", "-m", out, "-p", "hi", "-n", "1", "--kv-plan", os.path.join(tmp, "tier_file.json"),
                        "--kv-tier", "128"], capture_output=True, text=True)
    check(p.returncode != 0 and "--kv-tier 128" in p.stderr and "sets a tier of 64 tokens" in p.stderr
          and len(p.stderr.strip().splitlines()) == 1, f"--kv-tier against a plan's tier refused: {p.stderr.strip()!r}")
    p = subprocess.run([ZACK, "bench", "-m", out, "-p", "0", "-n", "1", "-r", "1", "--kv-plan",
                        os.path.join(tmp, "tier_file.json"), "-o", "json"], capture_output=True, text=True)
    kvs = [r["kv"] for r in json.loads(p.stdout)["results"]] if p.returncode == 0 else p.stderr.strip()
    check(isinstance(kvs, list) and len(kvs) == 1 and kvs[0].endswith(" tier64"), f"bench labels a plan's tier: {kvs}")
    # --target with --plan-out writes the smallest passing configuration as a plan file, its tier
    # included, and --kv-plan runs that file as the search measured it
    po = os.path.join(tmp, "best.json")
    js = os.path.join(tmp, "best.eval.json")
    p = subprocess.run([ZACK, "eval", "-m", out, "--task", "ppl", "-f", CORPUS2, "-c", "512", "--limit", "2", "-t", "2",
                        "-q", "--target", "0.9", "--methods", "plan", "--steps", "2", "--kv-tier", "64",
                        "--plan-out", po, "--json", js], capture_output=True, text=True)
    check(p.returncode == 0 and os.path.exists(po), f"eval --target --plan-out: {p.stderr.strip()[-300:]}")
    check("every configuration but the baseline: --kv-tier 64\n" in p.stdout,
          f"eval's table names the flags a search shares: {p.stdout[:300]!r}")
    if p.returncode == 0 and os.path.exists(po):
        best = json.load(open(po))
        runs = [r for r in json.load(open(js))["runs"] if "session" in r]  # (plans that do not fit: errors)
        check(best.get("tier") == 64 and runs and all(r["session"].get("kv_tier") == 64 for r in runs),
              f"--plan-out records the search's tier: {best.get('tier')}, {[r['session'].get('kv_tier') for r in runs]}")
        js2 = os.path.join(tmp, "best.rerun.json")
        p = subprocess.run([ZACK, "eval", "-m", out, "--task", "ppl", "-f", CORPUS2, "-c", "512", "--limit", "2", "-t", "2",
                            "-q", "--kv-plan", po, "--json", js2], capture_output=True, text=True)
        check(p.returncode == 0, f"eval --kv-plan of a --plan-out file: {p.stderr.strip()[-300:]}")
        if p.returncode == 0:
            r = json.load(open(js2))["runs"][0]
            kept = [x for x in runs if abs(x["kv"]["fraction_of_f16"] - r["kv"]["fraction_of_f16"]) < 1e-9
                    and x["retention"] == r["retention"]]
            check(r["session"].get("kv_tier") == 64 and r["retention"] >= 0.9 and len(kept) >= 1,
                  f"the --plan-out file reruns as measured: {r['kv']}, {r['retention']}")
    # plan+tier searches plans and 4-bit tiers (1/4, 1/8, 1/16 of the 512-token items) jointly:
    # each family's runs carry its tier, and the smallest passing configuration is the one that
    # holds least at the context (not the least a token: a tier is a fixed cost), written by --plan-out
    po3 = os.path.join(tmp, "tiers.json")
    js3 = os.path.join(tmp, "tiers.eval.json")
    p = subprocess.run([ZACK, "eval", "-m", out, "--task", "ppl", "-f", CORPUS2, "-c", "512", "--limit", "2", "-t", "2",
                        "-q", "--target", "0.9", "--methods", "plan+tier", "--steps", "1", "--plan-out", po3,
                        "--json", js3], capture_output=True, text=True)
    check(p.returncode == 0, f"eval --methods plan+tier: {p.stderr.strip()[-300:]}")
    if p.returncode == 0:
        rep = json.load(open(js3))
        fams = {t["method"]: t for t in rep["targets"]}
        check(sorted(fams) == ["plan+tier 128", "plan+tier 32", "plan+tier 64"], f"plan+tier's families: {sorted(fams)}")
        ran = [r for r in rep["runs"] if "session" in r and r["retention"] is not None]
        check(ran and all(r["session"].get("kv_tier") == int(r["config"]["method"].split()[-1]) for r in ran),
              f"each family's runs carry its tier: {[(r['config']['method'], r['session'].get('kv_tier')) for r in ran]}")
        passing = [r for r in ran if r["retention"] >= 0.9]
        best = rep["smallest_passing"]
        check(passing and best and best["kv"]["held_fraction_of_f16"] == min(r["kv"]["held_fraction_of_f16"] for r in passing),
              f"the smallest passing holds least: {best and best['kv']}, {[r['kv'] for r in passing]}")
        check(os.path.exists(po3) and best and json.load(open(po3)).get("tier") == best["session"]["kv_tier"],
              f"--plan-out records the chosen tier: {best and best['session'].get('kv_tier')}")
        check("smallest configuration keeping >= 90.0%: held " in p.stdout,
              f"the table names what the smallest holds: {p.stdout[-400:]!r}")
    p = subprocess.run([ZACK, "eval", "-m", out, "--task", "ppl", "-f", CORPUS2, "-c", "512", "--limit", "2", "-t", "2",
                        "-q", "--target", "0.9", "--methods", "plan+tier", "--kv-tier", "64"], capture_output=True,
                       text=True)
    check(p.returncode != 0 and "plan+tier" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          f"--kv-tier with plan+tier refused in one line: {p.stderr.strip()!r}")
    # keys are never vector-coded: a plan that asks is refused in one line
    plan["bits_k"] = [1] * (L * KV)
    with open(pf, "w") as f:
        json.dump(plan, f)
    p = subprocess.run([ZACK, "run", "-m", out, "-p", "hi", "-n", "1", "--kv-plan", pf], capture_output=True, text=True)
    check(p.returncode != 0 and "key precision" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          f"vector-coded keys refused: {p.stderr.strip()!r}")
    # GEAR is not a plan option: one line that says so (not a request for --kv-bits, which plans refuse)
    p = subprocess.run([ZACK, "run", "-m", out, "-p", "hi", "-n", "1", "--kv-target", "0.3", "--kv-gear"],
                       capture_output=True, text=True)
    check(p.returncode != 0 and p.stderr.strip().startswith("zack: error: --kv-gear does not combine with a KV plan")
          and len(p.stderr.strip().splitlines()) == 1, f"--kv-gear with a plan refused: {p.stderr.strip()!r}")

    # KIVI groups of 64 tokens: calibrate --kv-group 64 measures the losses and makes the plans for
    # them (zack.sens.group, the plan's "group"); a session takes the group from its plan, runs the
    # plan's bytes, and refuses another --kv-group with it in one line; --kv-target with --kv-group
    # plans for that group on any .zack
    o64 = os.path.join(tmp, "g64.zack")
    p = run(["-m", MODEL, "-o", o64, "--corpus", CORPUS, "--tokens", "256", "--ctx", "256", "--sens-tokens", "256",
             "--fit-tokens", "0", "--gain-tokens", "0", "--value-codes", "0", "--kv-target", "0.25", "--kv-group", "64"])
    check(p.returncode == 0 and "KIVI groups of 64 tokens" in p.stderr,
          f"calibrate --kv-group 64: {p.stderr.strip()[-300:]}")
    if p.returncode == 0:
        z64 = ref_gguf.open_file(o64)
        check(int(field(z64, "zack.sens.group")) == 64, "zack.sens.group = 64")
        rec = [json.loads(x) for x in z64.meta["zack.plans"]]
        check(len(rec) == 1 and rec[0].get("group") == 64, f"the recorded plan is for groups of 64: {rec}")
        js = os.path.join(tmp, "g64.eval.json")
        p = subprocess.run([ZACK, "eval", "-m", o64, "--task", "ppl", "-f", CORPUS2, "-c", "128", "--limit", "1", "-t",
                            "2", "-q", "--kv-plan", "0.25", "--json", js], capture_output=True, text=True)
        check(p.returncode == 0, f"eval --kv-plan 0.25 on the groups-of-64 file: {p.stderr.strip()[-200:]}")
        if p.returncode == 0 and rec:
            got = json.load(open(js))["runs"][0]["kv"]["bytes_per_token"]
            # eval reports whole bytes, rounded up (kv_cache::bytes_per_token)
            want = rec[0]["kv_fraction"] * L * KV * 4 * D
            check(want - 1e-6 <= got < want + 1,
                  f"the session holds the plan's bytes at groups of 64: {got} vs {want:.2f} rounded up")
        p = subprocess.run([ZACK, "run", "-m", o64, "-p", "hi", "-n", "1", "--kv-plan", "0.25", "--kv-group", "32"],
                           capture_output=True, text=True)
        check(p.returncode != 0 and "is for KIVI groups of 64 tokens" in p.stderr and
              len(p.stderr.strip().splitlines()) == 1, f"--kv-group against the plan's: {p.stderr.strip()!r}")
    p = subprocess.run([ZACK, "run", "-m", out, "-p", "hi", "-n", "1", "--temp", "0", "-v", "--kv-target", "0.3",
                        "--kv-group", "64"], capture_output=True, text=True)
    check(p.returncode == 0 and "KIVI groups of 64 tokens, ZACK rate" in p.stderr,
          f"--kv-target with --kv-group 64: {p.stderr.strip()[-200:]!r}")
    p = subprocess.run([ZACK, "run", "-m", out, "-p", "hi", "-n", "1", "--kv-target", "0.3", "--kv-group", "48"],
                       capture_output=True, text=True)
    check(p.returncode != 0 and "groups of 48 tokens" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
          f"--kv-target with --kv-group 48: {p.stderr.strip()!r}")
    p = run(["-m", MODEL, "-o", os.path.join(tmp, "g48.zack"), "--corpus", CORPUS, "--kv-group", "48"])
    check(p.returncode != 0 and "--kv-group" in p.stderr and not os.path.exists(os.path.join(tmp, "g48.zack")),
          f"calibrate --kv-group 48 refused: {p.stderr.strip()!r}")

    # default corpus: generated text, reproducible with the same seed
    outs = []
    for i in range(2):
        o = os.path.join(tmp, f"gen{i}.zack")
        txt = os.path.join(tmp, f"gen{i}.txt")
        p = run(["-m", MODEL, "-o", o, "--tokens", "96", "--ctx", "64", "--sens-tokens", "0", "--save-corpus", txt])
        check(p.returncode == 0, f"default-corpus calibration exits 0 ({p.stderr.strip()[-200:]})")
        outs.append((o, txt))
    if all(os.path.exists(t) for _, t in outs):
        a, b = (open(t, encoding="utf-8", errors="replace").read() for _, t in outs)
        check(a == b and len(a) > 100, "generated corpus is reproducible")
        g = ref_gguf.open_file(outs[0][0])
        desc = field(g, "zack.calib.corpus")
        check("generated" in desc and "temp 1 " in desc and "up to 256 tokens" in desc,
              f"zack.calib.corpus describes the generated corpus and its sampler: {desc!r}")
        # the samples are calibrated as one joined text, exactly what --save-corpus wrote:
        # that file as --corpus gives the same statistics, so the same rotations
        o3 = os.path.join(tmp, "gen_again.zack")
        p = run(["-m", MODEL, "-o", o3, "--corpus", outs[0][1], "--tokens", "96", "--ctx", "64", "--sens-tokens", "0",
                 "--compare", outs[0][0]])
        check(p.returncode == 0 and "K distance mean 0.00000 max 0.00000; V distance mean 0.00000 max 0.00000"
              in p.stdout, f"the saved corpus reproduces the calibration: {p.stdout.strip().splitlines()[-1:]}")
        # --gen-* reach the sampler: a greedy corpus differs and says so
        o4, t4 = os.path.join(tmp, "gen_greedy.zack"), os.path.join(tmp, "gen_greedy.txt")
        p = run(["-m", MODEL, "-o", o4, "--tokens", "96", "--ctx", "64", "--sens-tokens", "0", "--gen-temp", "0",
                 "--gen-len", "40", "--save-corpus", t4])
        check(p.returncode == 0, "calibration with --gen-temp 0 --gen-len 40 exits 0")
        if p.returncode == 0:
            d4 = field(ref_gguf.open_file(o4), "zack.calib.corpus")
            check("temp 0 " in d4 and "up to 40 tokens" in d4 and open(t4, encoding="utf-8", errors="replace").read() != a,
                  f"--gen-temp / --gen-len change the generated corpus: {d4!r}")

    # bad input: one clear line, non-zero exit, no output file
    empty = os.path.join(tmp, "empty.txt")
    open(empty, "w").close()
    bad = os.path.join(tmp, "bad.zack")
    cases = [
        (["-m", MODEL, "-o", bad, "--corpus", os.path.join(tmp, "missing.txt")], "cannot open corpus"),
        (["-m", MODEL, "-o", bad, "--corpus", empty], "empty"),
        (["-m", out, "-o", bad, "--corpus", CORPUS], ".zack"),
        (["-m", MODEL, "-o", "/nonexistent-dir/x.zack", "--corpus", CORPUS], "does not exist"),
        (["-m", MODEL, "-o", bad, "--corpus", CORPUS, "--compare", out, "--compare-rate", "1.5"], "out of range"),
        (["-m", out, "--compare", out, "--compare-rate", "-0.1"], "out of range"),
        (["-m", MODEL], "-o"),
        (["-m", MODEL, "-o", bad, "--gen-top-p", "0"], "--gen-top-p"),
        (["-m", MODEL, "-o", bad, "--gen-parallel", "0"], "--gen-parallel"),
    ]
    for args, needle in cases:
        p = run(args, expect_ok=False)
        err = p.stderr.strip()
        check(p.returncode != 0 and needle in err and len(err.splitlines()) == 1,
              f"bad input {args[-2:]}: exit {p.returncode}, one line containing {needle!r}: {err!r}")
        check(not os.path.exists(bad) and not any(n.startswith("bad.zack") for n in os.listdir(tmp)),
              f"no output left for {args[-2:]}")

    if failures:
        print(f"test_calib_e2e: {len(failures)} check(s) FAILED")
        return 1
    print("test_calib_e2e: all checks passed")
    return 0


if __name__ == "__main__":
    # this run's own directory only: another run of this test beside it (two checkouts'
    # CI on one machine) keeps its files
    try:
        rc = main()
    finally:
        for d in _TMP_DIRS:
            shutil.rmtree(d, ignore_errors=True)
    sys.exit(rc)
