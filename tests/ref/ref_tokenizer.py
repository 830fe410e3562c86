#!/usr/bin/env python3
"""Reference tokenizer built with the HF `tokenizers` library from GGUF metadata.

Covers byte-level BPE models (tokenizer.ggml.model == "gpt2"); the pre-tokenizer
is set up as the model family's tokenizer.json does, by tokenizer.ggml.pre:
  smollm            Sequence([Digits(individual_digits=True),
                              ByteLevel(add_prefix_space=False, use_regex=True)])
  gpt2              ByteLevel(add_prefix_space=False, use_regex=True)
  llama-bpe         Sequence([Split(Regex(LLAMA3_PATTERN), "isolated"),
                              ByteLevel(add_prefix_space=False, use_regex=False)]),
                    and BPE(ignore_merges=True)
  qwen2, deepseek-r1-qwen
                    as llama-bpe with QWEN2_PATTERN (single digits), merges not ignored
  decoder           ByteLevel
Tokens with token_type 3 (control, e.g. <|im_start|>) are registered as special
AddedTokens, those with type 4 (user-defined, e.g. Qwen's <tool_call>) as
non-special ones, so their texts inside a prompt map to their single ids.
(Qwen's tokenizer.json also normalizes to NFC; GGUF files do not record that and
llama.cpp does not do it, so this reference does not either.)

The GGUF vocabulary strings are already in byte-level alphabet form (e.g. "Ġthe"),
and merges are "left right" strings, exactly what models.BPE takes. Where a token
text occurs twice, the first id wins (as in zack and llama.cpp).

API:
    build_tokenizer(tokens, types, merges, pre) -> tokenizers.Tokenizer
    tok = load(model_path)                  # tokenizers.Tokenizer, cached
    info(model_path) -> dict(bos=, eos=, add_bos=, add_eos=, n_vocab=, control=)
    control_ids(model_path) -> list[int]    # token_type 3
    token_bytes(model_path, id) -> bytes    # raw bytes of one token
    decode(model_path, ids) -> str          # special tokens kept
    encode(model_path, text, add_bos=None) -> list[int]   (None: follow GGUF flag)
CLI:
    python3 ref_tokenizer.py MODEL "text"   -> prints ids
"""
from __future__ import annotations

import sys

import ref_gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
# Patterns as the models' tokenizer.json files write them.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SUPPORTED_PRE = ("smollm", "gpt2", "llama-bpe", "qwen2", "deepseek-r1-qwen")


def build_tokenizer(tokens, types, merges, pre: str) -> Tokenizer:
    """The reference for a byte-level BPE vocabulary with pre-tokenizer `pre`."""
    if pre not in SUPPORTED_PRE:
        raise ValueError(f"tokenizer.ggml.pre '{pre}' not supported by the reference "
                         f"tokenizer (supported: {', '.join(SUPPORTED_PRE)})")
    if len(tokens) != len(types):
        raise ValueError(f"{len(tokens)} tokens but {len(types)} token types")
    vocab = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    merge_pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep:
            raise ValueError(f"malformed merge '{m}'")
        merge_pairs.append((a, b))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merge_pairs, ignore_merges=(pre == "llama-bpe")))
    if pre == "smollm":
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    elif pre == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pattern = LLAMA3_PATTERN if pre == "llama-bpe" else QWEN2_PATTERN
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, ty in zip(tokens, types) if ty == TOKEN_TYPE_USER_DEFINED])
    return tok


_CACHE: dict[str, tuple[Tokenizer, dict]] = {}


def _field(meta, key, default=None):
    return meta.get(key, default)


def _build(path: str) -> tuple[Tokenizer, dict]:
    kv = ref_gguf.metadata(path)  # the header alone: gguf.GGUFReader parses every value part (~8 s for Qwen)
    model = _field(kv, "tokenizer.ggml.model")
    pre = _field(kv, "tokenizer.ggml.pre", "default")
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model '{model}' not supported by the "
                         f"reference tokenizer (only byte-level BPE 'gpt2')")
    tokens = _field(kv, "tokenizer.ggml.tokens")
    types = _field(kv, "tokenizer.ggml.token_type")
    try:
        tok = build_tokenizer(tokens, types, _field(kv, "tokenizer.ggml.merges"), pre)
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    meta = dict(
        bos=_field(kv, "tokenizer.ggml.bos_token_id"),
        eos=_field(kv, "tokenizer.ggml.eos_token_id"),
        add_bos=bool(_field(kv, "tokenizer.ggml.add_bos_token", False)),
        add_eos=bool(_field(kv, "tokenizer.ggml.add_eos_token", False)),
        n_vocab=len(tokens),
        control=[i for i, ty in enumerate(types) if ty == TOKEN_TYPE_CONTROL],
    )
    meta["control_set"] = frozenset(meta["control"])
    meta["text_set"] = frozenset(i for i, ty in enumerate(types)
                                 if ty in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED))
    return tok, meta


def _get(path: str) -> tuple[Tokenizer, dict]:
    if path not in _CACHE:
        _CACHE[path] = _build(path)
    return _CACHE[path]


def load(path: str) -> Tokenizer:
    """tokenizers.Tokenizer for the GGUF at `path` (no BOS/EOS post-processing)."""
    return _get(path)[0]


def info(path: str) -> dict:
    """bos, eos ids and the add_bos/add_eos flags from the GGUF."""
    return dict(_get(path)[1])


def _byte_level_alphabet() -> dict[str, int]:
    """Inverse of the GPT-2 byte-level alphabet: printable bytes ('!'..'~',
    0xA1..0xAC, 0xAE..0xFF) stand for themselves, the other 68 bytes are mapped
    to U+0100 onwards in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[chr(b)] = b
        else:
            table[chr(256 + extra)] = b
            extra += 1
    return table


_ALPHABET = _byte_level_alphabet()


def token_bytes(path: str, token_id: int) -> bytes:
    """The bytes one token stands for (may be part of a UTF-8 sequence); a
    control or user-defined token gives its text."""
    tok, meta = _get(path)
    text = tok.id_to_token(int(token_id))
    if int(token_id) in meta["text_set"]:
        return text.encode("utf-8")
    return bytes(_ALPHABET[c] for c in text)


def control_ids(path: str) -> list[int]:
    """Ids of the control tokens (token_type 3)."""
    return list(_get(path)[1]["control"])


def encode(path: str, text: str, add_bos: bool | None = None) -> list[int]:
    """Token ids for `text`; special-token texts map to their ids. A BOS is
    prepended when add_bos (None: the GGUF flag tokenizer.ggml.add_bos_token)."""
    tok, meta = _get(path)
    ids = tok.encode(text, add_special_tokens=False).ids
    if add_bos is None:
        add_bos = meta["add_bos"]
    if add_bos and meta["bos"] is not None:
        ids = [int(meta["bos"])] + ids
    return ids


def decode(path: str, ids) -> str:
    """Text for `ids`, special tokens included verbatim."""
    return load(path).decode(list(ids), skip_special_tokens=False)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: ref_tokenizer.py MODEL TEXT", file=sys.stderr)
        sys.exit(2)
    print(" ".join(str(i) for i in encode(sys.argv[1], sys.argv[2], add_bos=False)))
