"""Shared helpers of the end-to-end CLI tests (test_cli_compat.py, test_chat.py,
test_eval_cli.py, test_eval_code.py): the zack binary and default model from the
environment, checks that collect failures, a runner of test functions,
one-line-error checks, and a pseudo-terminal driver."""
import os
import pty
import select
import subprocess
import sys
import time

ZACK = os.environ.get("ZACK_BIN", "")
MODEL = os.environ.get("ZACK_MODEL", "")
failures = []


def require_binary_and_model():
    if not ZACK or not os.path.exists(ZACK):
        sys.exit(f"FAIL: zack binary not found (ZACK_BIN={ZACK!r}); build first")
    if not MODEL or not os.path.exists(MODEL):
        sys.exit(f"FAIL: default model missing at {MODEL!r}; run scripts/fetch_model.sh")


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what, flush=True)
    if not cond:
        failures.append(what)
    return cond


def zack(*args, stdin=None, timeout=300, env=None, stdout=subprocess.PIPE):
    """Runs zack with text I/O; bytes arguments are passed through unchanged."""
    args = [a if isinstance(a, bytes) else str(a) for a in args]
    return subprocess.run([ZACK, *args], input=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True,
                          errors="replace", timeout=timeout, env=env)


def one_line_error(r, what, *needles):
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    check(r.returncode != 0, f"{what}: exits non-zero (got {r.returncode})")
    check(len(lines) == 1, f"{what}: exactly one line on stderr (got {lines!r})")
    for n in needles:
        check(bool(lines) and n.lower() in lines[0].lower(), f"{what}: message mentions '{n}' ({lines[:1]!r})")
    check("Assertion" not in r.stderr and "Segmentation" not in r.stderr, f"{what}: no crash")


def run_tests(tests, what):
    """Runs each test function in turn (one that raises is a failure, never a
    skip), then reports every failure check() collected; returns the exit status."""
    for t in tests:
        try:
            t()
            print("ran", t.__name__)
        except Exception as e:
            failures.append(f"{t.__name__} raised {e}")
            print("FAIL:", t.__name__, e)
    if failures:
        print(f"\n{len(failures)} check(s) failed:")
        for f in failures:
            print("  -", f)
        return 1
    print(f"all {what} checks passed ({len(tests)} tests)")
    return 0


def finish():
    if failures:
        print(f"FAILED: {len(failures)} check(s):")
        for f in failures:
            print("  - " + f)
        sys.exit(1)
    print("all checks passed")


class pty_session:
    """zack in a pseudo-terminal: send keys, wait for output."""

    def __init__(self, args, env=None):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execve(ZACK, [ZACK, *args], env if env is not None else os.environ)
        self.out = b""

    def send(self, data):
        os.write(self.fd, data if isinstance(data, bytes) else data.encode())

    def read_until(self, needle, seconds=120, start=0):
        """Reads until `needle` appears in the output after offset `start`; True if it did."""
        needle = needle if isinstance(needle, bytes) else needle.encode()
        end = time.time() + seconds
        while time.time() < end:
            if needle in self.out[start:]:
                return True
            r, _, _ = select.select([self.fd], [], [], 0.2)
            if r:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:
                    return needle in self.out[start:]
                if not chunk:
                    return needle in self.out[start:]
                self.out += chunk
        return needle in self.out[start:]

    def wait(self, seconds=60):
        end = time.time() + seconds
        while time.time() < end:
            self.read_until(b"\x00never", 0.5)
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return status
        os.kill(self.pid, 9)
        return os.waitpid(self.pid, 0)[1]
