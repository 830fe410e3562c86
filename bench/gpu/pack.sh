#!/usr/bin/env bash
# Builds the CUDA variant's GPU tests, zack and bench_cuda_attention here (nvcc, no
# GPU needed) and packs them for a GPU machine into .devrun/ (ignored by git):
# the binaries, stripped, and the shared libraries they need that are neither
# glibc's nor CUDA's (OpenBLAS, LAPACK, gfortran). The GPU machine then runs
# bench/gpu/run_device.sh with .devrun carried along.
#
#   ZACK_KEEP_BASE=1 bash bench/gpu/pack.sh   keeps the zack and bench_cuda_attention
#   of the pack already in .devrun as .devrun/*_base: run_device.sh's `compare` and
#   `attn_compare` modes bench the two builds interleaved on the same machine (pack
#   once before a change, once after).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
build="${ZACK_CUDA_BUILD_DIR:-build-cuda}"
nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
cmake -S . -B "$build" -DZACK_CUDA=ON -DZACK_BENCH=OFF -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_BUILD_TYPE=Release >/dev/null
targets="$(cd tests/simt && ls test_cuda_*.cpp | sed 's/test_cuda_/gpu_/; s/\.cpp$//') gpu_backend zack"
cmake --build "$build" -j"$(nproc)" --target $targets bench_cuda_attention >&2
base=""
if [ "${ZACK_KEEP_BASE:-0}" = 1 ]; then
    [ -f .devrun/zack ] || { echo "pack.sh: ZACK_KEEP_BASE=1 but no earlier pack in .devrun" >&2; exit 1; }
    base=$(mktemp -d)
    cp .devrun/zack .devrun/bench_cuda_attention "$base/"
fi
rm -rf .devrun
mkdir -p .devrun/lib
if [ -n "$base" ]; then
    for b in zack bench_cuda_attention; do mv "$base/$b" ".devrun/${b}_base"; done
    rmdir "$base"
fi
for t in $targets bench_cuda_attention; do
    f=$(find "$build" -name "$t" -type f -perm -u+x | head -1)
    strip -o ".devrun/$t" "$f"
done
# the libraries outside glibc and CUDA
for lib in $(ldd .devrun/* 2>/dev/null | awk '/=> \// {print $3}' | sort -u); do
    case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread*|libdl*|librt*|ld-linux*|libcuda.so*|libcublas*) ;;
        *) cp -L "$lib" .devrun/lib/ ;;
    esac
done
du -sh .devrun >&2
ls .devrun .devrun/lib >&2
# a device call carries 64 MiB and the pack is more (OpenBLAS alone is 35 MiB):
# it travels as .devpack/devrun.tar.xz (about 10 MiB; carry .devpack and start
# the command with `tar xJf .devpack/devrun.tar.xz`)
mkdir -p .devpack
tar cJf .devpack/devrun.tar.xz .devrun
ls -la .devpack >&2
