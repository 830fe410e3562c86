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
#include "tests/simt/cuda_test_util.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

struct layout {
    const char* name;
    int bits;
    dtype type;
    bool gear;
};

struct item_spec {
    int r_k, r_v;
    int len;       // tokens appended
    int n_group;   // query heads of the KV head
    int n_tok;     // query tokens
    int sinks;     // exact sinks (0: none)
    float keep;    // fraction kept by eviction (1: none)
    int group;     // 4-bit key group
};

constexpr int k_head_dim = 128;

// Rows with the structure real caches have: per-channel offsets and scales,
// a shared low-rank part, a few outliers.
std::vector<float> make_rows(int n, int d, std::mt19937& g) {
    std::normal_distribution<float> N(0, 1);
    std::vector<float> off(d), sc(d), w(d), x((size_t)n * d);
    for (int c = 0; c < d; c++) off[c] = 0.5f * N(g), sc[c] = 2.0f / (1.0f + 0.05f * c), w[c] = N(g);
    for (int t = 0; t < n; t++) {
        const float u = N(g);
        for (int c = 0; c < d; c++) x[(size_t)t * d + c] = off[c] + sc[c] * (0.7f * N(g) + 0.5f * u * w[c]);
    }
    for (int i = 0; i < n * d / 200; i++) x[g() % (n * d)] += 6.0f * N(g);
    return x;
}

// One item: its CPU cache, queries and the expected outputs.
struct test_item {
    item_spec spec;
    std::unique_ptr<kv_cache> cache;
    std::vector<float> q;        // [n_tok x G x head_dim]
    std::vector<int32_t> q_pos;  // [n_tok]
    int width = 0;               // output channels: max(r_v, sink_dim)
};

test_item build_item(const item_spec& s, const layout& lay, uint32_t seed) {
    test_item it;
    it.spec = s;
    std::mt19937 g(seed);
    kv_cache_params p;
    p.type = lay.type;
    p.bits = lay.bits;
    p.gear = lay.gear;
    p.group = s.group;
    p.evicting = s.keep < 1.0f;
    p.sinks = s.sinks;
    p.sink_dim = s.sinks > 0 ? k_head_dim : 0;
    it.cache = std::make_unique<kv_cache>(1, 1, std::max(s.len, 1), p, std::vector<int>{s.r_k}, std::vector<int>{s.r_v});
    const std::vector<float> K = make_rows(s.len, k_head_dim, g), V = make_rows(s.len, k_head_dim, g);
    std::vector<int32_t> pos(s.len);
    for (int t = 0; t < s.len; t++) pos[t] = t;
    // in two appends, as prefill then decode would
    const int a = s.len / 2;
    it.cache->append(0, 0, a, K.data(), k_head_dim, V.data(), k_head_dim, pos.data());
    it.cache->append(0, 0, s.len - a, K.data() + (size_t)a * k_head_dim, k_head_dim, V.data() + (size_t)a * k_head_dim,
                     k_head_dim, pos.data() + a);
    if (s.keep < 1.0f) {
        const kv_block& b = it.cache->block(0, 0);
        std::vector<uint8_t> keep((size_t)b.n_used);
        std::uniform_real_distribution<float> U(0, 1);
        for (int64_t i = 0; i < b.n_used; i++) keep[i] = b.pos[i] < s.sinks || U(g) < s.keep;
        it.cache->compact(0, 0, keep.data());
    }
    const int G = s.n_group;
    std::normal_distribution<float> N(0, 1);
    it.q.resize((size_t)s.n_tok * G * k_head_dim);
    for (auto& x : it.q) x = N(g);
    const int32_t last = s.len - 1;
    it.q_pos.resize(s.n_tok);
    // earlier tokens of a multi-token step see fewer slots (causal)
    for (int t = 0; t < s.n_tok; t++) it.q_pos[t] = last - 3 * (s.n_tok - 1 - t);
    it.width = std::max(s.r_v, s.sinks > 0 ? k_head_dim : 0);
    return it;
}

const float k_scale = 1.0f / std::sqrt((float)k_head_dim);

// Double-precision attention over the cache as read_slot dequantizes it (sink
// slots: their exact rows at full head dim). out [n_tok x G x width]; logits
// (optional) [n_tok x G x n_slots], -inf where a token cannot see the slot.
std::vector<float> reference(const test_item& it, std::vector<float>* logits = nullptr) {
    const item_spec& s = it.spec;
    const kv_block& b = it.cache->block(0, 0);
    const attn_kv_view kv = it.cache->view(0, 0);
    const int G = s.n_group, W = it.width;
    std::vector<float> out((size_t)s.n_tok * G * W, 0.0f);
    std::vector<float> kr(k_head_dim), vr(k_head_dim);
    if (logits) logits->assign((size_t)s.n_tok * G * b.n_used, -INFINITY);
    for (int t = 0; t < s.n_tok; t++)
        for (int j = 0; j < G; j++) {
            const float* q = &it.q[((size_t)t * G + j) * k_head_dim];
            std::vector<double> sc(b.n_used, -INFINITY), acc(W, 0.0);
            double mx = -INFINITY;
            for (int64_t sl = 0; sl < b.n_used; sl++) {
                if (b.pos[sl] > it.q_pos[t]) continue;
                const bool sink = sl < kv.n_sink_slots;
                int rk = s.r_k;
                if (sink) {
                    rk = kv.sink_dim;
                    std::copy_n(kv.sink_k + (size_t)b.pos[sl] * kv.sink_dim, rk, kr.begin());
                } else {
                    it.cache->read_slot(0, 0, sl, kr.data(), vr.data());
                }
                double d = 0;
                for (int c = 0; c < rk; c++) d += (double)q[c] * kr[c];
                sc[sl] = d * k_scale;
                mx = std::max(mx, sc[sl]);
                if (logits) (*logits)[((size_t)t * G + j) * b.n_used + sl] = (float)sc[sl];
            }
            if (mx == -INFINITY) continue;
            double l = 0;
            for (int64_t sl = 0; sl < b.n_used; sl++) {
                if (sc[sl] == -INFINITY) continue;
                const double e = std::exp(sc[sl] - mx);
                l += e;
                const bool sink = sl < kv.n_sink_slots;
                int rv = s.r_v;
                if (sink) {
                    rv = kv.sink_dim;
                    std::copy_n(kv.sink_v + (size_t)b.pos[sl] * kv.sink_dim, rv, vr.begin());
                } else {
                    it.cache->read_slot(0, 0, sl, kr.data(), vr.data());
                }
                for (int c = 0; c < rv; c++) acc[c] += e * vr[c];
            }
            for (int c = 0; c < W; c++) out[((size_t)t * G + j) * W + c] = (float)(acc[c] / l);
        }
    return out;
}

// The CPU twin: one range over the block, the sink partial, the merge.
// logits [n_tok x G x n_slots].
std::vector<float> cpu_twin(const test_item& it, std::vector<float>& logits) {
    const item_spec& s = it.spec;
    const attn_kv_view kv = it.cache->view(0, 0);
    const int G = s.n_group, W = it.width, rows = s.n_tok * G;
    const int64_t n = kv.n_slots;
    const attn_q_view q{it.q.data(), (int64_t)G * k_head_dim, k_head_dim, G, s.n_tok, it.q_pos.data(), k_scale};
    logits.assign((size_t)rows * n, -INFINITY);
    std::vector<float> m(rows), l(rows), acc((size_t)rows * kv.r_v), sm(rows), sl(rows),
        sacc((size_t)rows * std::max(kv.sink_dim, 1));
    std::vector<float> scratch(kernel_attention_scratch(G, n, kv.r_k, kv.r_v, std::max(kv.gear_k.rank, kv.gear_v.rank)));
    attn_partial parts[2] = {attn_partial{m.data(), l.data(), acc.data(), logits.data(), n},
                             attn_partial{sm.data(), sl.data(), sacc.data(), logits.data(), n, kv.sink_dim}};
    kernel_attention_range(kv, 0, n, q, parts[0], scratch.data());
    int np = 1;
    if (kv.n_sink_slots > 0) kernel_attention_sinks(kv, q, parts[np++]);
    std::vector<float> out((size_t)rows * W, 0.0f);
    kernel_attention_merge(parts, np, s.n_tok, G, kv.r_v, out.data(), (int64_t)G * W, W);
    return out;
}

struct gpu_result {
    std::vector<std::vector<float>> out, logits;
    cuda_attn_plan plan;
};

// All items in one launch.
gpu_result run_gpu(const std::vector<test_item*>& items, int blocks, int64_t min_range) {
    device_pool pool;
    std::vector<cuda_attn_item> host;
    std::vector<dptr<float>> outs, lgs;
    for (const test_item* t : items) {
        const item_spec& s = t->spec;
        cuda_attn_item ci;
        ci.kv = upload_kv_block(pool, *t->cache, 0, 0);
        ci.q = pool.up(t->q, "q");
        ci.q_stride = (int64_t)s.n_group * k_head_dim;
        ci.q_head_stride = k_head_dim;
        ci.n_group = s.n_group;
        ci.n_tok = s.n_tok;
        ci.q_pos = pool.up(t->q_pos, "q_pos");
        ci.scale = k_scale;
        outs.push_back(pool.zeros<float>((size_t)s.n_tok * s.n_group * t->width, "out"));
        ci.out = outs.back();
        ci.out_stride = (int64_t)s.n_group * t->width;
        ci.out_head_stride = t->width;
        const int64_t ns = std::max<int64_t>(ci.kv.n_slots, 1);
        lgs.push_back(pool.zeros<float>((size_t)s.n_tok * s.n_group * ns, "logits"));
        ci.logits = lgs.back();
        ci.logits_stride = ns;
        host.push_back(ci);
    }
    gpu_result r;
    r.plan = cuda_attn_plan_make(host, blocks, min_range);
    const dptr<const cuda_attn_item> ditems = pool.up(host, "items");
    cuda_attn_plan_device dp;
    dp.tasks = pool.up(r.plan.tasks, "tasks");
    dp.n_tasks = (int)r.plan.tasks.size();
    dp.parts = pool.up(r.plan.parts, "parts");
    dp.item_parts = pool.up(r.plan.item_parts, "item parts");
    const dptr<float> partials = pool.zeros<float>((size_t)std::max<int64_t>(r.plan.partial_floats, 1), "partials");
    cuda_attention_decode(ditems, (int)host.size(), r.plan, dp, partials, nullptr);
    cuda_stream_sync(nullptr);
    for (size_t i = 0; i < items.size(); i++) {
        const item_spec& s = items[i]->spec;
        r.out.push_back(pool.down(outs[i], (size_t)s.n_tok * s.n_group * items[i]->width));
        r.logits.push_back(pool.down(lgs[i], (size_t)s.n_tok * s.n_group * std::max<int64_t>(host[i].kv.n_slots, 1)));
    }
    return r;
}

const layout k_layouts[] = {
    {"f32", 16, dtype::F32, false}, {"f16", 16, dtype::F16, false}, {"q8", 8, dtype::F16, false},
    {"q4", 4, dtype::F16, false},   {"q4_gear", 4, dtype::F16, true},
};

class CudaAttentionDecode : public ::testing::TestWithParam<int> {};

// A batch mixing every shape the issue names; one launch, many small ranges.
TEST_P(CudaAttentionDecode, MatchesCpuTwinAndReference) {
    const layout& lay = k_layouts[GetParam()];
    const std::vector<item_spec> specs = {
        // r_k r_v len  G  tok sinks keep  group
        {4, 4, 300, 1, 1, 0, 1.0f, 32},      // rank 4
        {64, 64, 1, 3, 1, 0, 1.0f, 32},      // one slot
        {12, 20, 37, 3, 2, 4, 1.0f, 32},     // uneven, sinks, two tokens
        {128, 96, 300, 2, 1, 4, 0.6f, 32},   // evicted, sinks
        {36, 100, 150, 7, 1, 0, 0.8f, 8},    // evicted, small groups, 7 heads
        {100, 36, 260, 1, 3, 0, 1.0f, 32},   // three tokens
    };
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
