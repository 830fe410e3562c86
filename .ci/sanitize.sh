#!/usr/bin/env bash
# The sanitizer part of CI (scripts/test.sh runs it before ctest):
#  1. build-fuzz: clang with AddressSanitizer + UBSan and libFuzzer coverage
#     (ZACK_FUZZ=ON, -O1): the GoogleTest binaries run under ASan + UBSan, the
#     model-heavy ones with a short subset on the real model (see `filter`
#     below), then every fuzz target for a fixed number of executions
#     (scripts/fuzz.sh --ci).
#  2. build-tsan: clang with ThreadSanitizer: test_threads (thread pool, batched
#     decoding, the attention scheduler, calibration on the pool).
# Any test failure or sanitizer report fails the run. Prints the wall and CPU time
# each part took.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
here="$PWD"
source scripts/cmake_generator.sh
SECONDS=0
# "what (wall seconds so far; CPU user+sys of everything run so far)"
stamp() {
    local cpu tf
    tf="$(mktemp)"
    times > "$tf"  # in this shell: a pipe would run `times` in a fresh subshell
    cpu="$(tail -1 "$tf" | awk '{ split($0, f, /[ms ]+/); printf "%.0f", f[1] * 60 + f[2] + f[3] * 60 + f[4] }')"
    rm -f "$tf"
    echo "sanitize: $1 (${SECONDS}s wall, ${cpu}s CPU so far)" >&2
}

# Builds targets $2.. in $1; the compiler's messages only when it fails (the
# build tool prints them on stdout, with the progress lines).
build_quiet() {
    local dir="$1" log="$1/sanitize_build.log"
    shift
    cmake --build "$dir" -j"$(nproc)" --target "$@" > "$log" 2>&1 || {
        grep -v '^\[[0-9]*/[0-9]*\] ' "$log" | tail -60 >&2
        echo "sanitize: the build in $dir failed (log: $log)" >&2
        return 1
    }
}

# Both trees at -O1 unless overridden below. ZACK_UNITY: zack_core and zack_cli
# compiled a batch of files at a time (the library's ~85 files under ASan: 228 ->
# 173 s of CPU); the TSan tree overrides it (one object a file, below).
flags=(-DZACK_BENCH=OFF -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZACK_UNITY=ON
       -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only")
# Subsets of the slow binaries (the rest of each runs in the plain build's ctest):
# one real-model case of test_evict and test_calib_model, the sampler without its
# 20-second statistical comparison; without the one long case of test_conversation
# (six turns on the real model: 52 s under ASan), test_kv_select (90 bound cases:
# 42 s) and test_prefill_hold (three 200-token prompts: 23 s): the other cases of
# these binaries run the same kernels and sessions under ASan, and these three run in
# the plain build; test_batch is left out (every case calibrates
# the real model, minutes under ASan): batched decoding runs in test_threads here;
# so is test_alloc_model (the sensitivity pass and the rank-weight fit on the real
# model: 490 s under ASan, most of this stage): the plan code runs here in test_plan.
# The tests run once per (key, value) layout pair: here four pairs that take
# every width once on each side (and two of 4-bit keys with 2-bit channels, 1-bit
# tails and 0-bit ones: the one-pass kernel's loads); and the window cache's
# 4-bit case (group drops).
pairs="*/K16_V8:*/K8_V4:*/K4_V2:*/K2_V16"
declare -A filter=(
    [test_calib_model]="CalibModel.GramMatchesPlainSums"
    [test_conversation]="-conversation.small_context_keeps_answering_and_rebuilds_exactly"
    [test_kv_select]="-KvSelect.BoundsHoldEveryKeyAndMatchTheGrids"
    [test_prefill_hold]="-PrefillHold.ChunkAttendsToItsOwnRowsExactly"
    [test_evict]="EvictRegistry.*:Policies/Evict.Synthetic*:Policies/Evict.RealModelSmallBudgetBounded/h2o_q4"
    [test_sampler]="-sampler.filters_agree_with_reference_on_a_larger_vocabulary"
    [test_window_cache]="Kinds/WindowCache.*/q4"
    [test_attention_layouts]="KvMixed.*:$pairs:*/K4mid_V4:*/K4midtailzero_V2"
)
skip=" test_batch test_alloc_model "
# Shorter soaks under ASan (the plain ctest runs the full 10,000 / 5,000 tokens).
declare -A env_of=([test_soak]="ZACK_SOAK_TOKENS=2000 ZACK_SOAK_LAYOUT_TOKENS=600")
# The longest under ASan first (seconds alone on the CI machine: 52-59, 18-24,
# 15-18, 11-13), two binaries run at a time: in name order test_window_cache,
# the longest, came last and ran alone.
first=" test_window_cache test_attention_layouts test_code_eval test_soak "
gtests=()
for t in $first; do gtests+=("$t"); done
for f in tests/test_*.cpp; do
    t="$(basename "$f" .cpp)"
    [[ "$skip" == *" $t "* || "$first" == *" $t "* ]] || gtests+=("$t")
done
# The SIMT kernel tests (tests/simt/) run in the plain build only: the harness
# checks every launch's reads and writes against the buffers it was given and
# shared memory against reads before writes, and compiling every kernel again
# under ASan cost ~280 s of this stage's CPU (a fifth of it) on the CI machine.

# --- ASan + UBSan (and the fuzz targets, from the same build)
build=build-fuzz
# The tests' own code at -O0 (tests/CMakeLists.txt, ZACK_TEST_OPT): their
# sources compile 2.4x faster under ASan, and zack_core, whose code they check,
# keeps -O1.
# shellcheck disable=SC2046  # the generator's two words
CC=clang CXX=clang++ cmake $(cmake_generator "$build") -S . -B "$build" -DZACK_FUZZ=ON "${flags[@]}" -DZACK_TEST_OPT=-O0 \
    >/dev/null
build_quiet "$build" "${gtests[@]}" test_fuzz_regress fuzz_seeds \
    fuzz_gguf fuzz_zack fuzz_tokenizer fuzz_chat fuzz_eval fuzz_cli
stamp "ASan + UBSan build done"

export ASAN_OPTIONS="halt_on_error=1:abort_on_error=1:detect_leaks=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
export ZACK_MODEL="${ZACK_MODEL:-$here/models/SmolLM2-135M-Instruct.Q4_1.gguf}"
run_gtest() {
    local bin="$1" name log
    name="$(basename "$bin")"
    log="$build/sanitize_$name.log"
    if ! env ${env_of[$name]-} "$bin" --gtest_brief=1 ${filter[$name]+--gtest_filter="${filter[$name]}"} > "$log" 2>&1; then
        echo "sanitize: $name failed under ASan + UBSan:" >&2
        tail -40 "$log" >&2
        return 1
    fi
}
failed=0
pids=()
for t in "${gtests[@]}" fuzz/test_fuzz_regress; do
    run_gtest "$build/tests/$t" &
    pids+=($!)
    if [ "${#pids[@]}" -ge 2 ]; then wait "${pids[0]}" || failed=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
[ $failed -eq 0 ] || exit 1
stamp "unit tests under ASan + UBSan passed"

bash scripts/fuzz.sh --ci --no-build --jobs 2
stamp "fuzz targets passed"

# --- ThreadSanitizer
build=build-tsan
# shellcheck disable=SC2046
# One object a file here (the plain build and the ASan one are unity builds):
# zack_core's files each compile on their own, so a file that does not include
# what it uses fails CI. At -O0, which compiles zack_core in about half the CPU
# of -O1 (test_threads then runs ~15 s instead of ~5).
CC=clang CXX=clang++ cmake $(cmake_generator "$build") -S . -B "$build" -DZACK_TSAN=ON "${flags[@]}" -DZACK_UNITY=OFF \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -gline-tables-only" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O0 -gline-tables-only" \
    >/dev/null
build_quiet "$build" test_threads
stamp "TSan build done"
TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1" OPENBLAS_NUM_THREADS=1 \
    "$build/tests/test_threads" --gtest_brief=1
stamp "test_threads under TSan passed"
