#!/usr/bin/env bash
# Runs the whole test suite: set-up (idempotent), every ctest test (GoogleTest units
# and python reference tests on the real default model), then the GGUF reader's
# tests again under AddressSanitizer + UBSan.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$here/scripts/setup.sh"
build="${ZACK_BUILD_DIR:-$here/build}"
ctest --test-dir "$build" --output-on-failure -j2 --timeout 1200
bash "$here/.ci/sanitize.sh"
