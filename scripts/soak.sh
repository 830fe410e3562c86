#!/usr/bin/env bash
# Long-run soak on the tiny random model (tests/test_soak.cpp): a chat of N
# generated tokens (-c 512, H2O eviction, /clear when the context is full) with
# the heap, the allocation rate and RSS checked flat after warm-up, and every KV
# cache layout decoding M tokens within its accounted budget. ctest runs it with
# N = 10,000 and M = 5,000; this runs it longer:
#   scripts/soak.sh [--tokens N] [--layout-tokens M]     (default 100000 and 20000)
# Uses the plain build in build/ (scripts/setup.sh makes it).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tokens=100000 layout=20000
while [ $# -gt 0 ]; do
    case "$1" in
        --tokens) tokens="$2"; shift ;;
        --layout-tokens) layout="$2"; shift ;;
        -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
        *) echo "soak.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
build="${ZACK_BUILD_DIR:-$here/build}"
cmake --build "$build" -j"$(nproc)" --target test_soak >&2
ZACK_SOAK_TOKENS="$tokens" ZACK_SOAK_LAYOUT_TOKENS="$layout" "$build/tests/test_soak"
