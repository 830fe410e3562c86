#!/usr/bin/env bash
# The checks and measurements of issue #18 on a GPU machine, in one go, from
# binaries built elsewhere (bench/gpu/pack.sh puts them in .devrun/: the GPU
# tests, bench_cuda_attention, and the shared libraries the machine may lack).
# Everything lands in $OUT (default /tmp/zack_gpu): logs and JSON.
#
#   bash bench/gpu/run_device.sh [tests|backend|profile|bench|sanitize|all|compare|attn_compare|prefill_compare|ncu|ncu_attn|ncu_src|batch]
#   (compare: the packed baseline build .devrun/zack_base against .devrun/zack,
#   decode on synthetic models, interleaved; attn_compare: the same for
#   bench_cuda_attention; prefill_compare: prefill at depth 0 and 8K of the two;
#   ZACK_KEEP_BASE=1 bench/gpu/pack.sh packs the baseline;
#   ncu_attn: the fast decode-attention kernel under Nsight Compute, what bounds it;
#   ncu_src: its hottest instructions (bench/gpu/ncu_source_top.py);
#   batch: decode of 8 sequences together against one, end to end)
#   (SDPA=0: without PyTorch's SDPA; CPU=0: backend without the machine's CPU beside the GPU)
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
    # no model files on a GPU machine: gpu_backend's real-model tests take a
    # synthetic model of the default model's shape (tests/simt/test_backend_cuda.cpp)
    [ -f "$here/models/SmolLM2-135M-Instruct.Q4_1.gguf" ] || export ZACK_TEST_SHAPE=smollm2-135m:q4_1
    logs=/tmp/zack_gpu_logs
    mkdir -p "$logs"
    for t in "$bin"/gpu_*; do
        n=$(basename "$t")
        if timeout "${TEST_TIMEOUT:-300}" "$t" > "$logs/$n.log" 2>&1; then
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

if [ "$what" = backend ] || [ "$what" = all ]; then
    # the CUDA backend end to end: GPU vs CPU logits (a synthetic SmolLM2-shaped
    # model stands in for the real one: no model files here), then zack bench
    # on a synthetic Qwen2.5-1.5B Q4_K: the GPU at two KV precisions and depths,
    # the machine's CPU beside it
    ZACK_TEST_SHAPE=smollm2-135m:q4_1 timeout 200 "$bin/gpu_backend" > /tmp/zack_gpu_logs/backend.log 2>&1
    echo "gpu_backend: exit $?"; grep -vE "^\[ " /tmp/zack_gpu_logs/backend.log | tail -60
    cp /tmp/zack_gpu_logs/backend.log "$out/gpu_backend.log"
    timeout 240 "$bin/zack" bench --shape qwen2.5-1.5b --device cuda -p 512 -n 64 -d 0,8192 --kv-bits 16,4 -r 2 \
        2>&1 | tee "$out/bench_cuda_qwen1.5b.md"
    [ "${CPU:-1}" = 1 ] && timeout 120 "$bin/zack" bench --shape qwen2.5-1.5b --device cpu -t 16 -p 512 -n 32 \
        -d 0 -r 1 2>&1 | tee "$out/bench_cpu16_qwen1.5b.md"
    timeout 200 "$bin/zack" bench --shape llama-8b --device cuda -p 512 -n 32 -d 0,8192 --kv-bits 16,4 -r 1 \
        2>&1 | tee "$out/bench_cuda_llama8b.md"
fi

if [ "$what" = compare ]; then
    # two builds, the same commands, alternating (a GPU's clocks drift less than
    # this box's, but a change is judged within one machine's run)
    [ -x "$bin/zack_base" ] || { echo "compare: no $bin/zack_base (ZACK_KEEP_BASE=1 bench/gpu/pack.sh)"; exit 1; }
    for r in 1 2; do
        for z in zack_base zack; do
            echo "== $z, qwen2.5-1.5b, round $r"
            timeout 90 "$bin/$z" bench --shape qwen2.5-1.5b --device cuda -p 0 -n 64 -d 0,2048 --kv-bits 16,4 \
                -r 1 2>&1 | grep -E "^\| tg|error" | tee -a "$out/compare_qwen1.5b.md"
        done
    done
    for z in zack_base zack; do
        echo "== $z, llama-8b"
        timeout 120 "$bin/$z" bench --shape llama-8b --device cuda -p 0 -n 32 -d 0 --kv-bits 16 -r 1 2>&1 |
            grep -E "^\| tg|error" | tee -a "$out/compare_llama8b.md"
    done
fi

if [ "$what" = attn_compare ]; then
    # the decode-attention micro-benchmark of two builds, alternating, twice
    [ -x "$bin/bench_cuda_attention_base" ] || { echo "attn_compare: no $bin/bench_cuda_attention_base"; exit 1; }
    # (ATTN_SHAPES: the shapes, default llama-8b; qwen2.5-1.5b has 6 query rows a KV head)
    for shape in ${ATTN_SHAPES:-llama-8b}; do
        for r in 1 2; do
            for z in bench_cuda_attention_base bench_cuda_attention; do
                echo "== $z, $shape, round $r"
                timeout 60 "$bin/$z" --shape "$shape" --ctx 8192,32768 --batch 1,32 --layouts f16,q4,q2,r64q4 2>&1 |
                    tee -a "$out/attn_compare.md"
            done
        done
    done
fi

if [ "$what" = prefill_compare ]; then
    # prefill of two builds, one after the other: pp512 at depth 0 and 8K, the
    # 1.5B's shape, f16 and 4-bit caches (the depth's own fill is a prefill too)
    [ -x "$bin/zack_base" ] || { echo "prefill_compare: no $bin/zack_base"; exit 1; }
    for z in zack_base zack; do
        echo "== $z, qwen2.5-1.5b prefill"
        timeout "${PREFILL_TIMEOUT:-120}" "$bin/$z" bench --shape qwen2.5-1.5b --device cuda -p 512 -n 0 -d 0,8192 \
            --kv-bits 16,4 -r 1 2>&1 | grep -E "^\| (pp|test)|error" | tee -a "$out/prefill_compare.md"
    done
fi

if [ "$what" = ncu_attn ]; then
    # the fast decode kernel at 32K, batch 8, llama-8b shape, f16 and 4-bit:
    # throughput against the device's peaks, where the warps wait, what they issue
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for lay in f16 q4; do
        timeout 60 "$ncu" --clock-control none --kernel-name regex:attn_decode_fast --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
            --section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats \
            "$bin/bench_cuda_attention" --shape llama-8b --ctx 32768 --batch 8 --layouts "$lay" --reps 3 \
            > "$out/ncu_attn_$lay.txt" 2>&1
        echo "ncu_attn $lay: exit $?"
        grep -E "Duration|Throughput|Issue Slots|Executed Ipc|Registers|Achieved Occupancy|Stall|Warp Cycles|No Eligible|One or More" \
            "$out/ncu_attn_$lay.txt" | head -40
    done
fi

if [ "$what" = ncu_src ]; then
    # the fast decode kernel's instructions at 32K, batch 8 (NCU_LAYOUTS, default
    # q4): executions per opcode and the hottest instructions by stall samples
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    for lay in ${NCU_LAYOUTS:-q4}; do
        rep=/tmp/zack_gpu_logs/src_$lay
        timeout 120 "$ncu" --clock-control none --kernel-name regex:attn_decode_fast --launch-skip 2 --launch-count 1 \
            --section SourceCounters --section WarpStateStats -f -o "$rep" \
            "$bin/bench_cuda_attention" --shape llama-8b --ctx 32768 --batch 8 --layouts "$lay" --reps 3 > "$rep.log" 2>&1
        echo "ncu_src $lay: exit $?"
        timeout 120 "$ncu" --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.csv" 2> "$rep.err"
        echo "ncu_src $lay import: exit $? ($(wc -c < "$rep.csv") bytes; $(head -c 300 "$rep.err"))"
        python3 "$here/bench/gpu/ncu_source_top.py" "$rep.csv" --top 80 > "$out/ncu_src_$lay.txt" 2>&1
        head -45 "$out/ncu_src_$lay.txt"
    done
fi

if [ "$what" = batch ]; then
    # the 1.5B's shape decoding 8 sequences together against one, at 4K each,
    # f16 and 4-bit caches (each sequence prefilled alone first)
    timeout "${BATCH_TIMEOUT:-200}" "$bin/zack" bench --shape qwen2.5-1.5b --device cuda -p 0 -n 32 -d 4096 -b 1,8 \
        --kv-bits 16,4 -r 1 2> /tmp/zack_gpu_logs/batch.err | tee "$out/batch_qwen1.5b.md"
fi

if [ "$what" = ncu ]; then
    # every kernel of two decode steps of the 1.5B shape under Nsight Compute
    # (one at a time: their summed time is the GPU's busy time per step, to set
    # against the step's wall time from bench), per kernel: time and DRAM bytes
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    skip=${NCU_SKIP:-4000}
    timeout 300 "$ncu" --clock-control none --launch-skip "$skip" --launch-count "${NCU_COUNT:-1600}" --csv --print-units base \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum "$bin/zack" bench --shape qwen2.5-1.5b \
        --device cuda -p 0 -n 16 -d 0 --kv-bits 16 -r 1 > "$out/ncu_qwen1.5b.csv" 2>&1
    python3 "$here/bench/gpu/ncu_summary.py" "$out/ncu_qwen1.5b.csv" | tee "$out/ncu_qwen1.5b.md"
fi

if [ "$what" = profile ] || [ "$what" = all ]; then
    # where a GPU decode step goes (engine/backend_profile.h: each op timed with a
    # device wait after it), and nsys's kernel and API summary where it is installed
    ZACK_PROFILE=1 timeout 200 "$bin/zack" bench --shape qwen2.5-1.5b --device cuda -p 0 -n 32 -d 0,8192 \
        --kv-bits 16,4 -r 1 > "$out/profile_qwen1.5b.md" 2>&1
    grep -E "^\||zack profile" "$out/profile_qwen1.5b.md" | tail -80
    if command -v nsys > /dev/null; then
        timeout 200 nsys profile -o /tmp/zack_gpu_logs/decode --force-overwrite true --stats=true \
            "$bin/zack" bench --shape qwen2.5-1.5b --device cuda -p 0 -n 32 -r 1 > "$out/nsys_qwen1.5b.txt" 2>&1
        grep -A25 -E "cuda_gpu_kern_sum|cuda_api_sum" "$out/nsys_qwen1.5b.txt" | head -80
    fi
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
