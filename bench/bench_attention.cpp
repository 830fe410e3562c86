// Decode attention over one layer's KV cache (3 KV heads x 3 query heads each,
// SmolLM2's shape) for one new token, single thread: per (rank, bits, context);
// the _30_layers variant reads a whole model's cache, from DRAM; the _gqa
// variant takes the query heads per KV head as a fourth argument (2 KV heads:
// Qwen2.5-Coder-1.5B is d 128, G 6; the 0.5B d 64, G 7).
// Args: rank (r_k = r_v), bits (16 = f16, 8, 4, 5 = 4-bit + GEAR), context[, G].
// BM_decode_attention_threads/<rank>/<bits>/<context>/<G>/<threads>/<layers>/<cold>:
// a whole model's step on a thread pool, split into slot ranges as the CPU
// backend splits it (real time; s_per_layer a layer): the second thread's gain.
// cold 1: before each step (not timed) 640 MiB are read, more than the L3 of
// the boxes here, as a decode step's weights pass through it between two
// steps' attention: the cache then comes from DRAM, where with cold 0 a 62 MB
// cache stays in a large L3 from one step to the next.
// Items/s counts cached tokens read, so bytes per token read is comparable.
// BM_plan_attention/<plan>/<context>: a whole model's decode attention under a
// KV plan (calib/plan.h: each head's key/value precision and ranks), one
// benchmark per plan file listed in ZACK_BENCH_PLANS (comma-separated), G query
// heads per KV head from ZACK_BENCH_GROUP (default 6, Qwen2.5-Coder-1.5B); the
// counter us_per_layer is the time of one layer. Vector-coded values (value
// precision 1 or 0) read random books of calibrate's size, 8 x 256 ones with
// int8 copies where the build prefers them (ZACK_BENCH_VQ_INT8=0|1 forces). With ZACK_BENCH_SELECT=N
// each plan also runs as BM_plan_attention/<plan>/<context>/select<N>: every
// head selection applies to chooses its runs (KIVI keys: groups by their grid
// estimates; other keys: pages by their exact mass) and attends to them as a
// one-token decode step does with --kv-select N (counter heads_selected); the
// others attend to every slot.
// BM_select_groups/<bits>/<context>/<budget>: choosing a step's key groups for
// --kv-select over one such layer (the bounds and the top budget's worth);
// BM_select_attention: choosing and attending (also 16- and 8-bit caches).
// BM_key_grids/<bits>/<ref>: the clipped grids of one 32-token group of
// 128-dim keys (engine/kv_quant.h), eight channels a vector (ref 0) or one
// channel at a time (ref 1: kvq_key_grid_search's own SIMD path): what each
// KIVI group flush and every prefilled group pay per KV head.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "calib/codebook.h"
#include "calib/plan.h"
#include "engine/kv_cache.h"
#include "engine/kv_quant.h"
#include "engine/kv_select.h"
#include "ggml-like/threadpool.h"
#include "kernels/attention.h"

using namespace zk;

namespace {

// Fills every block of c with n tokens of normal rows, as a decode step would find it.
void fill_cache(kv_cache& c, int64_t n) {
    std::mt19937 g(1);
    std::normal_distribution<float> N(0, 1);
    std::vector<int32_t> pos(256);
    std::vector<float> rows;
    for (int l = 0; l < c.n_layer(); l++)
        for (int h = 0; h < c.n_head_kv(); h++) {
            const kv_block& b = c.block(l, h);
            const int r = std::max(b.r_k, b.r_v);
            rows.resize((size_t)256 * r);
            for (int64_t t = 0; t < n; t += 256) {
                const int64_t k = std::min<int64_t>(256, n - t);
                for (auto& x : rows) x = N(g);
                for (int64_t i = 0; i < k; i++) pos[i] = (int32_t)(t + i);
                c.append(l, h, k, rows.data(), r, rows.data(), r, pos.data());
            }
        }
}

// A cache of n_layers layers (k_heads heads, rank r for keys and values, n tokens).
kv_cache make_cache(int n_layers, int k_heads, int r, int bits, int64_t n) {
    kv_cache_params p;
    p.bits = bits == 5 ? 4 : bits;
    p.gear = bits == 5;
    kv_cache c(n_layers, k_heads, n, p, std::vector<int>((size_t)n_layers * k_heads, r),
               std::vector<int>((size_t)n_layers * k_heads, r));
    fill_cache(c, n);
    return c;
}

// One new token's attention over every layer of the cache, single thread.
void run_decode_attention(benchmark::State& st, int n_layers, int k_heads, int k_group) {
    const int r = (int)st.range(0), bits = (int)st.range(1);
    const int64_t n = st.range(2);
    const kv_cache c = make_cache(n_layers, k_heads, r, bits, n);
    std::mt19937 g(2);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)k_group * r), m(k_group), l(k_group), acc((size_t)k_group * r), out(acc.size());
    for (auto& x : q) x = N(g);
    std::vector<float> scratch(kernel_attention_scratch(k_group, n, r, r, bits == 5 ? c.params().gear_rank : 0));
    const int32_t qpos = (int32_t)n;
    for (auto _ : st) {
        for (int li = 0; li < n_layers; li++)
            for (int h = 0; h < k_heads; h++) {
                const attn_kv_view kv = c.view(li, h);
                attn_q_view qv{q.data(), 0, r, k_group, 1, &qpos, 0.125f};
                attn_partial part{m.data(), l.data(), acc.data()};
                kernel_attention_range(kv, 0, kv.n_slots, qv, part, scratch.data());
                kernel_attention_merge(&part, 1, 1, k_group, r, out.data(), 0, r);
            }
        benchmark::DoNotOptimize(out.data());
    }
    st.SetItemsProcessed(st.iterations() * n * k_heads * n_layers);
    st.counters["kv_bytes_per_token"] = c.bytes_per_token_exact() / (k_heads * n_layers);
}

// One layer: its cache (a few MB at 8K) stays in L3 between iterations.
void BM_decode_attention(benchmark::State& st) { run_decode_attention(st, 1, 3, 3); }

// The default model's 30 layers: 60 MB (4-bit) to 180 MB (f16) at 8K, read
// from DRAM as in a real decode step. Time is per step, not per layer.
void BM_decode_attention_30_layers(benchmark::State& st) { run_decode_attention(st, 30, 3, 3); }

// One layer of 2 KV heads with G = range(3) query heads each.
void BM_decode_attention_gqa(benchmark::State& st) { run_decode_attention(st, 1, 2, (int)st.range(3)); }

// A whole model's decode attention (n_layers layers of 2 KV heads, G query
// heads each) on a pool of `threads` threads, split as the CPU backend splits
// a one-token step (engine/backend_cpu_attn.cpp): each head's slots in nc =
// ceil(2 threads / 2 heads) ranges, 2 nc tasks handed out dynamically, the
// partials merged per head after the loop. Args: rank, bits, context, G,
// threads, layers. Real time: what a step waits for.
void BM_decode_attention_threads(benchmark::State& st) {
    const int r = (int)st.range(0), bits = (int)st.range(1), G = (int)st.range(3), nt = (int)st.range(4);
    const int n_layers = (int)st.range(5), KV = 2;
    const bool cold = st.range(6) != 0;
    const int64_t n = st.range(2);
    const kv_cache c = make_cache(n_layers, KV, r, bits, n);
    const int64_t nc = (2 * nt + KV - 1) / KV;
    if (nc > 64) {  // the merge's partials below
        st.SkipWithError("at most 64 threads");
        return;
    }
    std::vector<uint64_t> flush(cold ? (size_t)640 << 17 : 0, 1);  // 640 MiB
    std::mt19937 g(2);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)KV * G * r), out(q.size());
    for (auto& x : q) x = N(g);
    // per task: m [G], l [G], acc [G r]
    const int64_t per_task = (int64_t)G * (2 + r);
    std::vector<float> part((size_t)(KV * nc * per_task));
    const int64_t stride = kernel_attention_scratch(G, n, r, r, bits == 5 ? c.params().gear_rank : 0);
    std::vector<float> scratch((size_t)(stride * nt));
    const int32_t qpos = (int32_t)n;
    thread_pool pool(nt);
    int li = 0;  // the layer the tasks below read
    auto tasks = [&](int64_t b, int64_t e, int ith) {
        for (int64_t t = b; t < e; t++) {
            const int h = (int)(t / nc);
            const int64_t ci = t % nc;
            const attn_kv_view kv = c.view(li, h);
            const int64_t s0 = kv.n_slots * ci / nc, s1 = kv.n_slots * (ci + 1) / nc;
            float* pb = part.data() + t * per_task;
            attn_q_view qv{q.data() + (size_t)h * G * r, 0, r, G, 1, &qpos, 0.125f};
            attn_partial p{pb, pb + G, pb + 2 * G};
            kernel_attention_range(kv, s0, s1, qv, p, scratch.data() + ith * stride);
        }
    };
    for (auto _ : st) {
        if (cold) {
            st.PauseTiming();
            uint64_t sum = 0;
            for (size_t i = 0; i < flush.size(); i += 8) sum += flush[i];  // a line at a time
            benchmark::DoNotOptimize(sum);
            st.ResumeTiming();
        }
        for (li = 0; li < n_layers; li++) {
            // one reference captured: the std::function allocates nothing a layer (as the backend's calls)
            pool.parallel_for(KV * nc, 1, [&tasks](int64_t b, int64_t e, int ith) { tasks(b, e, ith); });
            for (int h = 0; h < KV; h++) {
                attn_partial parts[64];
                for (int64_t ci = 0; ci < nc; ci++) {
                    float* pb = part.data() + (h * nc + ci) * per_task;
                    parts[ci] = attn_partial{pb, pb + G, pb + 2 * G};
                }
                kernel_attention_merge(parts, (int)nc, 1, G, r, out.data() + (size_t)h * G * r, 0, r);
            }
        }
        benchmark::DoNotOptimize(out.data());
    }
    st.SetItemsProcessed(st.iterations() * n * KV * n_layers);
    // seconds a layer (a rate over real time, inverted)
    st.counters["s_per_layer"] = benchmark::Counter((double)st.iterations() * n_layers,
                                                    benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

// Decode-time selection over one layer of 2 KV heads of 128 channels, G 6
// (Qwen2.5-Coder-1.5B). Args: bits (4, 2), context, budget. Choosing the
// groups (engine/kv_select.h: every group's estimate, then the best budget's
// worth), and with `attend` the attention too: one partial over the chosen
// runs and the window (kernel_attention_runs, as engine/backend_cpu_attn.cpp
// calls it on one thread), merged.
void run_select(benchmark::State& st, bool attend) {
    const int r = 128, G = 6, bits = (int)st.range(0);
    const int64_t n = st.range(1), select = st.range(2);
    const kv_cache c = make_cache(1, 2, r, bits, n);
    std::mt19937 g(2);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)G * r), m(G), l(G), acc((size_t)G * r), out(acc.size());
    for (auto& x : q) x = N(g);
    const attn_kv_view kv0 = c.view(0, 0);
    std::vector<float> fs(kv_select_float_scratch(kv0, G));
    std::vector<float> scratch(attend ? kernel_attention_scratch(G, n, r, r, 0) : 0);
    std::vector<int64_t> is(kv_select_index_scratch(kv0)), runs(2 * kv_select_max_runs(kv0, select));
    const int32_t qpos = (int32_t)n;
    int64_t slots = 0, n_runs = 0;
    for (auto _ : st)
        for (int h = 0; h < 2; h++) {
            const attn_kv_view kv = c.view(0, h);
            const attn_q_view qv{q.data(), 0, r, G, 1, &qpos, 0.125f};
            n_runs = kv_select_runs(kv, qv, select, fs.data(), is.data(), runs.data(), &slots);
            benchmark::DoNotOptimize(runs.data());
            if (!attend) continue;
            const attn_partial p{m.data(), l.data(), acc.data()};
            kernel_attention_runs(kv, runs.data(), n_runs, qv, p, scratch.data());
            kernel_attention_merge(&p, 1, 1, G, r, out.data(), 0, r);
            benchmark::DoNotOptimize(out.data());
        }
    st.SetItemsProcessed(st.iterations() * n * 2);
    st.counters["runs"] = (double)n_runs;
}

void BM_select_groups(benchmark::State& st) { run_select(st, false); }
// Compare with BM_decode_attention_gqa/128/<bits>/<context>/6, which attends
// to every slot.
void BM_select_attention(benchmark::State& st) { run_select(st, true); }

// A whole model's decode attention under a plan: every head with its own
// precisions and ranks, one thread.
void run_plan_attention(benchmark::State& st, const kv_plan& pl, int64_t n, int k_group, int64_t select) {
    kv_cache_params p;
    p.bits = pl.bits;
    p.bits_k = pl.bits_k;
    p.bits_v = pl.bits_v;
    p.tails_k = pl.tails_k;
    p.zeros_k = pl.zeros_k;
    p.mids_k = pl.mids_k;
    const size_t nh = (size_t)pl.n_layer * pl.n_kv;
    // vector-coded values: random books of calibrate's size (the kernel's time does not depend on them),
    // with int8 copies of 8 x 256 books where a model has them (kernel_attention_vq_int8_faster);
    // ZACK_BENCH_VQ_INT8=0 or 1 overrides that
    const char* ie = std::getenv("ZACK_BENCH_VQ_INT8");
    std::vector<float> book[KV_VQ_CODES], book8_scale[KV_VQ_CODES];
    std::vector<int8_t> book8[KV_VQ_CODES];
    kv_vq_books books[KV_VQ_CODES];
    for (int code = 0; code < KV_VQ_CODES; code++) {
        if (!kv_cache_vq(p, code)) continue;
        book[code].resize((size_t)pl.head_dim * k_vq_size[code]);
        std::mt19937 gb(3);
        std::normal_distribution<float> Nb(0, 1);
        for (auto& x : book[code]) x = Nb(gb);
        // int8 copies as model_load_zack builds them (only of 8 x 256 books: no kernel reads others)
        const bool int8 = kernel_attention_vq_int8_shape(k_vq_dim[code], k_vq_size[code]) &&
                          (ie ? std::atoi(ie) != 0 : kernel_attention_vq_int8_faster());
        if (int8) {
            book8[code].resize(book[code].size());
            book8_scale[code].resize((size_t)pl.head_dim / k_vq_dim[code]);
            kvq_vq_int8_book(k_vq_dim[code], k_vq_size[code], pl.head_dim, book[code].data(), book8[code].data(),
                             book8_scale[code].data());
        }
        books[code].c = k_vq_dim[code], books[code].K = k_vq_size[code], books[code].d = pl.head_dim;
        books[code].heads.assign(nh, kv_vq_book{book[code].data(), book[code].data(),
                                                int8 ? book8[code].data() : nullptr,
                                                int8 ? book8_scale[code].data() : nullptr});
        p.vq[code] = &books[code];
    }
    const std::vector<int> full(nh, pl.head_dim);
    kv_cache c(pl.n_layer, pl.n_kv, n, p, pl.ranks_k.empty() ? full : pl.ranks_k,
               pl.ranks_v.empty() ? full : pl.ranks_v);
    fill_cache(c, n);
    const int d = pl.head_dim;
    std::mt19937 g(2);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> q((size_t)k_group * d), m(k_group), l(k_group), acc((size_t)k_group * d), out(acc.size());
    for (auto& x : q) x = N(g);
    std::vector<float> scratch(kernel_attention_scratch(k_group, n, d, d, 0));
    const int32_t qpos = (int32_t)n;
    // with a budget, the heads selection applies to choose their runs first, as
    // engine/backend_cpu_attn.cpp does for a one-token step
    int64_t nf = 0, ni = 0, nruns = 0;
    for (int li = 0; li < pl.n_layer; li++)
        for (int h = 0; h < pl.n_kv; h++)
            if (kv_select_applies(c.view(li, h), select)) {
                const attn_kv_view kv = c.view(li, h);
                nf = std::max(nf, kv_select_float_scratch(kv, k_group));
                ni = std::max(ni, kv_select_index_scratch(kv));
                nruns = std::max(nruns, kv_select_max_runs(kv, select));
            }
    std::vector<float> fs(nf);
    std::vector<int64_t> is(ni), runs(2 * nruns);
    int64_t n_selected = 0;
    for (auto _ : st) {
        n_selected = 0;
        for (int li = 0; li < pl.n_layer; li++)
            for (int h = 0; h < pl.n_kv; h++) {
                const attn_kv_view kv = c.view(li, h);
                attn_q_view qv{q.data(), 0, kv.r_k, k_group, 1, &qpos, 0.125f};
                attn_partial part{m.data(), l.data(), acc.data()};
                if (kv_select_applies(kv, select)) {
                    int64_t slots = 0;
                    const int64_t nr = kv_select_runs(kv, qv, select, fs.data(), is.data(), runs.data(), &slots);
                    kernel_attention_runs(kv, runs.data(), nr, qv, part, scratch.data());
                    n_selected++;
                } else {
                    kernel_attention_range(kv, 0, kv.n_slots, qv, part, scratch.data());
                }
                kernel_attention_merge(&part, 1, 1, k_group, kv.r_v, out.data(), 0, d);
            }
        benchmark::DoNotOptimize(out.data());
    }
    st.SetItemsProcessed(st.iterations() * n * (int64_t)nh);
    st.counters["heads_selected"] = (double)n_selected;
    st.counters["kv_fraction"] = c.bytes_per_token_exact() / c.bytes_per_token_f16(d);
    st.counters["us_per_layer"] = benchmark::Counter((double)pl.n_layer * 1e-6,
                                                     benchmark::Counter::kIsIterationInvariantRate |
                                                         benchmark::Counter::kInvert);
}

// One benchmark per plan file in ZACK_BENCH_PLANS, at 8K and 32K slots.
const bool k_plans_registered = [] {
    const char* env = std::getenv("ZACK_BENCH_PLANS");
    if (!env) return false;
    const char* ge = std::getenv("ZACK_BENCH_GROUP");
    const int k_group = ge ? std::atoi(ge) : 6;
    const char* se = std::getenv("ZACK_BENCH_SELECT");
    const int64_t select = se ? std::atoll(se) : 0;
    std::stringstream ss(env);
    std::string path;
    while (std::getline(ss, path, ',')) {
        std::ifstream in(path);
        std::stringstream body;
        body << in.rdbuf();
        const kv_plan pl = kv_plan::from_json(nlohmann::json::parse(body.str()), path);
        const std::string name = path.substr(path.find_last_of('/') + 1);
        for (int64_t n : {8192, 32768})
            for (int64_t sel : {(int64_t)0, select}) {
                std::string bm = "BM_plan_attention/" + name + "/" + std::to_string(n);
                if (sel > 0) bm += "/select" + std::to_string(sel);
                benchmark::RegisterBenchmark(bm.c_str(), [pl, n, k_group, sel](benchmark::State& st) {
                    run_plan_attention(st, pl, n, k_group, sel);
                })->Unit(benchmark::kMillisecond);
                if (select == 0) break;
            }
    }
    return true;
}();

void BM_key_grids(benchmark::State& st) {
    const int bits = (int)st.range(0), n = 32, r = 128;
    const bool per_channel = st.range(1) != 0;
    std::mt19937 g(3);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> X((size_t)n * r), lo(r), hi(r);
    for (float& x : X) x = N(g);
    for (auto _ : st) {
        if (per_channel)
            for (int c = 0; c < r; c++) kvq_key_grid_search(bits, X.data() + c, n, r, nullptr, 0, &lo[c], &hi[c]);
        else
            kvq_key_grid_search_rows(bits, X.data(), n, r, r, nullptr, lo.data(), hi.data());
        benchmark::DoNotOptimize(lo.data());
    }
}

void args(benchmark::internal::Benchmark* b) {
    for (int64_t ctx : {2048, 8192})
        for (int r : {64, 44, 32, 20, 16})  // 44, 20: ZACK ranks with a partial value block
            for (int bits : {16, 8, 4, 5}) b->Args({r, bits, ctx});
}

}  // namespace

BENCHMARK(BM_decode_attention)->Apply(args)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_attention_30_layers)
    ->Args({64, 16, 8192})
    ->Args({64, 4, 8192})
    ->Args({32, 4, 8192})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_decode_attention_gqa)
    ->ArgsProduct({{128}, {16, 8, 4, 5, 2}, {8192}, {1, 2, 3, 4, 6, 7}})
    ->ArgsProduct({{64}, {16, 4, 2}, {8192}, {7}})
    ->Unit(benchmark::kMicrosecond);
// the 1.5B's 28 layers at 8K, one and two threads
BENCHMARK(BM_decode_attention_threads)
    ->ArgsProduct({{128}, {16, 4}, {8192}, {6}, {1, 2}, {28}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_select_groups)->ArgsProduct({{4, 2}, {8192, 32768}, {2048}})->Unit(benchmark::kMicrosecond);
// 16 and 8: pages chosen by their exact mass (every key scored)
BENCHMARK(BM_select_attention)->ArgsProduct({{16, 8, 4, 2}, {8192, 32768}, {2048}})->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_key_grids)->ArgsProduct({{4, 2}, {0, 1}})->Unit(benchmark::kMicrosecond);
