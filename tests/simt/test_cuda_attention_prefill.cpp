// Prefill attention on the GPU (kernels/cuda/attention_prefill.cu) against the
// CPU at every key x value layout pair: kernel_attention_prefill (the CPU's
// tiled kernel, for 16-bit blocks without sinks), kernel_attention_range(_ref)
// + sinks + merge (any block), and a double reference over the cache as
// read_slot dequantizes it; items of several ranks (4 .. 128, odd), G = 1..7
// query heads per KV head, f16 and f32 rows, a fresh prompt and a prompt after
// a prefix, evicted slots and merged KIVI groups, exact sinks, GEAR on the
// KIVI sides, many tiles per item; a plan's keys with 2/1/0-bit channels and
// vector-coded values. Tolerance (max |gpu - ref| / (1 + max
// |ref|)): 2e-6 vs the reference, 1e-5 vs the CPU kernels that dequantize to
// float (prefill, range reference path); vs the range fast path 1e-5, with a
// KIVI side 3e-2 (its int8 query rounding).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kernels/attention_prefill.h"
#include "kernels/cuda/attention_prefill.h"
#include "tests/simt/attention_decode_fixture.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

// The item's queries as a prefill's: the last n_tok slots are its tokens.
void as_prefill(test_item& it) {
    const attn_kv_view v = it.cache->view(0, 0);
    for (int t = 0; t < it.spec.n_tok; t++) it.q_pos[t] = v.pos[v.n_slots - it.spec.n_tok + t];
}

std::vector<float> cpu_prefill(const test_item& it, bool& ran) {
    const attn_kv_view kv = it.cache->view(0, 0);
    ran = kernel_prefill_supported(kv);
    if (!ran) return {};
    const int G = it.spec.n_group, n_tok = it.spec.n_tok;
    std::vector<float> kt(kernel_prefill_keys_size(kv.n_slots, kv.r_k));
    const int64_t B = kernel_prefill_key_block();
    kernel_prefill_keys(kv, 0, (kv.n_slots + B - 1) / B, kt.data());
    std::vector<float> scratch(kernel_prefill_scratch(G, n_tok, kv.r_k, kv.r_v));
    std::vector<float> out((size_t)n_tok * G * it.width, 0.0f);
    const attn_q_view q{it.q.data(), (int64_t)G * k_head_dim, k_head_dim, G, n_tok, it.q_pos.data(), k_scale};
    kernel_attention_prefill(kv, kt.data(), q, out.data(), (int64_t)G * it.width, it.width, scratch.data());
    return out;
}

// The batch of the layout tests: one item per G = 1..7.
std::vector<item_spec> prefill_specs() {
    return {
        // r_k r_v len  G  tok sinks keep group type     gear
        {128, 96, 120, 1, 40, 0, 1.0f, 32, dtype::F16, GEAR_OFF},    // a prompt after an 80-token prefix
        {16, 16, 70, 2, 70, 0, 1.0f, 32, dtype::F32, GEAR_RANK2},    // a fresh prompt
        {4, 8, 150, 3, 33, 0, 1.0f, 32, dtype::F16, GEAR_OFF},       // rank 4
        {64, 64, 200, 4, 40, 0, 0.5f, 32, dtype::F16, GEAR_RANK2},   // evicted (gaps, merged groups)
        {12, 20, 90, 5, 20, 4, 1.0f, 16, dtype::F32, GEAR_SPARSE},   // exact sinks
        {36, 100, 100, 6, 12, 4, 0.6f, 8, dtype::F16, GEAR_RANK2},   // sinks and eviction
        {13, 7, 60, 7, 9, 0, 1.0f, 16, dtype::F16, GEAR_SPARSE},     // odd ranks, seven heads
    };
}

// The items of specs in `lay`, prefilled on the GPU in one launch, against the
// reference and the CPU kernels; name labels the printed figures.
void check_prefill(const layout& lay, const std::vector<item_spec>& specs, const std::string& name) {
    std::vector<test_item> items;
    for (size_t i = 0; i < specs.size(); i++) {
        items.push_back(build_item(specs[i], lay, 300 + 7 * (uint32_t)i));
        test_item& t = items.back();
        // eviction may leave fewer slots than tokens: query the last ones
        t.spec.n_tok = (int)std::min<int64_t>(t.spec.n_tok, t.cache->view(0, 0).n_slots);
        t.q.resize((size_t)t.spec.n_tok * t.spec.n_group * k_head_dim);
        t.q_pos.resize(t.spec.n_tok);
        as_prefill(t);
    }
    device_pool pool;
    std::vector<cuda_attn_item> host;
    std::vector<dptr<float>> outs;
    for (const test_item& t : items) {
        cuda_attn_item ci;
        ci.kv = upload_kv_block(pool, *t.cache, 0, 0);
        ci.q = pool.up(t.q, "q");
        ci.q_stride = (int64_t)t.spec.n_group * k_head_dim;
        ci.q_head_stride = k_head_dim;
        ci.n_group = t.spec.n_group;
        ci.n_tok = t.spec.n_tok;
        ci.q_pos = pool.up(t.q_pos, "q_pos");
        ci.scale = k_scale;
        outs.push_back(pool.zeros<float>((size_t)t.spec.n_tok * t.spec.n_group * t.width, "out"));
        ci.out = outs.back();
        ci.out_stride = (int64_t)t.spec.n_group * t.width;
        ci.out_head_stride = t.width;
        host.push_back(ci);
    }
    const cuda_prefill_plan plan = cuda_prefill_plan_make(host, 8);
    cuda_attention_prefill(pool.up(host, "items"), plan, pool.up(plan.tasks, "tasks"), nullptr);
    const double tol_fast = lay.kivi() ? 3e-2 : 1e-5;
    double worst[4] = {0, 0, 0, 0};  // vs reference, range ref path, CPU prefill, range fast path
    int n_prefill = 0;
    for (size_t i = 0; i < items.size(); i++) {
        const test_item& t = items[i];
        const std::vector<float> got = pool.down(outs[i], (size_t)t.spec.n_tok * t.spec.n_group * t.width);
        std::vector<float> lg;
        const double e_ref = rel_err(got, reference(t)), e_twin = rel_err(got, cpu_twin(t, lg, true));
        const double e_fast = rel_err(got, cpu_twin(t, lg, false));
        bool ran = false;
        const std::vector<float> pf = cpu_prefill(t, ran);
        const double e_pf = ran ? rel_err(got, pf) : 0.0;
        n_prefill += ran;
        EXPECT_LE(e_ref, 2e-6) << name << " item " << i;
        EXPECT_LE(e_twin, 1e-5) << name << " item " << i;
        EXPECT_LE(e_pf, 1e-5) << name << " item " << i;
        EXPECT_LE(e_fast, tol_fast) << name << " item " << i;
        worst[0] = std::max(worst[0], e_ref);
        worst[1] = std::max(worst[1], e_twin);
        worst[2] = std::max(worst[2], e_pf);
        worst[3] = std::max(worst[3], e_fast);
    }
    std::printf("[ measured ] %s, %zu tiles: vs reference %.2e, vs range+merge (ref path) %.2e, vs CPU prefill %.2e "
                "(%d items), vs range fast path %.2e\n",
                name.c_str(), plan.tasks.size(), worst[0], worst[1], worst[2], n_prefill, worst[3]);
}

class CudaAttentionPrefill : public ::testing::TestWithParam<layout> {};

TEST_P(CudaAttentionPrefill, MatchesCpuAndReference) { check_prefill(GetParam(), prefill_specs(), GetParam().name()); }

// Keys with a plan's parts (2-bit channels in 4-bit keys, a 1-bit tail, 0-bit
// channels; kv_read.cuh), clamped to each item's rank as the cache does; GEAR
// off (it corrects neither).
TEST(CudaAttentionPrefill, KeyParts) {
    const int cases[3][3] = {{40, 24, 16}, {0, 70, 9}, {24, 0, 0}};  // mid, tail, zero
    for (const layout lay : {layout{4, 16}, layout{4, 4}, layout{2, 8}})
        for (const auto& pc : cases) {
            if (lay.bits_k == 2 && pc[0] > 0) continue;  // 2-bit channels are in 4-bit keys only
            std::vector<item_spec> specs = prefill_specs();
            for (item_spec& s : specs) s.gear = GEAR_OFF, s.mid = pc[0], s.tail = pc[1], s.zero = pc[2];
            check_prefill(lay, specs, lay.name() + " mid " + std::to_string(pc[0]) + " tail " +
                                          std::to_string(pc[1]) + " zero " + std::to_string(pc[2]));
        }
}

// Vector-coded values (4 x 64 and 8 x 256 books), under 16-bit keys and under
// 4-bit keys with a plan's parts; value ranks rounded up to a multiple of 8.
TEST(CudaAttentionPrefill, VectorCodedValues) {
    for (const layout lay : {layout{16, 1}, layout{4, 0}}) {
        std::vector<item_spec> specs = prefill_specs();
        for (item_spec& s : specs) {
            s.gear = GEAR_OFF;
            s.r_v = (s.r_v + 7) / 8 * 8;
            if (lay.bits_k == 4) s.mid = 40, s.tail = 24, s.zero = 16;
        }
        check_prefill(lay, specs, lay.name() + (lay.bits_k == 4 ? " with key parts" : ""));
    }
}

INSTANTIATE_TEST_SUITE_P(KeyValue, CudaAttentionPrefill, ::testing::ValuesIn(all_layout_pairs()),
                         [](const ::testing::TestParamInfo<layout>& i) { return i.param.name(); });

// Rows per tile grow as r_k + r_v shrinks, so tiles cost the same; longest first.
TEST(CudaAttentionPrefill, TilesCarryEqualWork) {
    std::vector<cuda_attn_item> items(3);
    const int r[3] = {128, 64, 16};
    for (int i = 0; i < 3; i++) {
        items[i].kv.r_k = items[i].kv.r_v = r[i];
        items[i].kv.n_slots = 512;
        items[i].n_tok = 512;
        items[i].n_group = 1;
    }
    const cuda_prefill_plan p = cuda_prefill_plan_make(items, 8, 160 * 1024);
    int rows[3] = {0, 0, 0};
    for (size_t k = 0; k < p.tasks.size(); k++) {
        rows[p.tasks[k].item] = std::max(rows[p.tasks[k].item], p.tasks[k].n_rows);
        if (k > 0) {
            EXPECT_LE(p.tasks[k].cost, p.tasks[k - 1].cost);
        }
    }
    EXPECT_EQ(rows[0], 8);
    EXPECT_EQ(rows[1], 16);
    EXPECT_EQ(rows[2], 64);
    // the last tiles of equal rows cost the same across heads of unequal rank
    int64_t last_cost[3] = {0, 0, 0};
    for (const cuda_prefill_task& t : p.tasks)
        if (t.row0 + t.n_rows == 512) last_cost[t.item] = t.cost;
    EXPECT_EQ(last_cost[0], last_cost[1]);
    EXPECT_EQ(last_cost[1], last_cost[2]);
    // a description the kernels cannot read is refused: quantized slots in a
    // rows side, sinks narrower than the keys, ranks past 256
    std::vector<cuda_attn_item> q(1);
    q[0].kv.r_k = q[0].kv.r_v = 8;
    q[0].kv.n_slots = 10;
    q[0].kv.k.n_quant = 4;
    EXPECT_THROW(cuda_prefill_plan_make(q, 8), zk::error);
    q[0].kv.k.n_quant = 0;
    q[0].kv.n_sink_slots = 2;
    q[0].kv.sink_dim = 4;
    EXPECT_THROW(cuda_prefill_plan_make(q, 8), zk::error);
    q[0].kv.n_sink_slots = 0;
    q[0].kv.r_v = 300;
    EXPECT_THROW(cuda_prefill_plan_make(q, 8), zk::error);
    q[0].kv.r_v = 8;
    EXPECT_NO_THROW(cuda_prefill_plan_make(q, 8));
}

}  // namespace
