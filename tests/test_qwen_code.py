#!/usr/bin/env python3
"""`zack run` on Qwen2.5-Coder-1.5B answers coding requests with code that runs.

For each task: `zack run -m $ZACK_MODEL_QWEN15 -p REQUEST -n 160 --temp 0` (greedy,
the model's own chat template: ChatML with Qwen's default system text), then the
first ``` code block of the reply is executed in a separate interpreter and the
function it defines is called on several inputs; each result must equal what the
test's own implementation of the specification returns.

The generated code runs in `python3 -I` (isolated: no PYTHON* variables, no user
site, no script directory on sys.path) with a temporary directory as cwd and its
only content, a minimal environment, a 20 s wall-clock timeout and resource limits
(10 s CPU, 1 GiB address space, 1 MiB file size); no network use is expected.

Env: ZACK_MODEL_QWEN15, ZACK_BIN (or ZACK_BUILD). Fails when either is missing.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

N_PREDICT = 160


def ref_is_palindrome(s):
    t = [c.lower() for c in s if c.isalnum()]
    return t == t[::-1]


def ref_flatten(items):
    out = []
    for x in items:
        out.extend(ref_flatten(x) if isinstance(x, list) else [x])
    return out


TASKS = [
    dict(name="is_palindrome",
         request=("Write a Python function is_palindrome(s) that returns True if the string s reads the same "
                  "forwards and backwards when only letters and digits are considered, ignoring case, and "
                  "False otherwise. Reply with only the code in one Python code block."),
         ref=ref_is_palindrome,
         inputs=[["A man, a plan, a canal: Panama"], ["race a car"], [""], ["No 'x' in Nixon"],
                 ["12321"], ["123 21x"], ["Was it a car or a cat I saw?"], ["ab"]]),
    dict(name="flatten",
         request=("Write a Python function flatten(items) that takes a list which may contain nested lists "
                  "(to any depth) and returns a flat list of all the non-list elements in their original "
                  "order. Reply with only the code in one Python code block."),
         ref=ref_flatten,
         inputs=[[[1, [2, [3, [4]], 5], 6]], [[]], [[[], [[]], "a"]], [["x", ["y", ["z"]], 0, None]],
                 [[[[[[7]]]], 8]]]),
]

# Runs in the sandboxed interpreter: executes the answer, calls the function on
# each input, prints a JSON list of results (or of error texts).
HARNESS = r'''
import json, sys
src = open("answer.py", encoding="utf-8").read()
ns = {"__name__": "answer"}
exec(compile(src, "answer.py", "exec"), ns)
fn = ns[sys.argv[1]]
out = []
for args in json.loads(open("inputs.json", encoding="utf-8").read()):
    try:
        out.append({"ok": True, "value": fn(*args)})
    except Exception as e:
        out.append({"ok": False, "value": "%s: %s" % (type(e).__name__, e)})
print(json.dumps(out))
'''


def limits():
    import resource
    resource.setrlimit(resource.RLIMIT_CPU, (10, 10))
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))


def extract_code(reply: str):
    """The first fenced code block (```python or bare ```), or None."""
    m = re.search(r"```[A-Za-z0-9_+-]*[ \t]*\n(.*?)```", reply, re.S)
    return m.group(1) if m else None


def run_answer(code: str, fn_name: str, inputs):
    with tempfile.TemporaryDirectory(prefix="zack_code_") as tmp:
        Path(tmp, "answer.py").write_text(code, encoding="utf-8")
        Path(tmp, "harness.py").write_text(HARNESS, encoding="utf-8")
        Path(tmp, "inputs.json").write_text(json.dumps(inputs), encoding="utf-8")
        try:
            r = subprocess.run([sys.executable, "-I", "harness.py", fn_name], cwd=tmp, capture_output=True,
                               text=True, timeout=20, preexec_fn=limits,
                               env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
        except subprocess.TimeoutExpired:
            return None, "the answer's code did not finish within 20 s"
    if r.returncode != 0:
        return None, f"the answer's code failed (exit {r.returncode}): {r.stderr.strip()[-600:]}"
    try:
        return json.loads(r.stdout.strip().splitlines()[-1]), None
    except (ValueError, IndexError):
        return None, f"the harness printed no results: {r.stdout[-300:]!r} {r.stderr[-300:]!r}"


def main() -> int:
    model = os.environ.get("ZACK_MODEL_QWEN15")
    zbin = os.environ.get("ZACK_BIN") or (os.environ.get("ZACK_BUILD", "") + "/zack")
    if not model or not Path(model).is_file():
        print(f"FAIL: model file not found: ZACK_MODEL_QWEN15={model!r} "
              f"(run scripts/fetch_model.sh qwen2.5-coder-1.5b)")
        return 1
    if not Path(zbin).is_file():
        print(f"FAIL: zack executable not found: {zbin!r} (set ZACK_BIN or ZACK_BUILD)")
        return 1
    errors = []
    for task in TASKS:
        t0 = time.time()
        cmd = [zbin, "run", "-m", model, "-p", task["request"], "-n", str(N_PREDICT), "--temp", "0", "-t", "2"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        reply = r.stdout
        print(f"--- {task['name']}: zack run exited {r.returncode} after {time.time() - t0:.1f} s; reply:\n{reply}")
        if r.returncode != 0:
            errors.append(f"{task['name']}: zack run exited {r.returncode}: {r.stderr.strip()[-400:]}")
            continue
        code = extract_code(reply)
        if code is None:
            errors.append(f"{task['name']}: no complete ``` code block in the reply")
            continue
        results, err = run_answer(code, task["name"], task["inputs"])
        if err:
            errors.append(f"{task['name']}: {err}")
            continue
        n_ok = 0
        for args, res in zip(task["inputs"], results):
            want = task["ref"](*args)
            if res["ok"] and res["value"] == want:
                n_ok += 1
            else:
                errors.append(f"{task['name']}{tuple(args)!r}: returned {res['value']!r}, expected {want!r}")
        print(f"    {n_ok}/{len(task['inputs'])} inputs give the expected result")
    if errors:
        print("\nFAILURES:")
        for e in errors:
            print("  - " + e)
        return 1
    print("test_qwen_code: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
