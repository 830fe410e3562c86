#!/usr/bin/env python3
"""End-to-end tests of `zack eval --task code` on the real default model: the CLI
with a few problems in raw and chat mode, the JSON fields and per-problem results,
the baseline against itself (the same completions and verdicts), the refusal to
run without bubblewrap, malformed data named by file and line, and the shipped
problems.jsonl being what tests/data/code/make_problems.py writes.

Env: ZACK_BIN (the zack CLI), ZACK_MODEL (default model), ZACK_SOURCE (repo root).
Exits non-zero on any failure, with a summary."""
import json
import os
import subprocess
import sys
import tempfile

from cli_util import MODEL, ZACK as BIN, check, require_binary_and_model, run_tests

SRC = os.environ.get("ZACK_SOURCE", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
CODE = os.path.join(SRC, "tests", "data", "code")
PROBLEMS = os.path.join(CODE, "problems.jsonl")
TMP = tempfile.mkdtemp(prefix="zack_eval_code_")


def run(args, env=None):
    cmd = [BIN, "eval", "-m", MODEL, "-t", "2", "-q", "--task", "code"] + args
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)


def run_json(name, args):
    path = os.path.join(TMP, name + ".json")
    p = run(args + ["--json", path])
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (name, p.returncode, p.stderr[-2000:]))
    with open(path) as f:
        j = json.load(f)
    check(j["task"] == "code", "%s: task is code" % name)
    check("pass@1" in p.stdout and "% of base" in p.stdout, "%s: table on stdout" % name)
    return j


def first_ids(n):
    with open(PROBLEMS) as f:
        return [json.loads(line)["id"] for line in f][:n]


def check_point(name, point, n, is_baseline):
    check(point["metric"] == "pass@1" and point["higher_is_better"], "%s: metric pass@1" % name)
    check(point["n_items"] == n, "%s: %d items" % (name, n))
    d = point["detail"]
    probs = d["problems"]
    check([p["id"] for p in probs] == first_ids(n), "%s: problems in file order" % name)
    for p in probs:
        for k in ("id", "passed", "result", "generated_tokens", "completion"):
            check(k in p, "%s: problem %s has field %s" % (name, p.get("id"), k))
        check((p["result"] == "passed") == p["passed"], "%s: %s result agrees with passed" % (name, p["id"]))
        check(1 <= p["generated_tokens"] <= d["max_tokens"], "%s: %s token count in range" % (name, p["id"]))
    n_passed = sum(p["passed"] for p in probs)
    check(d["n_passed"] == n_passed and abs(point["value"] - n_passed / n) < 1e-12,
          "%s: pass@1 = passed / items" % name)
    check("bubblewrap" in d["sandbox"] and " as uid " in d["sandbox"], "%s: sandbox described" % name)
    if not is_baseline:
        for k in ("same_verdict_as_baseline", "same_completion_as_baseline"):
            check(0.0 <= d[k] <= 1.0, "%s: %s in [0, 1]" % (name, k))
    return d


def test_raw_against_itself():
    n = 3
    j = run_json("raw", ["--data", PROBLEMS, "--limit", str(n), "--code-prompt", "raw", "--kv-type", "f16"])
    check(j["settings"]["code"]["prompt"] == "raw", "raw: settings name the prompt mode")
    b = check_point("raw baseline", j["baseline"], n, True)
    check(b["prompt"] == "raw", "raw: detail names the prompt mode")
    check(len(j["runs"]) == 1, "raw: one compared configuration")
    r = j["runs"][0]
    check(r["config"]["flags"] == {"--kv-type": "f16"}, "raw: the run carries its flags")
    d = check_point("raw f16", r, n, False)
    check(d["same_completion_as_baseline"] == 1.0 and d["same_verdict_as_baseline"] == 1.0,
          "raw: the uncompressed cache repeats the baseline's completions")
    check(r["retention"] == 1.0, "raw: 100% of baseline")


def test_chat_compressed():
    n = 2
    j = run_json("chat", ["--data", PROBLEMS, "--limit", str(n), "--code-prompt", "chat", "--code-max-tokens", "96",
                          "--kv-bits", "4"])
    check(j["settings"]["code"]["prompt"] == "chat", "chat: settings name the prompt mode")
    b = check_point("chat baseline", j["baseline"], n, True)
    check(b["prompt"] == "chat" and b["max_tokens"] == 96, "chat: detail names mode and token cap")
    check(j["runs"][0]["config"]["flags"] == {"--kv-bits": "4"}, "chat: the 4-bit run carries its flags")
    check_point("chat 4-bit", j["runs"][0], n, False)


def test_refuses_without_bubblewrap():
    env = dict(os.environ, PATH="/nonexistent")
    p = run(["--data", PROBLEMS, "--limit", "1"], env=env)
    lines = p.stderr.strip().splitlines()
    check(p.returncode != 0, "no bwrap: non-zero exit")
    check(len(lines) == 1 and "bwrap" in lines[0], "no bwrap: one line naming bwrap (%r)" % p.stderr[-300:])


def test_bad_data():
    bad = os.path.join(TMP, "bad.jsonl")
    with open(PROBLEMS) as f:
        good = f.readline()
    with open(bad, "w") as f:
        f.write(good + '{"id": "x", "prompt": "def f():\\n", "entry_point": "f"}\n')
    p = run(["--data", bad])
    check(p.returncode != 0 and (bad + ":2:") in p.stderr and "tests" in p.stderr,
          "bad data: error names file:line and the field (%r)" % p.stderr[-300:])
    p = run([])
    check(p.returncode != 0 and "--data" in p.stderr, "no data: asks for --data")
    p = run(["--data", PROBLEMS, "--code-prompt", "fim"])  # neither raw nor chat
    check(p.returncode != 0 and "code-prompt" in p.stderr, "unknown prompt mode refused")


def test_problems_up_to_date():
    p = subprocess.run([sys.executable, os.path.join(CODE, "make_problems.py"), "--check"], capture_output=True,
                       text=True)
    check(p.returncode == 0, "problems.jsonl matches make_problems.py (%s)" % (p.stderr or p.stdout).strip())


def main():
    require_binary_and_model()
    tests = [test_problems_up_to_date, test_bad_data, test_refuses_without_bubblewrap, test_raw_against_itself,
             test_chat_compressed]
    return run_tests(tests, "code eval")


if __name__ == "__main__":
    sys.exit(main())
