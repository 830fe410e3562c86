// Decode attention on the GPU (kernels/cuda/attention_decode.cu) against its
// CPU twin (kernel_attention_range + kernel_attention_sinks +
// kernel_attention_merge) and against a double-precision reference over the
// cache as kv_cache::read_slot dequantizes it, at every key x value layout
// pair (16-bit rows, 8-bit, 4- and 2-bit KIVI per side), for batches of items
// that mix ranks (4 .. 128, odd and uneven), lengths (1 .. 300 slots), G = 1..7
// query heads per KV head, tokens per item, f16/f32 rows, GEAR (rank 2, and
// outliers alone) on the KIVI sides, exact sinks and eviction (gaps,
// shortened and merged KIVI groups), in ranges shorter than a chunk; and a
// plan's keys with 2/1/0-bit channels and vector-coded values. In the
// harness build the kernels run under the SIMT harness (every access checked);
// in the CUDA build the same test runs on the device.
//
// Tolerances (max |gpu - ref| / (1 + max |ref|); the measured values are
// printed per item and summarised in kernels/cuda/README.md):
//   vs the double reference over the dequantized cache: 2e-6 (outputs and
//   logits, the scaled scores eviction policies read);
//   vs the CPU twin's reference path (kernel_attention_range_ref: float over
//   the dequantized codes, the GPU's arithmetic): 1e-5;
//   vs the CPU twin's fast path (what the engine runs): 1e-5 without a KIVI
//   side; with one 3e-2 (outputs) and 5e-2 (logits): the AVX2 path rounds the
//   folded query to int8 per group and the value weights to 7 bits, the GPU
//   dequantizes to f32 (the fast path's own error vs the reference is printed).
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

class CudaAttentionDecode : public ::testing::TestWithParam<layout> {};

// Whether some KIVI group of the item is shorter than the group size (evicted
// tokens; a merged group is one of them).
bool has_short_group(const test_item& it) {
    const attn_kv_view v = it.cache->view(0, 0);
    for (int64_t g = 0; g < v.n_groups; g++)
        if (v.group_start[g + 1] - v.group_start[g] < v.group) return true;
    return false;
}

// A batch mixing every shape the issue names; one launch, many small ranges.
TEST_P(CudaAttentionDecode, MatchesCpuTwinAndReference) {
    const layout lay = GetParam();
    const std::vector<item_spec> specs = decode_batch_specs();
    std::vector<test_item> items;
    for (size_t i = 0; i < specs.size(); i++) items.push_back(build_item(specs[i], lay, 1000 + 17 * (uint32_t)i));
    std::vector<test_item*> ptrs;
    for (auto& t : items) ptrs.push_back(&t);
    // ~40 blocks over ~90K cost units: ranges of a few dozen slots, shorter
    // than a chunk for the high-rank items
    const gpu_result r = run_gpu(ptrs, 40, 8);
    const double tol_fast = lay.kivi() ? 3e-2 : 1e-5, tol_fast_logits = lay.kivi() ? 5e-2 : 1e-5;
    double worst[4] = {0, 0, 0, 0};  // vs reference, vs CPU ref path, vs CPU fast path, CPU fast vs reference
    for (size_t i = 0; i < items.size(); i++) {
        std::vector<float> ref_logits, twin_logits, fast_logits;
        const std::vector<float> ref = reference(items[i], &ref_logits);
        const std::vector<float> twin = cpu_twin(items[i], twin_logits, true);
        const std::vector<float> fast = cpu_twin(items[i], fast_logits, false);
        const double e_ref = std::max(rel_err(r.out[i], ref), rel_err(r.logits[i], ref_logits));
        const double e_twin = std::max(rel_err(r.out[i], twin), rel_err(r.logits[i], twin_logits));
        const double e_fast = rel_err(r.out[i], fast), l_fast = rel_err(r.logits[i], fast_logits);
        const double fast_ref = std::max(rel_err(fast, ref), rel_err(fast_logits, ref_logits));
        EXPECT_LE(e_ref, 2e-6) << lay.name() << " item " << i;
        EXPECT_LE(e_twin, 1e-5) << lay.name() << " item " << i;
        EXPECT_LE(e_fast, tol_fast) << lay.name() << " item " << i;
        EXPECT_LE(l_fast, tol_fast_logits) << lay.name() << " item " << i << " logits";
        worst[0] = std::max(worst[0], e_ref);
        worst[1] = std::max(worst[1], e_twin);
        worst[2] = std::max(worst[2], std::max(e_fast, l_fast));
        worst[3] = std::max(worst[3], fast_ref);
    }
    std::printf("[ measured ] %s, 7 items (G 1..7): vs reference %.2e, vs CPU twin (ref path) %.2e, vs CPU fast path "
                "%.2e (its own error vs reference %.2e)\n",
                lay.name().c_str(), worst[0], worst[1], worst[2], worst[3]);
    // the split made short ranges: some range holds fewer slots than a chunk
    bool short_range = false;
    for (const cuda_attn_task& t : r.plan.tasks) short_range |= !t.sink && t.s1 - t.s0 < k_attn_chunk;
    EXPECT_TRUE(short_range);
    // eviction left KIVI groups shorter than the group size (merged ones among them)
    if (lay.kivi()) {
        EXPECT_TRUE(has_short_group(items[3]) && has_short_group(items[6]));
    }
}

INSTANTIATE_TEST_SUITE_P(KeyValue, CudaAttentionDecode, ::testing::ValuesIn(all_layout_pairs()),
                         [](const ::testing::TestParamInfo<layout>& i) { return i.param.name(); });

// One range per slot (min_range 1, many blocks): every partial is a single
// slot, the merge combines up to 1,300 of them (past the 1,024 whose weights
// it keeps in shared memory).
TEST(CudaAttentionDecodeSplit, RangesOfOneSlot) {
    const layout lay{8, 8};
    std::vector<test_item> items;
    items.push_back(build_item({4, 8, 40, 2, 1, 4, 1.0f, 32}, lay, 5));
    items.push_back(build_item({32, 16, 25, 1, 1, 0, 1.0f, 32}, lay, 6));
    items.push_back(build_item({8, 8, 1300, 2, 1, 0, 1.0f, 32}, lay, 7));
    std::vector<test_item*> ptrs{&items[0], &items[1], &items[2]};
    const gpu_result r = run_gpu(ptrs, 10000, 1);
    for (const cuda_attn_task& t : r.plan.tasks) {
        if (!t.sink) {
            EXPECT_EQ(t.s1 - t.s0, 1);
        }
    }
    for (size_t i = 0; i < items.size(); i++) EXPECT_LE(rel_err(r.out[i], reference(items[i])), 2e-6) << i;
}

// The fast kernel (attention_decode_fast.h): every task of a batch it takes
// whole, at every layout pair, against the double reference and the CPU twin's
// reference path with the generic kernel's tolerances: the batch (up to 8
// query rows: the kernel's 8-row build) in both variants, and its items of at
// most 4 rows with a 4-row one of the 1.5B's head shape (the 4-row build).
TEST_P(CudaAttentionDecode, FastKernelMatchesCpuTwinAndReference) {
    const layout lay = GetParam();
    std::vector<item_spec> specs = fast_batch_specs();
    specs.push_back({128, 128, 300, 4, 1, 4, 1.0f, 32});  // four rows, sinks, the window
    std::vector<test_item> items;
    for (size_t i = 0; i < specs.size(); i++) items.push_back(build_item(specs[i], lay, 2000 + 31 * (uint32_t)i));
    auto check = [&](const std::vector<size_t>& which, int P, int want_rows) {
        std::vector<test_item*> ptrs;
        for (size_t i : which) ptrs.push_back(&items[i]);
        const gpu_result r = run_gpu(ptrs, 40, 8, false, P);
        EXPECT_EQ(r.plan.n_fast, (int)r.plan.tasks.size()) << "every task on the fast kernel";
        EXPECT_EQ(r.plan.max_fast_rows, want_rows);
        for (size_t k = 0; k < which.size(); k++) {
            std::vector<float> lg;
            const test_item& it = items[which[k]];
            const std::vector<float> ref = reference(it), twin = cpu_twin(it, lg);
            const double e_ref = rel_err(r.out[k], ref), e_twin = rel_err(r.out[k], twin);
            EXPECT_LE(e_ref, 2e-6) << lay.name() << " variant " << P << " item " << which[k];
            EXPECT_LE(e_twin, 1e-5) << lay.name() << " variant " << P << " item " << which[k];
            std::printf("fast variant %d, %d rows, %s item %zu: vs reference %.2e, vs CPU twin (ref path) %.2e\n", P,
                        want_rows, lay.name().c_str(), which[k], e_ref, e_twin);
        }
    };
    std::vector<size_t> all, small;
    for (size_t i = 0; i < specs.size(); i++) {
        all.push_back(i);
        if (specs[i].n_group * specs[i].n_tok <= 4) small.push_back(i);
    }
    ASSERT_GE(small.size(), 4u);
    for (const int P : {0, 1}) check(all, P, 8);  // the kernel's two variants (warps x slots per lane)
    check(small, 0, 4);
}

// A batch only the generic kernel takes (a plan's key parts, vector-coded
// values): one launch (with or without logits), no task on the fast kernel,
// every item's output (and logits) against the double reference (2e-6) and
// the CPU twin's reference path (1e-5). Returns the worst of each.
std::pair<double, double> check_generic_batch(std::vector<test_item>& items, const std::string& name, bool logits) {
    std::vector<test_item*> ptrs;
    for (auto& t : items) ptrs.push_back(&t);
    const gpu_result r = run_gpu(ptrs, 40, 8, logits);
    EXPECT_EQ(r.plan.n_fast, 0) << name;
    std::pair<double, double> worst{0, 0};
    for (size_t i = 0; i < items.size(); i++) {
        std::vector<float> ref_logits, twin_logits;
        const std::vector<float> ref = reference(items[i], &ref_logits);
        const std::vector<float> twin = cpu_twin(items[i], twin_logits, true);
        double e_ref = rel_err(r.out[i], ref), e_twin = rel_err(r.out[i], twin);
        if (logits) {
            e_ref = std::max(e_ref, rel_err(r.logits[i], ref_logits));
            e_twin = std::max(e_twin, rel_err(r.logits[i], twin_logits));
        }
        EXPECT_LE(e_ref, 2e-6) << name << " item " << i;
        EXPECT_LE(e_twin, 1e-5) << name << " item " << i;
        worst.first = std::max(worst.first, e_ref);
        worst.second = std::max(worst.second, e_twin);
    }
    return worst;
}

// Keys with a plan's parts (2-bit channels in 4-bit keys, a 1-bit tail, 0-bit
// channels; kv_read.cuh reads them element by element): 4- and 2-bit keys
// against 16-, 8- and 4-bit values, on the batch's shapes (ranks 4 .. 128,
// sinks, eviction, multi-token steps; parts clamped to each rank as the cache
// clamps them), with the generic kernel's tolerances. The fast kernel does not
// take them (attention_decode_fast.h): without logits asked, every task still
// runs on the generic kernel.
TEST(CudaAttentionDecodeKeyParts, MatchesCpuTwinAndReference) {
    struct parts {
        int mid, tail, zero;
    };
    const parts cases[] = {{40, 24, 16}, {0, 8, 0}, {0, 0, 32}, {24, 0, 0}, {0, 70, 9}};
    const int pairs[3][2] = {{4, 16}, {4, 4}, {2, 8}};  // key bits, value bits
    bool fast_checked = false;
    for (const auto& kvb : pairs)
        for (const parts& pc : cases) {
            const int bits_k = kvb[0], bits_v = kvb[1];
            if (bits_k == 2 && pc.mid > 0) continue;  // 2-bit channels are in 4-bit keys only
            const layout lay{bits_k, bits_v};
            std::vector<item_spec> specs = decode_batch_specs();
            std::vector<test_item> items;
            for (size_t i = 0; i < specs.size(); i++) {
                specs[i].gear = GEAR_OFF;  // GEAR corrects neither part
                specs[i].mid = pc.mid, specs[i].tail = pc.tail, specs[i].zero = pc.zero;
                items.push_back(build_item(specs[i], lay, 3000 + 13 * (uint32_t)i));
            }
            // the parts reached the view of the widest item
            const attn_kv_view v3 = items[3].cache->view(0, 0);
            EXPECT_EQ(v3.k.mid + v3.k.tail + v3.k.zero, (bits_k == 4 ? pc.mid : 0) + pc.tail + pc.zero);
            const std::string name =
                lay.name() + " mid " + std::to_string(pc.mid) + " tail " + std::to_string(pc.tail) + " zero " +
                std::to_string(pc.zero);
            for (const bool logits : {true, false}) {
                if (!logits && fast_checked) continue;  // once: what the fast kernel would take, it does not
                fast_checked |= !logits;
                const auto worst = check_generic_batch(items, name, logits);
                if (logits)
                    std::printf("[ measured ] key parts %s: vs reference %.2e, vs CPU twin (ref path) %.2e\n",
                                name.c_str(), worst.first, worst.second);
            }
        }
}

// Vector-coded values (4 x 64 and 8 x 256 books; kv_read.cuh decodes a slot's
// codes against its head's book) under 16-, 8- and 4-bit keys and under 4-bit
// keys with a plan's 2/1/0-bit parts (what the 10% plans are), on the batch's
// shapes with value ranks a multiple of 8 (a code's channels), GEAR off; the
// generic kernel's tolerances, and the fast kernel takes none of them.
TEST(CudaAttentionDecodeVectorCodes, MatchesCpuTwinAndReference) {
    struct vcase {
        int bits_k, bits_v, mid, tail, zero;
    };
    const vcase cases[] = {{16, 1, 0, 0, 0}, {8, 0, 0, 0, 0}, {4, 1, 0, 0, 0}, {4, 0, 40, 24, 16}};
    for (const vcase& vc : cases) {
        const layout lay{vc.bits_k, vc.bits_v};
        std::vector<item_spec> specs = decode_batch_specs();
        std::vector<test_item> items;
        for (size_t i = 0; i < specs.size(); i++) {
            item_spec& sp = specs[i];
            sp.r_v = (sp.r_v + 7) / 8 * 8;
            sp.gear = GEAR_OFF;
            sp.mid = vc.mid, sp.tail = vc.tail, sp.zero = vc.zero;
            items.push_back(build_item(sp, lay, 4000 + 11 * (uint32_t)i));
        }
        ASSERT_EQ(items[3].cache->view(0, 0).v.layout, KV_LAYOUT_VQ);
        const std::string name = lay.name() + (vc.tail ? " with key parts" : "");
        for (const bool logits : {true, false}) {
            const auto worst = check_generic_batch(items, name, logits);
            if (logits)
                std::printf("[ measured ] vector-coded values %s: vs reference %.2e, vs CPU twin (ref path) %.2e\n",
                            name.c_str(), worst.first, worst.second);
        }
    }
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
        // fast tasks first, then the generic kernel's; each part longest first
        if (k > 0 && (int)k != p.n_fast) {
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

// The 8K attention at every cache layout pair: two KV heads of unequal rank,
// three query heads each, exact sinks, 8192 tokens (with a KIVI side: 8064
// quantized in 252 groups plus the 128-token residual window), split over ~264
// blocks (two waves of an H100's 132 SMs). The CPU twin runs one 8K range in
// float (its own error vs the reference reaches ~6e-6 here), hence 2e-5.
TEST_P(CudaAttentionDecode, EightThousandSlots) {
    const layout lay = GetParam();
    std::vector<test_item> items;
    items.push_back(build_item({64, 64, 8192, 3, 1, 4, 1.0f, 32}, lay, 77));
    items.push_back(build_item({128, 32, 8192, 3, 1, 4, 1.0f, 32, dtype::F16, GEAR_RANK2}, lay, 78));
    std::vector<test_item*> ptrs{&items[0], &items[1]};
    const gpu_result r = run_gpu(ptrs, 264, 32);
    for (size_t i = 0; i < items.size(); i++) {
        std::vector<float> lg;
        const std::vector<float> ref = reference(items[i]), twin = cpu_twin(items[i], lg);
        const double e_ref = rel_err(r.out[i], ref), e_twin = rel_err(r.out[i], twin);
        EXPECT_LE(e_ref, 2e-6) << lay.name() << " item " << i;
        EXPECT_LE(e_twin, 2e-5) << lay.name() << " item " << i;
        std::printf("8K %s item %zu: %zu tasks; vs reference %.2e, vs CPU twin (ref path) %.2e (its own error vs "
                    "reference %.2e)\n",
                    lay.name().c_str(), i, r.plan.tasks.size(), e_ref, e_twin, rel_err(twin, ref));
    }
}

}  // namespace
