#!/usr/bin/env bash
# Builds the GGUF reader/writer test and the output-file test with AddressSanitizer
# + UBSan in their own build directory (build-asan) and runs them: the
# corrupted-file tests must never read out of bounds. Exits non-zero on a build failure, a test failure or a sanitizer report.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=build-asan
cmake -S . -B "$build" -DZACK_SANITIZE=ON -DZACK_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
cmake --build "$build" -j2 --target test_gguf test_file_out

# Any sanitizer report fails the run.
export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export ZACK_MODEL="${ZACK_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
"$build/tests/test_gguf"
"$build/tests/test_file_out"
