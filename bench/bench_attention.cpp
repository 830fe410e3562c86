// Decode attention over one layer's KV cache (3 KV heads x 3 query heads each,
// SmolLM2's shape) for one new token, single thread: per (rank, bits, context).
// Args: rank (r_k = r_v), bits (16 = f16, 8, 4, 5 = 4-bit + GEAR), context.
// Items/s counts cached tokens read, so bytes per token read is comparable.
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "engine/kv_cache.h"
#include "kernels/attention.h"

using namespace zk;

namespace {

constexpr int k_heads = 3, k_group = 3;

void BM_decode_attention(benchmark::State& st) {
    const int r = (int)st.range(0), bits = (int)st.range(1);
    const int64_t n = st.range(2);
    kv_cache_params p;
    p.bits = bits == 5 ? 4 : bits;
    p.gear = bits == 5;
    kv_cache c(1, k_heads, n, p, std::vector<int>(k_heads, r), std::vector<int>(k_heads, r));
    std::mt19937 g(1);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> rows((size_t)256 * r);
    std::vector<int32_t> pos(256);
    for (int h = 0; h < k_heads; h++)
        for (int64_t t = 0; t < n; t += 256) {
            const int64_t k = std::min<int64_t>(256, n - t);
            for (auto& x : rows) x = N(g);
            for (int64_t i = 0; i < k; i++) pos[i] = (int32_t)(t + i);
            c.append(0, h, k, rows.data(), r, rows.data(), r, pos.data());
        }
    std::vector<float> q((size_t)k_group * r), m(k_group), l(k_group), acc((size_t)k_group * r), out(acc.size());
    for (auto& x : q) x = N(g);
    std::vector<float> scratch(kernel_attention_scratch(k_group, n, r, r, p.gear ? p.gear_rank : 0));
    const int32_t qpos = (int32_t)n;
    for (auto _ : st) {
        for (int h = 0; h < k_heads; h++) {
            const attn_kv_view kv = c.view(0, h);
            attn_q_view qv{q.data(), 0, r, k_group, 1, &qpos, 0.125f};
            attn_partial part{m.data(), l.data(), acc.data()};
            kernel_attention_range(kv, 0, kv.n_slots, qv, part, scratch.data());
            kernel_attention_merge(&part, 1, 1, k_group, r, out.data(), 0, r);
        }
        benchmark::DoNotOptimize(out.data());
    }
    st.SetItemsProcessed(st.iterations() * n * k_heads);
    st.counters["kv_bytes_per_token"] = c.bytes_per_token_exact() / k_heads;
}

void args(benchmark::internal::Benchmark* b) {
    for (int64_t ctx : {2048, 8192})
        for (int r : {64, 44, 32, 20, 16})  // 44, 20: ZACK ranks with a partial value block
            for (int bits : {16, 8, 4, 5}) b->Args({r, bits, ctx});
}

}  // namespace

BENCHMARK(BM_decode_attention)->Apply(args)->Unit(benchmark::kMicrosecond);
