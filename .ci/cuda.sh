#!/usr/bin/env bash
# The CUDA part of CI: builds the CUDA variant's kernels (kernels/cuda with
# nvcc for sm_80 + sm_90 + compute_80 PTX, every warning an error) in
# build-cuda, prints each kernel's registers, shared memory, stack frame and
# spills per architecture (ptxas -v), and fails if an attention kernel spills.
# The GPU tests of that build need a device; without one they report "not run".
# Set ZACK_CUDA_FULL=1 to also build them (zack_core again, several minutes).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# device pointers that start null in the harness but are garbage under nvcc
python3 scripts/cuda_lint.py
build="${ZACK_CUDA_BUILD_DIR:-build-cuda}"
nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [ ! -x "$nvcc" ]; then
    echo "cuda: no nvcc on this machine; the CUDA build was not checked" >&2
    exit "${ZACK_REQUIRE_CUDA:-0}"
fi
SECONDS=0
cmake -S . -B "$build" -DZACK_CUDA=ON -DZACK_CUDA_PTXAS_VERBOSE=ON -DZACK_BENCH=OFF \
    -DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_BUILD_TYPE=Release >/dev/null
# every kernel recompiled, so ptxas reports all of them
find "$build/CMakeFiles/zack_cuda.dir" -name "*.o" -delete 2>/dev/null || true
log="$build/cuda_build.log"
cmake --build "$build" -j"$(nproc)" --target zack_cuda > "$log" 2>&1 || { cat "$log" >&2; exit 1; }
echo "cuda: kernels built in ${SECONDS}s (nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'))" >&2
python3 scripts/cuda_resources.py "$log"
if [ "${ZACK_CUDA_FULL:-0}" = 1 ]; then
    cmake --build "$build" -j"$(nproc)" >/dev/null
    ctest --test-dir "$build" -L gpu --output-on-failure
    echo "cuda: full build and GPU tests in ${SECONDS}s" >&2
fi
