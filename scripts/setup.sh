#!/usr/bin/env bash
# Installs what zack needs on a fresh Debian 12 machine, builds it and fetches the
# models the tests use (the default SmolLM2, Gemma 3 270M and Qwen2.5-Coder 1.5B
# and 0.5B, 2 GB in all). Safe to re-run: every step skips work that is already done.
#   apt:  build tools (Ninja), OpenBLAS/LAPACK, CLI11, nlohmann-json, GoogleTest, Google Benchmark,
#         bubblewrap (the sandbox that runs model-written code in `zack eval --task code`),
#         clang with its sanitizer and libFuzzer runtimes and llvm-symbolizer (.ci/sanitize.sh,
#         scripts/fuzz.sh)
#   pip:  numpy, gguf, tokenizers, jinja2, llama-cpp-python (built for AVX2) — used only by
#         tests and bench scripts
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# --then SCRIPT: a bash script to run after the build, while the Qwen models
# still download (see the fetch below).
then_script=""
if [ "${1:-}" = "--then" ] && [ $# -eq 2 ] && [ -f "$2" ]; then
    then_script="$2"
elif [ $# -gt 0 ]; then
    echo "setup: usage: setup.sh [--then SCRIPT] (a bash script that exists; got: $*)" >&2
    exit 2
fi
cd "$here"

apt_pkgs=(build-essential cmake python3 python3-pip libopenblas-dev liblapack-dev libcli11-dev
          nlohmann-json3-dev libgtest-dev libbenchmark-dev bubblewrap clang libclang-rt-14-dev llvm ninja-build)
missing=()
for p in "${apt_pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    echo "setup: installing ${missing[*]}" >&2
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >&2
fi

# Debian's own python3 refuses pip installs into the system (PEP 668); these
# test-only packages then go in with --break-system-packages.
req="$here/scripts/requirements-test.txt"
python3 -m pip install -q --disable-pip-version-check -r "$req" >&2 ||
    python3 -m pip install -q --disable-pip-version-check --break-system-packages -r "$req" >&2

# llama.cpp through llama-cpp-python, the reference of test_gemma_ref and the peer
# of the bench scripts, built from source for AVX2 + FMA + F16C alone: the same
# code (and rounding) on every x86-64 machine CI may run on, and never its AMX
# matmul, which crashes 0.3.36 (SIGSEGV in ggml_backend_amx_mul_mat) on
# Sapphire Rapids machines. A build with other features is replaced.
lcpp_ok() {
    python3 -c "import llama_cpp, sys; s = llama_cpp.llama_print_system_info().decode()
sys.exit(0 if llama_cpp.__version__ == '0.3.36' and 'AVX2 = 1' in s and 'AVX512 = 1' not in s and 'AMX' not in s else 1)" \
        2>/dev/null
}
fetch_pids=()
lcpp_pid=""
# On exit (a failure or an interrupt) the background work stops too: the model
# fetches and the llama-cpp-python build (below).
stop_background() {
    [ ${#fetch_pids[@]} -eq 0 ] || kill "${fetch_pids[@]}" 2>/dev/null || true
    [ -z "$lcpp_pid" ] || kill -- "-$lcpp_pid" 2>/dev/null || true
}
trap stop_background EXIT
# Built in the background (it needs only the compiler and pip): it overlaps zack's
# build and the --then script, whose CPUs it shares, and setup waits for it at the
# end. Its output goes to a log, printed when it fails.
if ! lcpp_ok; then
    lcpp_log="$(mktemp -t zack_llama_cpp_build.XXXXXX)"
    echo "setup: building llama-cpp-python 0.3.36 for AVX2 in the background (a few minutes; log: $lcpp_log)" >&2
    set -m  # its own process group, so that stop_background reaches the compilers pip starts
    (
        lcpp=(install -q --disable-pip-version-check --force-reinstall --no-deps --no-cache-dir
              --no-binary llama-cpp-python llama-cpp-python==0.3.36)
        # LLAVA_BUILD=OFF: no multimodal library (mtmd), which nothing here loads
        export CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF"
        nice -n 10 python3 -m pip "${lcpp[@]}" || nice -n 10 python3 -m pip "${lcpp[@]}" --break-system-packages
    ) < /dev/null > "$lcpp_log" 2>&1 &
    lcpp_pid=$!
    set +m
fi
lcpp_wait() {
    [ -n "$lcpp_pid" ] || return 0
    if ! wait "$lcpp_pid"; then
        tail -40 "$lcpp_log" >&2
        echo "setup: building llama-cpp-python failed (log: $lcpp_log)" >&2
        exit 1
    fi
    lcpp_pid=""
    lcpp_ok || { echo "setup: llama-cpp-python was not built for AVX2 alone (log: $lcpp_log)" >&2; exit 1; }
    rm -f "$lcpp_log"
}

# The models are fetched while zack builds: the fetch waits mostly on pip's
# downloads and the disk, the build on the CPUs. The default model and Gemma
# (the small ones) come first on their own, so that `--then SCRIPT`
# (scripts/test.sh: the sanitizer stage, which needs only those two) runs after
# the build while the Qwen models (1.6 GB; from 5 to 10 minutes on CI's link)
# still download.
bash "$here/scripts/fetch_model.sh" smollm2 gemma3-270m >/dev/null &
small_pid=$!
bash "$here/scripts/fetch_model.sh" qwen2.5-coder-1.5b qwen2.5-coder-0.5b >/dev/null &
big_pid=$!
fetch_pids=("$small_pid" "$big_pid")
build="${ZACK_BUILD_DIR:-$here/build}"
source "$here/scripts/cmake_generator.sh"
# ZACK_UNITY: zack_core and zack_cli compiled a batch of files at a time (on the
# 2-core CI machine the build takes 6 minutes instead of 9: the library's shared
# headers parsed and optimised once a batch). The scalar references that tests
# compare bit for bit add with explicit fused multiply-adds, so their bits do not
# depend on how a batch inlines (quant_pack.cpp).
# shellcheck disable=SC2046  # the generator's two words
cmake $(cmake_generator "$build") -S "$here" -B "$build" -DCMAKE_BUILD_TYPE=Release -DZACK_UNITY=ON >&2
cmake --build "$build" -j"$(nproc)" >&2
wait "$small_pid" || { echo "setup: fetching the models failed (see the line above)" >&2; exit 1; }
fetch_pids=("$big_pid")
if [ -n "$then_script" ]; then
    echo "setup: running $then_script while the larger models download${lcpp_pid:+ and llama-cpp-python builds}" >&2
    bash "$then_script"
fi
wait "$big_pid" || { echo "setup: fetching the models failed (see the line above)" >&2; exit 1; }
fetch_pids=()
lcpp_wait
echo "setup: done; try: $build/zack run -m models/SmolLM2-135M-Instruct.Q4_1.gguf" >&2
