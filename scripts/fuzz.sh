#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/, clang with ASan + UBSan, in
# build-fuzz/) and runs them. A crash, a sanitizer report, a leak, an input
# slower than 1 s or an allocation past the limits fails the run; what failed
# is left in build-fuzz/fuzz/artifacts/<target>/ (minimise it with
# `build-fuzz/tests/fuzz/fuzz_<target> -minimize_crash=1 -runs=10000 FILE`, fix
# the bug, and keep the minimised input in tests/data/fuzz/<target>/).
#
#   scripts/fuzz.sh --ci                 every target for a fixed number of
#                                        executions (CI: .ci/sanitize.sh)
#   scripts/fuzz.sh --hours N            about N hours of wall time in all, shared
#                                        evenly by the targets (--jobs at a time);
#                                        the corpus grows in build-fuzz/fuzz/corpus/<target>
#   scripts/fuzz.sh --runs N             N executions per target
#   options: --targets gguf,zack,...     (default: all: gguf zack tokenizer chat eval cli)
#            --jobs J                    run J targets at a time (default 1)
#            --timeout S                 an input slower than S seconds fails (default 1;
#                                        libFuzzer counts wall time, so a run under
#                                        `nice -n 19` on a busy machine needs more)
#            --no-build                  use the binaries already in build-fuzz
# Long runs belong on an otherwise idle machine or under `nice -n 19`.
# Prints one line per target: "fuzz <target>: <N> executions in <S> s, <C> crashes or timeouts".
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"

all_targets=(gguf zack tokenizer chat eval cli)
# --ci executions per target: about 10-20 s each on a 2-core machine under ASan
# (measured rates: gguf ~4k/s, zack ~2k/s, tokenizer ~8k/s, chat ~600/s, eval ~60/s, cli ~120/s).
declare -A ci_runs=([gguf]=40000 [zack]=20000 [tokenizer]=60000 [chat]=6000 [eval]=600 [cli]=1500)

mode="" value="" jobs=1 build=1 timeout=1 targets=("${all_targets[@]}")
while [ $# -gt 0 ]; do
    case "$1" in
        --ci) mode=ci ;;
        --hours) mode=hours value="$2"; shift ;;
        --runs) mode=runs value="$2"; shift ;;
        --targets) IFS=, read -r -a targets <<< "$2"; shift ;;
        --jobs) jobs="$2"; shift ;;
        --timeout) timeout="$2"; shift ;;
        --no-build) build=0 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -n "$mode" ] || { echo "fuzz.sh: give --ci, --hours N or --runs N (see --help)" >&2; exit 2; }

bdir="${ZACK_FUZZ_BUILD_DIR:-$here/build-fuzz}"
if [ "$build" = 1 ]; then
    CC=clang CXX=clang++ cmake -S "$here" -B "$bdir" -DZACK_FUZZ=ON -DZACK_BENCH=OFF \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" \
        -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only" >/dev/null
    cmake --build "$bdir" -j"$(nproc)" --target fuzz_seeds test_gguf $(printf 'fuzz_%s ' "${targets[@]}") >&2
fi
export ZACK_MODEL="${ZACK_MODEL:-$here/models/SmolLM2-135M-Instruct.Q4_1.gguf}"

# Seeds: small real files from fuzz_seeds, plus the corrupted-file table of test_gguf.
work="$bdir/fuzz"
rm -rf "$work/seeds"
"$bdir/tests/fuzz/fuzz_seeds" "$work/seeds" >/dev/null
ZACK_FUZZ_SEED_DIR="$work/seeds/gguf" "$bdir/tests/test_gguf" --gtest_filter='*CorruptedFiles*' >/dev/null

export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

run_target() {
    local t="$1" limit corpus art log
    art="$work/artifacts/$t"
    rm -rf "$art" && mkdir -p "$art"
    if [ "$mode" = hours ]; then
        corpus="$work/corpus/$t"   # kept: a long run continues where the last one stopped
        limit="-max_total_time=$(awk -v h="$value" -v n="${#targets[@]}" -v j="$jobs" \
            'BEGIN { if (j > n) j = n; printf "%d", h * 3600 * j / n }')"
    else
        corpus="$(mktemp -d)"
        limit="-runs=$([ "$mode" = ci ] && echo "${ci_runs[$t]}" || echo "$value")"
    fi
    mkdir -p "$corpus"
    local args=("$limit" -timeout="$timeout" -rss_limit_mb=2048 -malloc_limit_mb=1024 -print_final_stats=1
                -artifact_prefix="$art/" -close_fd_mask=$([ "$t" = cli ] && echo 3 || echo 1))
    case "$t" in gguf|zack) args+=(-dict="$here/tests/fuzz/gguf.dict") ;; esac
    log="$work/$t.log"
    local rc=0
    "$bdir/tests/fuzz/fuzz_$t" "${args[@]}" "$corpus" "$work/seeds/$t" > "$log" 2>&1 || rc=$?
    [ "$mode" = hours ] || rm -rf "$corpus"
    local n s c
    n="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
    s="$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | awk '{print $5}' | tail -1)"
    c="$(find "$art" -type f | wc -l)"
    echo "fuzz $t: ${n:-?} executions in ${s:-?} s, $c crashes or timeouts$([ $rc -ne 0 ] && echo " (exit $rc, log $log)")"
    if [ $rc -ne 0 ] || [ "$c" -ne 0 ]; then
        grep -E "ERROR|SUMMARY|runtime error|Test unit written|DEADLY" "$log" | head -20 >&2 || true
        return 1
    fi
}

failed=0
pids=()
for t in "${targets[@]}"; do
    run_target "$t" &
    pids+=($!)
    if [ "${#pids[@]}" -ge "$jobs" ]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do wait "$p" || failed=1; done
exit $failed
