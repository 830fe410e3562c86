#!/usr/bin/env python3
"""Chat templates: zk::chat_apply (through tests/tool_chat) against the jinja2
package rendering the real template texts.

Reference: jinja2 set up as transformers' apply_chat_template does, rendering
  (a) the templates read from the GGUF key tokenizer.chat_template of the default
      model (SmolLM2) and of both Qwen2.5-Coder files (1.5B and 0.5B: each carries
      its template; the two differ only inside the tool-calling branch, which
      zack does not render);
  (b) the official Llama 3, Llama 2, Gemma 3, Gemma 2, generic ChatML and Qwen2.5
      templates in tests/data/chat_templates/ (provenance in its README.md).
Checks, for several conversations and add_generation_prompt true/false:
  - byte-for-byte equality (the template's leading BOS removed: zack's caller adds it);
  - the same conversations that make the template raise make tool_chat fail;
  - detection picks the right family, and for ChatML the default system text the
    template inserts (the expected text is taken from jinja2's own rendering);
  - prefix property: rendering(history, gen=False) is a prefix of the rendering of
    any extension of history, for every family.
Environment: ZACK_BUILD (tools in $ZACK_BUILD/tests/), ZACK_MODEL, ZACK_MODEL_QWEN15,
ZACK_MODEL_QWEN05, ZACK_SOURCE.
Exits non-zero on any failure.
"""
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

FAILURES = []
CHECKS = 0


def check(ok, what):
    global CHECKS
    CHECKS += 1
    if not ok:
        FAILURES.append(what)
        print("FAIL:", what)


def fatal(msg):
    print("FATAL:", msg)
    sys.exit(1)


try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    import jinja2.ext
except ImportError:
    fatal("the jinja2 package is required (pip install jinja2)")

SOURCE = os.environ.get("ZACK_SOURCE", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.environ.get("ZACK_BUILD")
MODEL = os.environ.get("ZACK_MODEL")
if not BUILD:
    fatal("ZACK_BUILD is not set (the build directory holding tests/tool_chat)")
TOOL = os.path.join(BUILD, "tests", "tool_chat")
if not os.path.isfile(TOOL):
    fatal(f"tool_chat not found at {TOOL}; build the tool_chat target")
if not MODEL or not os.path.isfile(MODEL):
    fatal(f"model file not found: ZACK_MODEL={MODEL!r} (run scripts/fetch_model.sh)")
QWEN_MODELS = {}
for var, fetch in (("ZACK_MODEL_QWEN15", "qwen2.5-coder-1.5b"), ("ZACK_MODEL_QWEN05", "qwen2.5-coder-0.5b")):
    QWEN_MODELS[fetch] = os.environ.get(var)
    if not QWEN_MODELS[fetch] or not os.path.isfile(QWEN_MODELS[fetch]):
        fatal(f"model file not found: {var}={QWEN_MODELS[fetch]!r} (run scripts/fetch_model.sh {fetch})")
TEMPLATE_DIR = os.path.join(SOURCE, "tests", "data", "chat_templates")

# ---------------------------------------------------------------------------
# reference rendering and the tool


class TemplateRaised(Exception):
    pass


def raise_exception(message):
    raise TemplateRaised(message)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
ENV.globals["raise_exception"] = raise_exception
_compiled = {}


def render_reference(src, messages, gen, bos, eos):
    """jinja2 rendering with the BOS the template writes first removed; None if the template raises."""
    if src not in _compiled:
        _compiled[src] = ENV.from_string(src)
    try:
        out = _compiled[src].render(messages=messages, add_generation_prompt=gen, bos_token=bos, eos_token=eos)
    except TemplateRaised:
        return None
    # Only a BOS written through bos_token: SmolLM2's bos text "<|im_start|>" also
    # starts every ChatML turn and must stay.
    if bos and "bos_token" in src and out.startswith(bos):
        out = out[len(bos):]
    return out


TMPDIR = tempfile.mkdtemp(prefix="zack_chat_")
atexit.register(shutil.rmtree, TMPDIR, ignore_errors=True)
_case_id = 0


def run_tool(case, detect=False, batch=False):
    """Returns (returncode, stdout text, stderr text)."""
    global _case_id
    _case_id += 1
    path = os.path.join(TMPDIR, f"case{_case_id}.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(case, f, ensure_ascii=False)
    args = [TOOL] + (["--detect"] if detect else []) + (["--batch"] if batch else []) + [path]
    r = subprocess.run(args, capture_output=True, timeout=30)
    return r.returncode, r.stdout.decode("utf-8", errors="replace"), r.stderr.decode("utf-8", errors="replace")


def tool_render(template_src, messages, gen, name=""):
    """One case through the single-case mode: (output or None on error, stderr)."""
    rc, out, err = run_tool({"template": template_src, "name": name, "messages": messages,
                             "add_generation_prompt": gen})
    return out if rc == 0 else None, err


class Batch:
    """Collects cases, renders them all with one tool_chat --batch run, then calls
    each case's callback with (output or None on error, error text)."""

    def __init__(self):
        self.cases, self.callbacks = [], []

    def add(self, template_src, messages, gen, callback, name=""):
        self.cases.append({"template": template_src, "name": name, "messages": messages,
                           "add_generation_prompt": gen})
        self.callbacks.append(callback)

    def run(self):
        rc, out, err = run_tool(self.cases, detect=False, batch=True)
        if rc != 0:
            fatal(f"tool_chat --batch failed: {err}")
        results = json.loads(out)
        if len(results) != len(self.cases):
            fatal(f"tool_chat --batch returned {len(results)} results for {len(self.cases)} cases")
        for cb, r in zip(self.callbacks, results):
            cb(r["text"] if r["ok"] else None, r["error"])


# ---------------------------------------------------------------------------
# templates


def read_gguf_template(path):
    """(tokenizer.chat_template, BOS text, EOS text) from a GGUF v2/v3 file. A small
    metadata walk: gguf.GGUFReader would parse every tensor and token (slow)."""
    import struct

    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        data = f.read(64 << 20)  # metadata lives at the start; 64 MiB is plenty
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from(fmt, data, pos)[0]
        pos += struct.calcsize(fmt)
        return v

    def take_str():
        nonlocal pos
        n = take("<Q")
        v = data[pos:pos + n].decode("utf-8")
        pos += n
        return v

    def take_value(t):
        if t == 8:
            return take_str()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [take_value(et) for _ in range(n)]
        return take(scalar[t])

    if data[:4] != b"GGUF":
        fatal(f"{path} is not a GGUF file")
    pos = 4
    version, _, n_kv = take("<I"), take("<Q"), take("<Q")
    if version < 2:
        fatal(f"{path}: GGUF version {version} not supported by this test")
    kv = {}
    for _ in range(n_kv):
        key = take_str()
        kv[key] = take_value(take("<I"))
    if "tokenizer.chat_template" not in kv:
        fatal(f"{path} has no tokenizer.chat_template")
    tokens = kv.get("tokenizer.ggml.tokens", [])

    def token_text(key):
        tid = kv.get(key)
        return tokens[tid] if tid is not None and 0 <= tid < len(tokens) else ""

    return (kv["tokenizer.chat_template"], token_text("tokenizer.ggml.bos_token_id"),
            token_text("tokenizer.ggml.eos_token_id"))


def read_template(name):
    with open(os.path.join(TEMPLATE_DIR, name), encoding="utf-8", newline="") as f:
        return f.read()


smollm_src, smollm_bos, smollm_eos = read_gguf_template(MODEL)
qwen_templates = {name: read_gguf_template(path) for name, path in QWEN_MODELS.items()}

# name -> (source, bos, eos, expected kind, accepts a system message)
TEMPLATES = {
    "smollm2": (smollm_src, smollm_bos, smollm_eos, "chatml", True),
    "llama3": (read_template("llama3.jinja"), "<|begin_of_text|>", "<|eot_id|>", "llama3", True),
    "llama2": (read_template("llama2.jinja"), "<s>", "</s>", "llama2", True),
    "gemma3": (read_template("gemma3.jinja"), "<bos>", "<eos>", "gemma", True),
    "gemma2": (read_template("gemma2.jinja"), "<bos>", "<eos>", "gemma", False),
    "chatml": (read_template("chatml.jinja"), "", "", "chatml", True),
    "qwen2.5": (read_template("qwen2.5.jinja"), "", "", "chatml", True),
}
for name, (src, bos, eos) in qwen_templates.items():
    TEMPLATES[name] = (src, bos, eos, "chatml", True)


def M(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "one_turn": [M("user", "Hello! Who are you?")],
    "system_one_turn": [M("system", "You are a terse assistant."), M("user", "What is 2+2?")],
    "multi_turn": [M("user", "Name a colour."), M("assistant", "Blue."), M("user", "Another one?")],
    "system_multi_turn": [M("system", "Answer in French."), M("user", "Hi"), M("assistant", "Bonjour !"),
                          M("user", "How are you?"), M("assistant", "Très bien, merci.")],
    "whitespace_unicode": [M("system", "  padded system text \n"), M("user", "\n  leading and trailing \t\n"),
                           M("assistant", " héllo 世界 🙂 "),
                           M("user", "line1\nline2\u00a0\u3000"), M("assistant", "\u2003x\u2003")],
    "template_like_content": [M("user", "{{ not a tag }} {% raw %} 'single' \"double\" \\n <|im_end|>")],
    "empty_content": [M("user", ""), M("assistant", ""), M("user", " ")],
}

# Role orders the Llama 2 / Gemma templates reject.
BAD_ORDERS = {
    "assistant_first": [M("assistant", "Hi"), M("user", "Hello")],
    "two_users": [M("user", "a"), M("user", "b")],
    "system_then_assistant": [M("system", "s"), M("assistant", "a")],
}

# ---------------------------------------------------------------------------
# 1. byte-for-byte rendering

batch = Batch()
n_render = 0
for tname, (src, bos, eos, kind, takes_system) in TEMPLATES.items():
    for cname, msgs in CONVERSATIONS.items():
        if not takes_system and msgs[0]["role"] == "system":
            continue
        for gen in (False, True):
            want = render_reference(src, msgs, gen, bos, eos)
            n_render += 1
            if want is None:
                check(False, f"{tname}/{cname}/gen={gen}: the reference template raised on a valid conversation")
                continue
            label = f"{tname}/{cname}/gen={gen}"
            batch.add(src, msgs, gen, lambda got, err, want=want, label=label: check(
                got == want, f"{label}: mismatch\n  want {want!r}\n  got  {got!r} {err}"))

# 2. conversations the templates reject
for tname in ("llama2", "gemma3", "gemma2"):
    src, bos, eos, _, _ = TEMPLATES[tname]
    for cname, msgs in BAD_ORDERS.items():
        want = render_reference(src, msgs, True, bos, eos)
        check(want is None, f"{tname}/{cname}: expected the reference template to raise")
        label = f"{tname}/{cname}"
        batch.add(src, msgs, True, lambda got, err, label=label: check(
            got is None and "alternate" in err, f"{label}: expected chat_apply to fail, got {got!r} {err!r}"))
batch.run()

# The single-case mode prints the same bytes (UTF-8 and control characters included).
for tname in ("smollm2", "llama3", "gemma3"):
    src, bos, eos, _, _ = TEMPLATES[tname]
    msgs = CONVERSATIONS["whitespace_unicode"]
    got, err = tool_render(src, msgs, True)
    want = render_reference(src, msgs, True, bos, eos)
    check(got == want, f"single-case mode {tname}: want {want!r} got {got!r} {err}")

# ---------------------------------------------------------------------------
# 3. detection, default system text


def jinja_default_system(src):
    """The system text the template inserts for a conversation without one."""
    out = render_reference(src, [M("user", "x")], False, "", "")
    head = "<|im_start|>system\n"
    if not out.startswith(head):
        return ""
    return out[len(head):out.index("<|im_end|>")]


for tname, (src, bos, eos, kind, _) in TEMPLATES.items():
    rc, out, err = run_tool({"template": src}, detect=True)
    got_kind, _, got_system = out.partition("\n")
    check(rc == 0 and got_kind == kind, f"detect {tname}: kind {got_kind!r}, want {kind!r} {err}")
    if kind == "chatml":
        want_system = jinja_default_system(src)
        check(got_system == want_system, f"detect {tname}: default system {got_system!r}, want {want_system!r}")
    else:
        check(got_system == "", f"detect {tname}: unexpected default system {got_system!r}")

smollm_system = jinja_default_system(smollm_src)
check(smollm_system == "You are a helpful AI assistant named SmolLM, trained by Hugging Face",
      f"SmolLM2's template default system text is {smollm_system!r}")
# Qwen2.5's default system text, as its template writes it (the test above already
# compares zack's detection with jinja2's rendering; this pins what that text is).
for name in qwen_templates:
    qwen_system = jinja_default_system(TEMPLATES[name][0])
    check(qwen_system == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.",
          f"{name}'s template default system text is {qwen_system!r}")

# The SmolLM2 template with its default-system literal written in other ways
# (double quotes and escapes, split literals, raw text): detection must still find
# it, and rendering must still match jinja2.
smollm_literal = "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
if smollm_literal not in smollm_src:
    check(False, "the SmolLM2 template changed shape: cannot build its variants")
else:
    variants = {
        "double_quoted_escapes": "{{ \"<|im_start|>system\\nA \\\"quoted\\\" bot\\tv2 \\u00e9<|im_end|>\\n\" }}",
        "split_literals": "{{ '<|im_start|>system\\n' + 'Split ' ~ 'bot' + '<|im_end|>\\n' }}",
        "raw_text": "<|im_start|>system\nRaw text bot<|im_end|>\n",
        "dashes": "{{- '<|im_start|>system\\nDash bot<|im_end|>\\n' -}}",
    }
    for vname, literal in variants.items():
        src = smollm_src.replace(smollm_literal, literal)
        src = src.replace("messages[0]['role'] != 'system'", "messages[0].role != \"system\"") \
            if vname == "raw_text" else src
        want_system = jinja_default_system(src)
        check(want_system != "", f"variant {vname}: reference inserts no system text (bad variant)")
        rc, out, err = run_tool({"template": src}, detect=True)
        check(out == "chatml\n" + want_system, f"variant {vname}: detect gave {out!r}, want {want_system!r} {err}")
        batch = Batch()
        for cname in ("one_turn", "multi_turn", "system_one_turn"):
            for gen in (False, True):
                want = render_reference(src, CONVERSATIONS[cname], gen, "", "")
                label = f"variant {vname}/{cname}/gen={gen}"
                batch.add(src, CONVERSATIONS[cname], gen, lambda got, err, want=want, label=label: check(
                    got == want, f"{label}: want {want!r} got {got!r} {err}"))
        batch.run()

# Fallbacks and names.
for src in ("", "{{ messages }}", "{% for m in messages %}{{ m.content }}{% endfor %}"):
    rc, out, err = run_tool({"template": src}, detect=True)
    check(rc == 0 and out == "chatml\n", f"detect fallback for {src!r}: got {out!r} {err}")
batch = Batch()
for tname, name in (("llama3", "llama3"), ("llama2", "llama2"), ("gemma3", "gemma"), ("chatml", "chatml")):
    src, bos, eos, _, _ = TEMPLATES[tname]
    msgs = CONVERSATIONS["system_multi_turn"]
    want = render_reference(src, msgs, True, bos, eos)
    # the name overrides the template text
    batch.add(smollm_src, msgs, True, lambda got, err, want=want, name=name: check(
        got == want, f"name override {name}: want {want!r} got {got!r} {err}"), name=name)
batch.run()
rc, out, err = run_tool({"template": "", "name": "vicuna", "messages": []})
check(rc != 0 and "chatml, llama3, llama2, gemma" in err, f"unknown name must fail listing the valid names: {err!r}")

# ---------------------------------------------------------------------------
# 4. prefix property, for every family (and the SmolLM2 and Qwen default system texts)

n_prefix = 0
renders = {}
batch = Batch()
PREFIX_TEMPLATES = ("smollm2", "qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", "chatml", "llama3", "llama2", "gemma3")
for tname in PREFIX_TEMPLATES:
    src = TEMPLATES[tname][0]
    for cname in ("multi_turn", "system_multi_turn", "whitespace_unicode", "empty_content"):
        msgs = CONVERSATIONS[cname]
        for k in range(len(msgs) + 1):
            for gen in (False, True):
                def store(got, err, key=(tname, cname, k, gen)):
                    renders[key] = got
                batch.add(src, msgs[:k], gen, store)
batch.run()
for tname in PREFIX_TEMPLATES:
    for cname in ("multi_turn", "system_multi_turn", "whitespace_unicode", "empty_content"):
        msgs = CONVERSATIONS[cname]
        for k in range(len(msgs)):
            base = renders[(tname, cname, k, False)]
            for k2 in range(k + 1, len(msgs) + 1):
                for gen in (False, True):
                    longer = renders[(tname, cname, k2, gen)]
                    n_prefix += 1
                    check(base is not None and longer is not None and longer.startswith(base),
                          f"prefix {tname}/{cname}: render(msgs[:{k}], False) is not a prefix of "
                          f"render(msgs[:{k2}], {gen})\n  {base!r}\n  {longer!r}")

print(f"test_chat_template: {CHECKS} checks ({n_render} renderings vs jinja2 {jinja2.__version__}, "
      f"{n_prefix} prefix pairs), {len(FAILURES)} failed")
sys.exit(1 if FAILURES else 0)
