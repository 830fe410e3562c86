#!/usr/bin/env bash
# Runs the whole test suite: set-up (idempotent), the unit tests under
# AddressSanitizer + UBSan (while the set-up's larger models download), then
# every ctest test (GoogleTest units and python
# reference tests on the real default model); ctest's summary is the last line.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZACK_BUILD_DIR:-$here/build}"
# the sanitizer stage runs while setup's larger models still download
bash "$here/scripts/setup.sh" --then "$here/.ci/sanitize.sh"
ctest --test-dir "$build" --output-on-failure -j2 --timeout 1200
