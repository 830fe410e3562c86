#!/usr/bin/env bash
# Runs the whole test suite: set-up (idempotent), the GGUF reader's tests under
# AddressSanitizer + UBSan, then every ctest test (GoogleTest units and python
# reference tests on the real default model); ctest's summary is the last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
build="${ZACK_BUILD_DIR:-$here/build}"
bash "$here/.ci/sanitize.sh"
ctest --test-dir "$build" --output-on-failure -j2 --timeout 1200
