"""End-to-end tests of the llama.cpp-compatible CLI on the real default model:
llama.cpp's multi-letter flags parsed as themselves and mapped onto zack's
options (the mapped spelling gives the same greedy text as the native one),
--version, --device, -f, -sys, -e, -r, -no-cnv, -i/-cnv with -p, --color, presence and
frequency penalties, -s -1, the one-shot context-full exit status, the final
newline of raw output, outputs that never clobber and write errors on stdout,
and the smaller bad-input cases (invalid UTF-8, --kv-rate nan, --kv-budget 0)."""
import json
import os
import re
import subprocess
import tempfile

from cli_util import MODEL, ZACK, check, finish, one_line_error, pty_session, require_binary_and_model, zack

Q = "What is the capital of France? Answer in one word."


def greedy(*args, prompt=Q, n=12):
    return zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", str(n), "-p", prompt, *args)


def same_text(a_args, b_args, what, prompt=Q, n=12):
    a = greedy(*a_args, prompt=prompt, n=n)
    b = greedy(*b_args, prompt=prompt, n=n)
    check(a.returncode == 0 and b.returncode == 0 and a.stdout == b.stdout and a.stdout.strip(),
          f"{what}: same greedy text ({a.stdout!r} vs {b.stdout!r}; {a.stderr.strip()[-150:]} {b.stderr.strip()[-150:]})")
    return a


def test_llama_flags():
    # -ngl / -fa accepted, said so with -v; -ctk/-ctv q8_0 is --kv-bits 8
    r = greedy("-ngl", "99", "-fa", "-ctk", "q8_0", "-ctv", "q8_0", "-v")
    check(r.returncode == 0, f"-ngl -fa -ctk -ctv: exit 0 ({r.stderr.strip()[-200:]})")
    check("note: -ngl 99" in r.stderr and "note: -fa on" in r.stderr, "-v says what -ngl and -fa did")
    check("8-bit" in r.stderr, "-ctk/-ctv q8_0 gives the 8-bit cache")
    check(greedy("-ngl", "99").stderr.strip() == "", "-ngl without -v prints nothing")
    check("note: -fa off" in greedy("-fa", "off", "-v").stderr, "-fa takes a value")
    same_text(["-ctk", "q8_0", "-ctv", "q8_0"], ["--kv-bits", "8"], "-ctk/-ctv q8_0 = --kv-bits 8")
    same_text(["-ctk", "q4_0", "-ctv", "q4_0"], ["--kv-bits", "4"], "-ctk/-ctv q4_0 = --kv-bits 4")
    same_text(["-ctk", "f32", "-ctv", "f32"], ["--kv-type", "f32"], "-ctk/-ctv f32 = --kv-type f32")
    same_text(["--cache-type-k=q8_0", "--cache-type-v", "q8_0"], ["-ctk=q8_0", "-ctv", "q8_0"], "long names and -ctk=V")
    one_line_error(greedy("-ctk", "q8_0"), "-ctk without -ctv", "-ctk q8_0", "-ctv f16")
    one_line_error(greedy("-ctk", "q5_1", "-ctv", "q5_1"), "unsupported cache type", "q5_1", "q4_0")
    one_line_error(greedy("-ctk", "q8_0", "-ctv", "q8_0", "--kv-bits", "4"), "-ctk vs --kv-bits", "disagree")
    # llama.cpp's short flags parse as themselves, not as bundled one-letter flags
    one_line_error(zack("run", "-m", MODEL, "-nkvo", "-p", "hi"), "unknown multi-letter flag", "-nkvo", "zack run --help")
    one_line_error(zack("run", "-m", MODEL, "--frobnicate", "-p", "hi"), "unknown long flag", "--frobnicate",
                   "zack run --help")
    one_line_error(zack("eval", "-m", MODEL, "--task", "ppl", "--bogus"), "unknown eval flag", "zack eval --help")
    one_line_error(zack("bench", "-m", MODEL, "-xyz"), "unknown bench flag", "zack bench --help")
    # help groups zack's own KV flags apart from the llama.cpp spellings
    h = zack("run", "--help").stdout
    kv, llama = h.find("KV cache (zack's own flags)"), h.find("llama.cpp spellings")
    check(kv >= 0 and llama > kv and h.find("--kv-bits") in range(kv, llama) and h.find("--cache-type-k") > llama,
          "run --help: KV flags and llama.cpp spellings in their own groups")
    for flag in ["-ctk", "-ngl", "-fa", "-sys", "-cnv", "-if", "-co", "--presence-penalty", "--frequency-penalty",
                 "--reverse-prompt", "--escape", "--file", "--interactive"]:
        check(flag in h, f"run --help mentions {flag}")


def test_version():
    r = zack("--version")
    check(r.returncode == 0 and re.match(r"zack \d+\.\d+\.\d+ \(commit [0-9a-f]+", r.stdout) is not None,
          f"--version: version and commit ({r.stdout.splitlines()[:1]!r})")
    check("built for:" in r.stdout and "this CPU:" in r.stdout and "CUDA:" in r.stdout, "--version: CPU features, CUDA")
    # OpenBLAS's kernels: an SSE-era set on a CPU with AVX2 is what ggml-like/blas_core.h corrects
    # (OpenBLAS 0.3.21 takes an Emerald Rapids Xeon for a Prescott)
    blas = re.search(r"^BLAS: OpenBLAS, (\S+) kernels$", r.stdout, re.M)
    check(blas is not None, f"--version: the BLAS line ({r.stdout!r})")
    here = r.stdout.split("this CPU:")[1].splitlines()[0].split()
    if "AVX2" in here and "FMA" in here:
        check(blas.group(1) not in ("Prescott", "Core2", "Penryn", "Nehalem", "Sandybridge", "Atom"),
              f"--version: OpenBLAS runs {blas.group(1)} kernels on a CPU with AVX2 and FMA")


def test_device():
    # the backend is chosen once from --device (engine/backend.h): on this
    # machine (no GPU) the default (auto) and cpu are the CPU, silently; cuda
    # runs on the CPU after one line on stderr saying why (a build without
    # CUDA, or no CUDA device), once per run however many sessions it makes;
    # the CUDA forward pass itself is tests/simt/test_backend_cuda.cpp's
    same_text(["--device", "cpu"], [], "--device cpu = the default")
    same_text(["--device", "auto"], [], "--device auto = the default")
    cuda_why = "built without CUDA" if "not built" in zack("--version").stdout else "no CUDA device"
    r = greedy("--device", "cuda")
    base = greedy()
    check(r.returncode == 0 and r.stdout == base.stdout, "run --device cuda: runs on the CPU, same text")
    notes = [l for l in r.stderr.splitlines() if "device cuda" in l]
    check(len(notes) == 1 and cuda_why in notes[0] and "running on the CPU" in notes[0],
          f"run --device cuda: one line saying why ({notes!r})")
    r = zack("bench", "-m", MODEL, "-p", "8", "-n", "0", "--kv-bits", "16,4", "-r", "1", "--device", "cuda")
    notes = [l for l in r.stderr.replace("\r", "\n").splitlines() if "device cuda" in l]
    check(r.returncode == 0 and len(notes) == 1, f"bench --device cuda: two sessions, one line ({notes!r})")
    one_line_error(greedy("--device", "tpu"), "unknown device", "--device", "tpu")


def test_prompt_sources(tmp):
    f = os.path.join(tmp, "prompt.txt")
    with open(f, "w") as fh:
        fh.write(Q + "\n")
    a = greedy()
    b = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "12", "-f", f)
    check(b.returncode == 0 and a.stdout == b.stdout, "-f FILE = -p with the file's text (final newline dropped)")
    one_line_error(zack("run", "-m", MODEL, "-f", os.path.join(tmp, "none.txt")), "-f missing file", "none.txt")
    one_line_error(zack("run", "-m", MODEL, "-f", f, "-p", "x"), "-f and -p", "not both")
    # -sys is --system (and changes the answer)
    s1 = same_text(["-sys", "You answer in French."], ["--system", "You answer in French."], "-sys = --system")
    check(s1.stdout != a.stdout, "-sys changes the answer")
    # -e turns \n into a newline; without it the backslash stays
    e1 = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "8", "--raw", "-e", "-p", "Line one\\nLine two\\n")
    e2 = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "8", "--raw", "-p", "Line one\nLine two\n")
    e3 = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "8", "--raw", "-p", "Line one\\nLine two\\n")
    check(e1.returncode == 0 and e1.stdout == e2.stdout, "-e: escapes become the characters")
    check(e3.stdout != e1.stdout, "without -e the backslashes stay")
    # -no-cnv is --raw
    same_text(["-no-cnv"], ["--raw"], "-no-cnv = --raw", prompt="The capital of France is", n=8)
    # invalid UTF-8 in a prompt: one line, not dropped silently
    r = subprocess.run([ZACK, "run", "-m", MODEL, "-p", b"caf\xe9 au lait"], capture_output=True)
    lines = [l for l in r.stderr.decode(errors="replace").splitlines() if l.strip()]
    check(r.returncode != 0 and len(lines) == 1 and "UTF-8" in lines[0] and "offset 3" in lines[0],
          f"invalid UTF-8 prompt: one line naming the byte ({lines!r})")


def test_generation_controls():
    # -r stops at the reverse prompt, which is printed; -v names the stop
    r = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "64", "--raw", "-p", "1, 2, 3, 4, 5,", "-r", " 9", "-v")
    check(r.returncode == 0 and r.stdout.rstrip("\n").endswith(" 9") and "stop: reverse prompt" in r.stderr,
          f"-r: stops right after the text ({r.stdout!r})")
    # presence / frequency penalties: a reply that repeats itself greedily repeats less
    def repeats(text):
        words = text.split()
        return len(words) - len(set(words))
    rep = "Cats are so cute. Cats are so cute. Cats are so cute."
    base = greedy("--raw", prompt=rep, n=40)
    for flags in (["--presence-penalty", "1.5"], ["--frequency-penalty", "1"]):
        pen = greedy("--raw", *flags, prompt=rep, n=40)
        check(base.returncode == 0 and pen.returncode == 0 and repeats(pen.stdout) < repeats(base.stdout) / 2,
              f"{flags[0]}: fewer repeated words ({repeats(base.stdout)} -> {repeats(pen.stdout)}: {pen.stdout!r})")
    one_line_error(greedy("--presence-penalty", "nan"), "presence penalty nan", "presence")
    # -s -1: random seed, printed with -v, and that seed reproduces the text
    runs = [zack("run", "-m", MODEL, "-t", "2", "--temp", "1", "-n", "12", "-p", "Tell me a story.", "-s", "-1", "-v")
            for _ in range(3)]
    check(len({r.stdout for r in runs}) > 1, "-s -1: three runs are not all the same text")
    m = re.search(r"seed (\d+) \(random\)", runs[0].stderr)
    check(m is not None, "-s -1 -v prints the seed used")
    if m:
        again = zack("run", "-m", MODEL, "-t", "2", "--temp", "1", "-n", "12", "-p", "Tell me a story.", "-s", m.group(1))
        check(again.stdout == runs[0].stdout, "the printed seed reproduces the text")
    one_line_error(greedy("-s", "abc"), "bad seed", "seed")
    # raw output: exactly the continuation into a pipe; on a terminal a final newline follows
    args = ["run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "2", "--raw", "-p", "The capital of France is"]
    r = zack(*args)
    s = pty_session(args)
    status = s.wait(120)
    shown = s.out.decode(errors="replace").replace("\r\n", "\n")
    check(r.returncode == 0 and r.stdout.strip() and not r.stdout.endswith("\n") and os.WEXITSTATUS(status) == 0
          and shown == r.stdout + "\n", f"raw: a final newline on a terminal only ({r.stdout!r}, {shown!r})")


def test_context_full_and_chat_flags():
    # a one-shot reply that runs out of context: text printed, a line on stderr, exit 3
    r = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-c", "64", "-p", "Write a very long story about a dragon.")
    check(r.returncode == 3 and r.stdout.strip() and "context full" in r.stderr,
          f"-p out of context: exit 3 and says so ({r.returncode}, {r.stderr.strip()[-200:]!r})")
    r = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-c", "32", "--raw", "-p", "Once upon a time")
    check(r.returncode == 3 and r.stdout.strip() and "context full" in r.stderr, "--raw out of context: exit 3")
    # -i / -cnv with -p: the prompt is the first turn, then the chat goes on from stdin
    for flag in ["-i", "-cnv", "--interactive-first"]:
        r = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "24", flag, "-p", "My name is Alice.", "-v",
                 stdin="What is my name?\n")
        check(r.returncode == 0 and r.stderr.count("[prompt:") == 2, f"{flag} -p: prompt turn + a chat turn")
    one_line_error(zack("run", "-m", MODEL, "-i", "--raw", "-p", "x"), "-i with --raw", "raw")
    # --color on colours the prompt and input; bad values refused
    r = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "4", "-co", stdin="Hi\n")
    check(r.returncode == 0 and "\x1b[" in r.stderr and "\x1b[" not in r.stdout, "-co: colours on stderr only")
    r = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "4", stdin="Hi\n")
    check("\x1b[" not in r.stderr, "no colour by default")
    one_line_error(zack("run", "-m", MODEL, "--color", "pink", "-p", "x"), "bad --color", "color")


def test_outputs(tmp):
    # stdout write errors: one line, non-zero
    with open("/dev/full", "w") as full:
        r = zack("run", "-m", MODEL, "-t", "2", "--temp", "0", "-n", "4", "-p", "Hi", stdout=full)
        one_line_error(r, "run > /dev/full", "standard output")
        one_line_error(zack("info", MODEL, stdout=full), "info > /dev/full", "standard output")
        one_line_error(zack("--version", stdout=full), "--version > /dev/full", "standard output")
    # the smaller KV flag cases
    one_line_error(greedy("--kv-rate", "nan"), "--kv-rate nan", "kv-rate")
    one_line_error(greedy("--kv-budget", "0"), "--kv-budget without --kv-evict", "kv-evict")
    # calibrate -o refuses a device and a directory before any work, writing nothing
    before = os.stat("/dev/full")
    one_line_error(zack("calibrate", "-m", MODEL, "-o", "/dev/full", "--tokens", "64"), "calibrate -o /dev/full",
                   "character device")
    after = os.stat("/dev/full")
    check(before.st_rdev == after.st_rdev and os.path.exists("/dev/full") and not os.path.isfile("/dev/full"),
          "/dev/full is still the device")
    one_line_error(zack("calibrate", "-m", MODEL, "-o", tmp, "--tokens", "64"), "calibrate -o DIR", "directory")
    link = os.path.join(tmp, "model_link.zack")
    os.symlink(os.path.abspath(MODEL), link)
    one_line_error(zack("calibrate", "-m", MODEL, "-o", link, "--tokens", "64"), "calibrate -o a link to the source",
                   "overwrite the source")


def main():
    require_binary_and_model()
    with tempfile.TemporaryDirectory() as tmp:
        test_llama_flags()
        test_version()
        test_device()
        test_prompt_sources(tmp)
        test_generation_controls()
        test_context_full_and_chat_flags()
        test_outputs(tmp)
    finish()


if __name__ == "__main__":
    main()
