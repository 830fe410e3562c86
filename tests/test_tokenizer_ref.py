#!/usr/bin/env python3
"""zack's tokenizer against an independent reference: HF `tokenizers`.

Two vocabularies: SmolLM2's (ZACK_MODEL, 49,152 tokens) and Qwen2.5's
(ZACK_MODEL_QWEN15, 151,936 tokens, pre-tokenizer qwen2; the 0.5B file holds the
same vocabulary and merges, byte for byte). For each, the reference is built here
from the GGUF's own tokenizer metadata (read by tests/ref/ref_gguf.metadata, which
this test checks against the `gguf` package on SmolLM2's file; not with zack):
models.BPE(vocab, merges), the pre-tokenizer as the model's tokenizer.json
configures it (SmolLM2: Sequence([Digits(individual_digits=True),
ByteLevel(add_prefix_space=False)]); Qwen2: Sequence([Split(Regex(QWEN2_PATTERN),
"isolated"), ByteLevel(add_prefix_space=False, use_regex=False)])), a ByteLevel
decoder, control tokens (type 3) added as special AddedTokens and user-defined ones
(type 4: Qwen's <tool_call>, </tool_call>) as non-special AddedTokens, which are
matched whether or not special tokens are parsed, as in Qwen's tokenizer.json.
Qwen's tokenizer.json also has an NFC normalizer, which GGUF files do not record
and llama.cpp does not apply; neither does zack, so the reference has none.

Checks, for every file in tests/data/tokenizer (licences, source code,
multilingual text, whitespace and digits, chat markup):
  * ids from tests/tool_tokenize are identical to the reference's;
  * decode(encode(text)) == text (tool_tokenize --decode);
  * the pre-tokenizer's pieces match the reference pre-tokenizer's (this checks
    the split itself, e.g. Llama-3's \p{N}{1,3}, which the ids alone cannot show
    with a vocabulary of single digits);
  * special tokens are split out with --special and left as text without it;
  * bytes the vocabulary has no token for are dropped as HF does (ids only).
For SmolLM2 the same runs again with tokenizer.ggml.pre switched to gpt2,
llama-bpe and qwen2, for Qwen with deepseek-r1-qwen (the name llama.cpp's
converter writes for DeepSeek-R1-Distill-Qwen, the same pattern): a small
temporary GGUF holds the same vocabulary and merges (no tensors) and the reference
uses the matching pattern (Split(Regex) + ByteLevel without its own regex; Llama-3
also with ignore_merges, as its tokenizer.json has).

Env: ZACK_MODEL, ZACK_MODEL_QWEN15 (the GGUFs), ZACK_BUILD (build dir with
tests/tool_tokenize). Exits non-zero with a summary on any failure, and when an
input is missing.
"""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parent / "ref"))
import ref_gguf  # noqa: E402
import ref_tokenizer  # noqa: E402  (the reference builder, shared with the forward tests)
import tokenizers  # noqa: E402

SOURCE = Path(os.environ.get("ZACK_SOURCE", Path(__file__).resolve().parent.parent))
DATA = SOURCE / "tests" / "data" / "tokenizer"

TOKEN_CONTROL = ref_tokenizer.TOKEN_TYPE_CONTROL

failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL: " + msg)


class Meta:
    """The tokenizer.ggml.* keys this test needs, read by tests/ref/ref_gguf.metadata
    (a reader of the GGUF header alone; check_metadata_reader compares it with
    the gguf package's)."""

    def __init__(self, path):
        m = ref_gguf.metadata(str(path))
        self.model = m["tokenizer.ggml.model"]
        self.tokens = m["tokenizer.ggml.tokens"]
        self.types = m["tokenizer.ggml.token_type"]
        self.merges = m["tokenizer.ggml.merges"]
        self.ids = {k: m.get("tokenizer.ggml.%s_token_id" % k) for k in ("bos", "eos", "unknown", "padding")}
        self.add_bos = m.get("tokenizer.ggml.add_bos_token", False)
        self.pre = m.get("tokenizer.ggml.pre", "default")


def check_metadata_reader(path):
    """ref_gguf against gguf.GGUFReader: every key and value, every tensor's place (ref_gguf.open_file
    is what the reference forward pass and the model tests read)."""
    ours = ref_gguf.open_file(str(path))
    for d in ref_gguf.differences_from_gguf(str(path), ours):
        fail("ref_gguf: " + d)
    return len(ours.meta), len(ours.tensors)


def build_reference(meta, pre):
    return ref_tokenizer.build_tokenizer(meta.tokens, meta.types, meta.merges, pre)


def write_variant(meta, pre, path):
    """A GGUF with only the tokenizer keys, tokenizer.ggml.pre set to `pre`."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(meta.model)
    w.add_tokenizer_pre(pre)
    w.add_token_list(meta.tokens)
    w.add_token_types(meta.types)
    w.add_token_merges(meta.merges)
    for k, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                   ("unknown", w.add_unk_token_id), ("padding", w.add_pad_token_id)):
        if meta.ids[k] is not None:
            add(meta.ids[k])
    w.add_add_bos_token(bool(meta.add_bos))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_tool(tool, model, files, special, mode="--decode"):
    """Per file: (ids, --decode verdict), or with mode "--pretok" (piece lengths, None)."""
    cmd = [str(tool), str(model)] + [str(p) for p in files] + [mode]
    if special:
        cmd.append("--special")
    res = subprocess.run(cmd, capture_output=True, text=True)
    lines = res.stdout.splitlines()
    per_file = 2 if mode == "--decode" else 1
    if len(lines) != per_file * len(files):
        fail("%s exited %d with %d output lines for %d files; stderr: %s"
             % (tool.name, res.returncode, len(lines), len(files), res.stderr.strip()[:500]))
        return None
    out = []
    for k in range(len(files)):
        ids = [int(x) for x in lines[per_file * k].split()]
        out.append((ids, lines[per_file * k + 1] if per_file == 2 else None))
    return out


def compare_pretok(label, tool, model, tok, files, texts):
    got = run_tool(tool, model, files, special=False, mode="--pretok")
    if got is None:
        return 0
    n_pieces = 0
    for path, text, (lengths, _) in zip(files, texts, got):
        # ByteLevel shows each byte as one character, so a piece's length is its bytes.
        ref = [len(piece) for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)]
        if lengths != ref:
            k = 0
            while k < len(lengths) and k < len(ref) and lengths[k] == ref[k]:
                k += 1
            at = sum(ref[:k])
            raw = text.encode("utf-8")
            fail("[%s] %s: pre-token %d (byte %d) differs: ours %s, reference %s, text %r"
                 % (label, path.name, k, at, lengths[k:k + 4], ref[k:k + 4], raw[at:at + 24]))
        n_pieces += len(ref)
    return n_pieces


def check_missing_bytes(label, tool, model, tok):
    """Control bytes some vocabularies lack (SmolLM2 has no token for 0x04, 0x1D)."""
    text = "a\x04b \x1dc\x13\x14\x16 d\x06\n"
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as fh:
        fh.write(text)
    try:
        got = run_tool(tool, model, [Path(fh.name)], special=False)
        ref = tok.encode(text, add_special_tokens=False).ids
        if got is not None and got[0][0] != ref:
            fail("[%s] bytes without tokens: ours %s, reference %s" % (label, got[0][0], ref))
    finally:
        os.unlink(fh.name)


def describe_mismatch(tok, ours, ref):
    k = 0
    while k < len(ours) and k < len(ref) and ours[k] == ref[k]:
        k += 1
    lo = max(0, k - 5)
    context = tok.decode(ref[lo:k], skip_special_tokens=False)
    show = lambda ids: " ".join("%d:%r" % (i, tok.id_to_token(i)) for i in ids)
    return ("first difference at token %d (ours %d tokens, reference %d); after %r\n"
            "    ours: %s\n    ref:  %s" % (k, len(ours), len(ref), context[-40:],
                                            show(ours[k:k + 6]), show(ref[k:k + 6])))


def compare_variant(label, tool, model, tok, files, texts):
    stats = [0, 0]  # bytes, tokens
    got = run_tool(tool, model, files, special=True)
    if got is None:
        return stats
    for path, text, (ids, verdict) in zip(files, texts, got):
        ref = tok.encode(text, add_special_tokens=False).ids
        if ids != ref:
            fail("[%s] %s: ids differ from the reference: %s"
                 % (label, path.name, describe_mismatch(tok, ids, ref)))
        else:
            stats[0] += len(text.encode("utf-8"))
            stats[1] += len(ids)
        if verdict != "OK":
            fail("[%s] %s: decode(encode(x)) != x: %s" % (label, path.name, verdict))
    return stats


def check_specials(label, tool, model, tok, meta, chat_file):
    text = chat_file.read_text(encoding="utf-8")
    got = run_tool(tool, model, [chat_file], special=False)
    if got is not None:
        tok.encode_special_tokens = True  # reference: special texts are plain text
        ref = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        if got[0][0] != ref:
            fail("[%s] %s without --special: %s" % (label, chat_file.name,
                                                   describe_mismatch(tok, got[0][0], ref)))
        if any(meta.types[i] == TOKEN_CONTROL for i in got[0][0]):
            fail("[%s] control token produced without --special" % label)
    # The minimal chat turn: both ends must be the vocabulary's control tokens.
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as fh:
        fh.write("<|im_start|>user\nhi<|im_end|>")
    try:
        got = run_tool(tool, model, [Path(fh.name)], special=True)
        ref = tok.encode("<|im_start|>user\nhi<|im_end|>", add_special_tokens=False).ids
        want_ends = (meta.tokens.index("<|im_start|>"), meta.tokens.index("<|im_end|>"))
        if got is not None and (got[0][0] != ref or (ref[0], ref[-1]) != want_ends):
            fail("[%s] chat turn: ours %s, reference %s" % (label, got[0][0], ref))
    finally:
        os.unlink(fh.name)


def check_vocab(label, model, pres, tool, files, texts, tmp, summary):
    """Compares zack with the reference on `model` (its own tokenizer.ggml.pre,
    pres[0]) and on temporary copies of its vocabulary with pres[1:]."""
    meta = Meta(model)
    if meta.model != "gpt2":
        fail("%s has tokenizer model %r; this test needs byte-level BPE" % (model, meta.model))
        return
    if meta.pre != pres[0]:
        fail("%s has tokenizer.ggml.pre %r, expected %r" % (model, meta.pre, pres[0]))
        return
    for k, pre in enumerate(pres):
        gguf_path = model
        if k > 0:
            gguf_path = Path(tmp) / ("vocab-%s-%s.gguf" % (label, pre))
            write_variant(meta, pre, gguf_path)
        tag = "%s/%s" % (label, pre)
        tok = build_reference(meta, pre)
        n_bytes, n_tokens = compare_variant(tag, tool, gguf_path, tok, files, texts)
        n_pieces = compare_pretok(tag, tool, gguf_path, tok, files, texts)
        for chat in ("chat_special.txt", "chat_qwen.txt"):
            check_specials(tag, tool, gguf_path, tok, meta, DATA / chat)
        check_missing_bytes(tag, tool, gguf_path, tok)
        summary.append("  %-24s ids identical on %6.1f KB, %6d tokens; %6d pre-token pieces compared"
                       % (tag, n_bytes / 1024, n_tokens, n_pieces))


def main():
    model = Path(os.environ.get("ZACK_MODEL", SOURCE / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    qwen = Path(os.environ.get("ZACK_MODEL_QWEN15",
                               SOURCE / "models" / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"))
    build = os.environ.get("ZACK_BUILD")
    for m, var in ((model, "ZACK_MODEL"), (qwen, "ZACK_MODEL_QWEN15")):
        if not m.is_file():
            print("FAIL: model file %s is missing (set %s or run scripts/fetch_model.sh)" % (m, var))
            return 1
    if not build:
        print("FAIL: ZACK_BUILD is not set (the build dir holding tests/tool_tokenize)")
        return 1
    tool = Path(build) / "tests" / "tool_tokenize"
    if not tool.is_file():
        print("FAIL: %s is missing (build the tool_tokenize target)" % tool)
        return 1
    files = sorted(DATA.glob("*.txt"))
    texts = [p.read_bytes().decode("utf-8") for p in files]
    if sum(len(t.encode("utf-8")) for t in texts) < 50_000:
        print("FAIL: test texts in %s hold under 50 KB" % DATA)
        return 1

    summary = ["header reader: %d keys and %d tensors of %s as gguf.GGUFReader reads them"
               % (*check_metadata_reader(model), model.name)]
    with tempfile.TemporaryDirectory() as tmp:
        check_vocab("smollm2", model, ("smollm", "gpt2", "llama-bpe", "qwen2"), tool, files, texts, tmp,
                    summary)
        check_vocab("qwen2.5", qwen, ("qwen2", "deepseek-r1-qwen"), tool, files, texts, tmp, summary)

    print("tokenizer vs HF tokenizers %s, %d files, %.1f KB:" % (
        tokenizers.__version__, len(files), sum(len(t.encode("utf-8")) for t in texts) / 1024))
    print("\n".join(summary))
    if failures:
        print("%d FAILURES" % len(failures))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
