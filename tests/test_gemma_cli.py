#!/usr/bin/env python3
"""Gemma 3 end to end through the CLI (gemma3-270m-it Q4_K_M, ZACK_MODEL_GEMMA):

  * run: chat mode uses the Gemma template by default (the GGUF carries no
    tokenizer.chat_template: the architecture table names it), i.e. its greedy
    reply is identical to the one with --chat-template gemma, and differs from
    --chat-template chatml; the reply is non-empty text;
  * run on a 4-bit cache with H2O eviction produces text;
  * eval --task ppl on a window of 600 tokens (its scored second half reaches
    past the 512-token sliding window): a finite perplexity within 5-40 on a
    licence text (llama.cpp's own tool is not run here, the model-level
    comparison is test_gemma_ref.py), and a 4-bit cache within 5% of it;
  * bench: prefill and decode rows with positive speeds (JSON);
  * calibrate on 512 tokens (with the sensitivity pass and the rank-weight fit
    on 256 tokens set aside; no layer gains, which by default run only with
    --kv-target) writes a .zack; at --kv-rate 0 its perplexity is
    within 2% of the GGUF's and at --kv-rate 0.3 (one window) the cache is smaller;
  * an unknown architecture is one line naming the supported ones.
"""
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli_util  # noqa: E402
from cli_util import check, one_line_error, zack  # noqa: E402

GEMMA = os.environ.get("ZACK_MODEL_GEMMA", "")
DATA = Path(__file__).resolve().parent / "data" / "tokenizer"


def eval_ppl(model, *extra, tmp, chunks=1):
    out = Path(tmp) / "eval.json"
    r = zack("eval", "-m", model, "--task", "ppl", "-f", DATA / "license_GPL-3.txt", "-c", "600", "--chunks", chunks,
             "-t", "2", "--json", out, *extra)
    if not check(r.returncode == 0, f"eval {' '.join(map(str, extra))} exits 0 ({r.stderr.strip()[-300:]})"):
        return None
    d = json.loads(out.read_text())
    runs = {x["config"]["name"]: x for x in d["runs"]}
    return d["baseline"]["value"], {k: (v["value"], v["kv"]["bytes_per_token"]) for k, v in runs.items()}, \
        d["baseline"]["kv"]["bytes_per_token"]


def main():
    if not cli_util.ZACK or not os.path.exists(cli_util.ZACK):
        sys.exit(f"FAIL: zack binary not found (ZACK_BIN={cli_util.ZACK!r})")
    if not GEMMA or not os.path.exists(GEMMA):
        sys.exit(f"FAIL: model missing: ZACK_MODEL_GEMMA={GEMMA!r} (run scripts/fetch_model.sh gemma3-270m)")
    prompt = "Write one sentence about the sea."
    common = ["-p", prompt, "-n", "24", "--temp", "0", "-t", "2"]
    r_def = zack("run", "-m", GEMMA, *common)
    r_gem = zack("run", "-m", GEMMA, *common, "--chat-template", "gemma")
    r_cml = zack("run", "-m", GEMMA, *common, "--chat-template", "chatml")
    check(r_def.returncode == 0 and r_gem.returncode == 0, f"run exits 0 ({r_def.stderr.strip()[-200:]})")
    check(r_def.stdout.strip() != "", f"run replies with text: {r_def.stdout.strip()[:120]!r}")
    check(r_def.stdout == r_gem.stdout, "the default chat template is Gemma's")
    check(r_def.stdout != r_cml.stdout, "and not ChatML's")

    r = zack("run", "-m", GEMMA, "--raw", "-p", "Once upon a time", "-n", "24", "--temp", "0", "-t", "2",
             "--kv-bits", "4", "--kv-evict", "h2o", "--kv-budget", "64")
    check(r.returncode == 0 and len(r.stdout.split()) >= 5,
          f"run with a 4-bit cache and H2O eviction: {r.stdout.strip()[:120]!r} {r.stderr.strip()[-200:]}")

    with tempfile.TemporaryDirectory(prefix="zack_gemma_cli_") as tmp:
        res = eval_ppl(GEMMA, "--kv-bits", "4", tmp=tmp)
        if res:
            base, runs, _ = res
            check(5 < base < 40, f"eval ppl of the GGUF {base:.4f} is within 5-40")
            q4 = runs.get("--kv-bits 4")
            check(q4 is not None and abs(q4[0] / base - 1) < 0.05, f"4-bit cache ppl {q4} within 5% of {base:.4f}")

        out = Path(tmp) / "bench.json"
        r = zack("bench", "-m", GEMMA, "-p", "64", "-n", "8", "-r", "1", "-t", "2", "-o", "json")
        if check(r.returncode == 0, f"bench exits 0 ({r.stderr.strip()[-200:]})"):
            rows = json.loads(r.stdout)["results"]
            tests = {x["test"] for x in rows}
            check({"pp64", "tg8"} <= tests and all(x["tokens_per_s"] > 0 for x in rows),
                  f"bench has pp64 and tg8 rows with positive speeds ({sorted(tests)})")

        zk = Path(tmp) / "g.zack"
        r = zack("calibrate", "-m", GEMMA, "-o", zk, "--corpus", DATA / "license_Apache-2.0.txt",
                 "--tokens", "512", "--ctx", "256", "--sens-tokens", "256", "--fit-tokens", "256", "-t", "2")
        if check(r.returncode == 0 and zk.is_file(), f"calibrate writes a .zack ({r.stderr.strip()[-300:]})"):
            check("rank losses weigh" in r.stderr, "calibrate ran the rank-weight fit")
            # the layer gains (test_calib_e2e.py's) run by default only where plans are recorded
            check("layers cost other than" not in r.stderr, "and no layer gains without --kv-target")
            res = eval_ppl(zk, "--kv-rate", "0", tmp=tmp)
            res3 = eval_ppl(zk, "--kv-rate", "0.3", tmp=tmp)
            if res and res3:
                base, runs, full_bytes = res
                r0 = runs["--kv-rate 0"][0]
                check(abs(r0 / base - 1) < 0.02, f".zack at rate 0: ppl {r0:.4f} within 2% of {base:.4f}")
                v3, b3 = res3[1]["--kv-rate 0.3"]
                check(b3 < 0.8 * full_bytes, f".zack at rate 0.3: {b3:.0f} bytes/token < 0.8 x {full_bytes:.0f} "
                      f"(ppl {v3:.4f})")

        # an architecture zack does not know: the GGUF with general.architecture renamed
        import gguf
        bad = Path(tmp) / "unknown.gguf"
        w = gguf.GGUFWriter(str(bad), "mamba")
        w.add_string("mamba.placeholder", "x")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        one_line_error(zack("run", "-m", bad, "-p", "hi"), "unknown architecture", "mamba", "llama, qwen2, gemma3")
    cli_util.finish()


if __name__ == "__main__":
    main()
