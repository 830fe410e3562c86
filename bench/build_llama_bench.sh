#!/usr/bin/env bash
# Builds llama.cpp's own llama-bench from the source that llama-cpp-python 0.3.36
# ships (PyPI sdist, vendor/llama.cpp), at a chosen instruction set, so that the
# peer of bench/compare_llamacpp.py --llama-bench runs the same ISA as the zack
# it is compared with:
#   avx2    -mavx2 -mfma -mf16c, what scripts/setup.sh builds llama-cpp-python
#           with (compare with a zack built -DZACK_NATIVE=OFF
#           -DCMAKE_{C,CXX}_FLAGS="-mavx2 -mfma -mf16c")
#   avx512  avx2 plus AVX-512 (F, BW, VL, VNNI; VBMI, BF16 and AVX-VNNI where the
#           CPU has them), without AMX: everything a Sapphire Rapids VM has but
#           the AMX matmul, whose -DGGML_NATIVE=ON build dies of SIGILL at
#           prefill there (compare with zack's default -march=native build)
# Usage: bash bench/build_llama_bench.sh avx2|avx512 [DIR]   (DIR: /tmp/llama-bench)
# Prints the path of the binary on stdout; progress on stderr. Needs pip, cmake,
# a C++ compiler; takes 5-10 minutes on 2 cores.
set -euo pipefail
isa="${1:-}"
dir="${2:-/tmp/llama-bench}"
version=0.3.36
base=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
case "$isa" in
    avx2) flags=("${base[@]}") ;;
    avx512)
        # the AVX-512 core a VNNI machine has is required; BF16, VBMI and the
        # VEX-coded AVX-VNNI are added where this CPU has them (an Ice Lake VM
        # has VBMI, not the other two)
        for f in avx512f avx512bw avx512vl avx512_vnni; do
            grep -qw "$f" /proc/cpuinfo || { echo "build_llama_bench: this CPU lacks $f; use avx2" >&2; exit 1; }
        done
        flags=("${base[@]}" -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON)
        grep -qw avx512vbmi /proc/cpuinfo && flags+=(-DGGML_AVX512_VBMI=ON)
        grep -qw avx512_bf16 /proc/cpuinfo && flags+=(-DGGML_AVX512_BF16=ON)
        grep -qw avx_vnni /proc/cpuinfo && flags+=(-DGGML_AVX_VNNI=ON)
        ;;
    *) echo "usage: bash bench/build_llama_bench.sh avx2|avx512 [DIR]" >&2; exit 2 ;;
esac
mkdir -p "$dir"
src="$dir/llama_cpp_python-$version/vendor/llama.cpp"
if [ ! -f "$src/CMakeLists.txt" ]; then
    echo "build_llama_bench: fetching llama-cpp-python $version source into $dir" >&2
    python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version" -d "$dir" >&2
    tar xzf "$dir/llama_cpp_python-$version.tar.gz" -C "$dir"
fi
build="$src/build-$isa"
echo "build_llama_bench: configuring and building llama-bench ($isa) in $build" >&2
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF "${flags[@]}" >&2
cmake --build "$build" --target llama-bench -j "$(nproc)" >&2
echo "$build/bin/llama-bench"
