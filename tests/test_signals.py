"""Signals on the real `zack` binary and default model: Ctrl-C (SIGINT) in
calibrate, eval and bench exits 130 and leaves no output file and no temporary
(calibrate is interrupted while it writes its .zack: the signal is sent as soon
as the temporary file appears); a closed stdout (SIGPIPE, `zack ... | head`)
ends the process quietly. ggml-like/interrupt.h describes the handlers."""
import os
import signal
import subprocess
import sys
import tempfile
import time

ZACK = os.environ.get("ZACK_BIN", "")
MODEL = os.environ.get("ZACK_MODEL", "")
SOURCE = os.environ.get("ZACK_SOURCE", os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def start(*args):
    return subprocess.Popen([ZACK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def interrupt_when(p, ready, what, limit=600):
    """Sends SIGINT once ready() holds (polled every 0.5 ms); returns (code, stderr)."""
    t0 = time.time()
    while not ready():
        if p.poll() is not None:
            check(False, f"{what}: still running when interrupted (exited {p.returncode} first)")
            return p.returncode, p.stderr.read().decode(errors="replace")
        if time.time() - t0 > limit:
            p.kill()
            check(False, f"{what}: the moment to interrupt never came")
            return None, ""
        time.sleep(0.0005)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=120)
    return p.returncode, err.decode(errors="replace")


def expect_interrupted(code, err, d, what):
    check(code == 130, f"{what}: exit status 130 (got {code})")
    check("zack: interrupted" in err, f"{what}: says it was interrupted ({err.strip().splitlines()[-1:]!r})")
    check("Sanitizer" not in err and "Segmentation" not in err, f"{what}: no crash")
    left = sorted(os.listdir(d))
    check(left == [], f"{what}: no output file or temporary left (found {left})")


def main():
    if not ZACK or not os.path.exists(ZACK):
        sys.exit(f"FAIL: zack binary not found (ZACK_BIN={ZACK!r}); build first")
    if not MODEL or not os.path.exists(MODEL):
        sys.exit(f"FAIL: default model missing at {MODEL!r}; run scripts/fetch_model.sh")
    corpus = os.path.join(SOURCE, "tests", "data", "calib", "apache-2.0.txt")
    text = os.path.join(SOURCE, "tests", "data", "eval", "gpl3_preamble.txt")

    # --- calibrate: Ctrl-C while the .zack is being written (its temporary exists)
    with tempfile.TemporaryDirectory() as d:
        p = start("calibrate", "-m", MODEL, "-o", os.path.join(d, "out.zack"), "--corpus", corpus,
                  "--tokens", "128", "--ctx", "64", "-t", "2", "-q")
        # file_out's temporary: any name in the directory but out.zack itself
        code, err = interrupt_when(p, lambda: any(f != "out.zack" for f in os.listdir(d)), "calibrate")
        expect_interrupted(code, err, d, "calibrate interrupted while writing")

    # --- eval: Ctrl-C once the first progress line shows the run is under way
    with tempfile.TemporaryDirectory() as d, tempfile.TemporaryDirectory() as logs:
        log = os.path.join(logs, "stderr")
        with open(log, "wb") as errf:
            p = subprocess.Popen([ZACK, "eval", "-m", MODEL, "--task", "ppl", "--data", text, "-c", "64", "-t", "2",
                                  "--kv-bits", "4", "--json", os.path.join(d, "out.json"),
                                  "--plot", os.path.join(d, "out.svg")], stdout=subprocess.PIPE, stderr=errf)
            t0 = time.time()
            while b"baseline" not in open(log, "rb").read() and p.poll() is None and time.time() - t0 < 600:
                time.sleep(0.001)
            running = p.poll() is None
            p.send_signal(signal.SIGINT)
            p.communicate(timeout=120)
        check(running, "eval: still running when interrupted")
        expect_interrupted(p.returncode, open(log, "rb").read().decode(errors="replace"), d, "eval interrupted")

    # --- bench: Ctrl-C a second into the measurements
    with tempfile.TemporaryDirectory() as d:
        p = start("bench", "-m", MODEL, "-p", "256", "-n", "64", "-r", "5", "-t", "2")
        t0 = time.time()
        code, err = interrupt_when(p, lambda: time.time() - t0 > 1.0, "bench")
        expect_interrupted(code, err, d, "bench interrupted")

    # --- SIGPIPE: the reader goes away after a few bytes; zack ends without a word
    for what, args in (("info", ["info", MODEL]),
                       ("run", ["run", "-m", MODEL, "-p", "Count from one to fifty.", "-n", "200", "--temp", "0",
                                "-t", "2"])):
        p = subprocess.Popen([ZACK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = p.stdout.read(3)
        p.stdout.close()  # like `| head -c 3`
        err = p.stderr.read().decode(errors="replace")
        p.wait(timeout=300)
        check(len(first) == 3, f"{what} | head: output started ({first!r})")
        # Killed by SIGPIPE at its next write, or done already if all of it fit in the pipe.
        check(p.returncode in (-signal.SIGPIPE, 0), f"{what} | head: ends by SIGPIPE or done (status {p.returncode})")
        check(err.strip() == "", f"{what} | head: nothing on stderr (got {err.strip()[:200]!r})")

    if failures:
        sys.exit(f"{len(failures)} check(s) failed")
    print("all signal checks passed")


if __name__ == "__main__":
    main()
