// Decode attention on the GPU (kernels/cuda/attention_decode.cu) against its
// CPU twin (kernel_attention_range + kernel_attention_sinks +
// kernel_attention_merge) and against a double-precision reference over the
// cache as kv_cache::read_slot dequantizes it, for batches of items that mix
// ranks (4 .. 128), lengths (1 .. 300 slots), query heads per KV head,
// tokens per item, exact sinks and evicted slots, at every cache layout. In the
// harness build the kernels run under the SIMT harness (every access checked);
// in the CUDA build the same test runs on the device.
//
// Tolerances (max |gpu - ref| / (1 + max |ref|); measured in the harness: at
// most 3e-7 against the reference):
//   vs the double reference over the dequantized cache: 2e-6 (outputs and
//   logits, the scaled scores eviction policies read)
//   vs the CPU twin: 1e-5; for 4-bit 3e-2 (outputs) and 5e-2 (logits): the
//   CPU's AVX2 path rounds the folded query to int8 and the value weights to 7
//   bits (its own error against the reference is up to 1.2e-2 / 2.1e-2 here),
//   the GPU dequantizes to f32.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "engine/kv_cache.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/cuda_device.h"
#include "tests/simt/attention_decode_fixture.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

class CudaAttentionDecode : public ::testing::TestWithParam<int> {};

// A batch mixing every shape the issue names; one launch, many small ranges.
TEST_P(CudaAttentionDecode, MatchesCpuTwinAndReference) {
    const layout& lay = k_layouts[GetParam()];
    const std::vector<item_spec> specs = decode_batch_specs();
    std::vector<test_item> items;
    for (size_t i = 0; i < specs.size(); i++) items.push_back(build_item(specs[i], lay, 1000 + 17 * (uint32_t)i));
    std::vector<test_item*> ptrs;
    for (auto& t : items) ptrs.push_back(&t);
    // ~40 blocks over ~90K cost units: ranges of a few dozen slots, shorter
    // than a chunk for the high-rank items
    const gpu_result r = run_gpu(ptrs, 40, 8);
    // the CPU twin's own error vs the reference sets the bar (4-bit: up to
    // 1.2e-2 on outputs, 2.1e-2 on logits, from its int8 query rounding)
    const double tol_cpu = lay.bits == 4 ? 3e-2 : 1e-5, tol_cpu_logits = lay.bits == 4 ? 5e-2 : 1e-5;
    for (size_t i = 0; i < items.size(); i++) {
        std::vector<float> ref_logits, cpu_logits;
        const std::vector<float> ref = reference(items[i], &ref_logits);
        const std::vector<float> cpu = cpu_twin(items[i], cpu_logits);
        const double e_ref = rel_err(r.out[i], ref), e_cpu = rel_err(r.out[i], cpu);
        const double l_ref = rel_err(r.logits[i], ref_logits), l_cpu = rel_err(r.logits[i], cpu_logits);
        EXPECT_LE(e_ref, 2e-6) << lay.name << " item " << i;
        EXPECT_LE(l_ref, 2e-6) << lay.name << " item " << i << " logits";
        EXPECT_LE(e_cpu, tol_cpu) << lay.name << " item " << i;
        EXPECT_LE(l_cpu, tol_cpu_logits) << lay.name << " item " << i << " logits";
        std::printf("%-8s item %zu: vs reference %.2e (logits %.2e), vs CPU twin %.2e (logits %.2e); CPU twin vs "
                    "reference %.2e (logits %.2e)\n",
                    lay.name, i, e_ref, l_ref, e_cpu, l_cpu, rel_err(cpu, ref), rel_err(cpu_logits, ref_logits));
    }
    // the split made short ranges: some range holds fewer slots than a chunk
    bool short_range = false;
    for (const cuda_attn_task& t : r.plan.tasks) short_range |= !t.sink && t.s1 - t.s0 < k_attn_chunk;
    EXPECT_TRUE(short_range);
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaAttentionDecode, ::testing::Range(0, 5),
                         [](const ::testing::TestParamInfo<int>& i) { return std::string(k_layouts[i.param].name); });

// One range per slot (min_range 1, many blocks): every partial is a single
// slot, the merge combines hundreds of them.
TEST(CudaAttentionDecodeSplit, RangesOfOneSlot) {
    const layout lay{"q8", 8, dtype::F16, false};
    std::vector<test_item> items;
    items.push_back(build_item({4, 8, 40, 2, 1, 4, 1.0f, 32}, lay, 5));
    items.push_back(build_item({32, 16, 25, 1, 1, 0, 1.0f, 32}, lay, 6));
    std::vector<test_item*> ptrs{&items[0], &items[1]};
    const gpu_result r = run_gpu(ptrs, 10000, 1);
    for (const cuda_attn_task& t : r.plan.tasks) {
        if (!t.sink) {
            EXPECT_EQ(t.s1 - t.s0, 1);
        }
    }
    for (size_t i = 0; i < items.size(); i++) EXPECT_LE(rel_err(r.out[i], reference(items[i])), 2e-6) << i;
}

// The plan: ranges cover every non-sink slot once, cost about the same across
// heads of unequal rank, and run longest first.
TEST(CudaAttentionDecodeSplit, PlanGivesEqualWorkLongestFirst) {
    std::vector<cuda_attn_item> items(4);
    const int ranks[4][2] = {{128, 128}, {64, 64}, {16, 32}, {4, 4}};
    const int64_t slots[4] = {8192, 8192, 5000, 700};
    for (int i = 0; i < 4; i++) {
        items[i].kv.r_k = ranks[i][0];
        items[i].kv.r_v = ranks[i][1];
        items[i].kv.n_slots = slots[i];
        items[i].kv.n_sink_slots = i == 0 ? 4 : 0;
        items[i].kv.sink_dim = 128;
        items[i].n_group = 2;
    }
    const int blocks = 264;
    const cuda_attn_plan p = cuda_attn_plan_make(items, blocks, 32);
    int64_t total = 0;
    for (int i = 0; i < 4; i++) total += (slots[i] - items[i].kv.n_sink_slots) * (ranks[i][0] + ranks[i][1]);
    const double W = (double)total / blocks;
    std::vector<std::vector<int>> covered(4);
    for (int i = 0; i < 4; i++) covered[i].assign(slots[i], 0);
    for (size_t k = 0; k < p.tasks.size(); k++) {
        const cuda_attn_task& t = p.tasks[k];
        if (k > 0) {
            EXPECT_LE(t.cost, p.tasks[k - 1].cost) << "longest first";
        }
        for (int64_t s = t.s0; s < t.s1; s++) covered[t.item][s]++;
        if (!t.sink && t.item != 3) {  // the rank-4 head is short: fewer, shorter-than-W ranges
            EXPECT_GT(t.cost, 0.6 * W) << k;
            EXPECT_LT(t.cost, 1.5 * W) << k;
        }
    }
    for (int i = 0; i < 4; i++)
        for (int64_t s = 0; s < slots[i]; s++) ASSERT_EQ(covered[i][s], 1) << i << " " << s;
    // a head of half the rank gets ranges about twice as long
    int64_t len[2] = {0, 0};
    for (const cuda_attn_task& t : p.tasks) {
        if (!t.sink && t.item <= 1) len[t.item] = t.s1 - t.s0;
    }
    EXPECT_NEAR((double)len[1] / len[0], 2.0, 0.2);
    EXPECT_EQ(p.item_parts.size(), 5u);
    EXPECT_THROW(cuda_attn_plan_make({cuda_attn_item{}}, 1), zk::error);  // rank 0
}

}  // namespace

namespace {

// The 8K attention at every cache layout: two KV heads of unequal rank, three
// query heads each, exact sinks, 8192 tokens (4-bit: 8064 quantized in 252
// groups plus the 128-token residual window), split over ~264 blocks (two
// waves of an H100's 132 SMs).
TEST_P(CudaAttentionDecode, EightThousandSlots) {
    const layout& lay = k_layouts[GetParam()];
    std::vector<test_item> items;
    items.push_back(build_item({64, 64, 8192, 3, 1, 4, 1.0f, 32}, lay, 77));
    items.push_back(build_item({128, 32, 8192, 3, 1, 4, 1.0f, 32}, lay, 78));
    std::vector<test_item*> ptrs{&items[0], &items[1]};
    const gpu_result r = run_gpu(ptrs, 264, 32);
    const double tol_cpu = lay.bits == 4 ? 3e-2 : 1e-5;
    for (size_t i = 0; i < items.size(); i++) {
        std::vector<float> lg;
        const double e_ref = rel_err(r.out[i], reference(items[i])), e_cpu = rel_err(r.out[i], cpu_twin(items[i], lg));
        EXPECT_LE(e_ref, 2e-6) << lay.name << " item " << i;
        EXPECT_LE(e_cpu, tol_cpu) << lay.name << " item " << i;
        std::printf("8K %-8s item %zu: %zu tasks; vs reference %.2e, vs CPU twin %.2e\n", lay.name, i,
                    r.plan.tasks.size(), e_ref, e_cpu);
    }
}

}  // namespace
