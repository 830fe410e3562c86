#!/usr/bin/env bash
# The checks and measurements of issue #18 on a GPU machine, in one go, from
# binaries built elsewhere (bench/gpu/pack.sh puts them in .devrun/: the GPU
# tests, bench_cuda_attention, and the shared libraries the machine may lack).
# Everything lands in $OUT (default /tmp/zack_gpu): logs and JSON.
#
#   bash bench/gpu/run_device.sh [tests|bench|sanitize|all]    (SDPA=0: without PyTorch's SDPA)
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
bin="$here/.devrun"
out="${OUT:-/tmp/zack_gpu}"
mkdir -p "$out"
# cuBLAS from the machine's CUDA toolkit, or from the nvidia-cublas wheel its torch uses
cublas=$(dirname "$( (ls /usr/local/cuda/lib64/libcublas.so.13* 2>/dev/null;
                      find / -name 'libcublas.so.13*' -not -path '/proc/*' 2>/dev/null) | head -1)")
export LD_LIBRARY_PATH="$bin/lib:/usr/local/cuda/lib64:$cublas:${LD_LIBRARY_PATH:-}"
what="${1:-all}"
mkdir -p /tmp/zack_gpu_logs
SECONDS=0
{
    nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,driver_version --format=csv 2>&1
    echo "nvcc: $(nvcc --version 2>/dev/null | tail -1)"
} | tee "$out/device.txt"

if [ "$what" = tests ] || [ "$what" = all ]; then
    # $OUT brings back 8 files at most: one log for all the test binaries
    fails=0
    logs=/tmp/zack_gpu_logs
    mkdir -p "$logs"
    for t in "$bin"/gpu_*; do
        n=$(basename "$t")
        if timeout 300 "$t" > "$logs/$n.log" 2>&1; then
            echo "PASS $n ($(grep -c '^\[       OK' "$logs/$n.log") tests, ${SECONDS}s)"
        else
            rc=$?
            fails=$((fails + 1))
            echo "FAIL $n (exit $rc):"
            grep -E "FAILED|Failure|error|Expected|Which is|not run" "$logs/$n.log" | head -30
        fi
    done
    echo "gpu tests: $fails failing binaries"
    for f in "$logs"/*.log; do echo "=== $f"; cat "$f"; done > "$out/gpu_tests.log"
fi

if [ "$what" = bench ] || [ "$what" = all ]; then
    timeout 150 "$bin/bench_cuda_attention" --shape qwen2.5-1.5b --json "$out/attn_qwen2.5-1.5b.json" 2>&1
    [ "${SDPA:-1}" = 1 ] && timeout 60 python3 "$here/bench/gpu/sdpa_reference.py" --shape qwen2.5-1.5b \
        --json "$out/sdpa_qwen2.5-1.5b.json" 2>&1
    timeout 150 "$bin/bench_cuda_attention" --shape llama-8b --layouts f16,q4,q2,r64q4 \
        --json "$out/attn_llama-8b.json" 2>&1
    [ "${SDPA:-1}" = 1 ] && timeout 60 python3 "$here/bench/gpu/sdpa_reference.py" --shape llama-8b \
        --json "$out/sdpa_llama-8b.json" 2>&1
fi

if [ "$what" = sanitize ] || [ "$what" = all ]; then
    # compute-sanitizer on the real device: out-of-bounds and misaligned accesses
    # (memcheck) and shared-memory hazards (racecheck) in the attention kernels
    for tool in memcheck racecheck; do
        timeout 100 compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/gpu_attention_decode" \
            --gtest_filter='*MatchesCpuTwin*:-*EightThousand*' > /tmp/zack_gpu_logs/san_$tool.log 2>&1
        echo "compute-sanitizer $tool, decode attention (generic and fast kernels, 16 layout pairs): exit $? ($(tail -1 /tmp/zack_gpu_logs/san_$tool.log))"
    done
    timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/gpu_attention_prefill" > /tmp/zack_gpu_logs/san_prefill.log 2>&1
    echo "compute-sanitizer memcheck, prefill attention: exit $? ($(tail -1 /tmp/zack_gpu_logs/san_prefill.log))"
    cat /tmp/zack_gpu_logs/san_*.log | grep -vE "^\[ " | head -c 2000000 > "$out/sanitizer.log"
fi
echo "run_device: ${SECONDS}s"
