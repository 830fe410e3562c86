// kernel_matmul at the default model's shapes (SmolLM2-135M: dim 576, FFN 1536,
// KV dim 192, vocab 49152; Q4_1 layers, Q8_0 output), every weight type at its
// FFN down shape, and Qwen2.5-Coder 0.5B's shapes and types; decode (n_tok 1)
// and a prefill slice (n_tok 64), 1 and 2 threads. Counters: weight bytes/s
// (decode is bound by it), rows/s and int8 MAC/s.
//
//   bench_matmul --benchmark_filter='Layer'   one decoder layer's 7 matmuls
//   bench_matmul --benchmark_filter='Model'   all of a decode step's matmuls, from DRAM
//   bench_matmul --benchmark_filter='Qwen15'  Qwen2.5-Coder-1.5B Q4_K_M shapes (Q4_K, Q6_K),
//                                             GGUF layout (packed:0) and packed (packed:1)
#include <benchmark/benchmark.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ggml-like/quant_pack.h"
#include "ggml-like/quant_ref.h"
#include "kernels/matmul.h"
#include "tests/quant_random.h"

using namespace zk;

namespace {

struct shape {
    const char* name;
    int64_t rows, cols;
};
const shape k_shapes[] = {
    {"attn_q_576x576", 576, 576},   {"attn_kv_192x576", 192, 576}, {"ffn_up_1536x576", 1536, 576},
    {"ffn_down_576x1536", 576, 1536}, {"output_49152x576", 49152, 576},
};

// Qwen2.5-Coder 0.5B (dim 896, FFN 4864, KV dim 128) with its file's types:
// Q5_0 for most matrices, Q8_0 for attn_v, Q4_K / Q6_K for ffn_down.
struct typed_shape {
    dtype t;
    shape s;
};
const typed_shape k_qwen05[] = {
    {dtype::Q5_0, {"q05_attn_q_896x896", 896, 896}},       {dtype::Q8_0, {"q05_attn_v_128x896", 128, 896}},
    {dtype::Q5_0, {"q05_ffn_up_4864x896", 4864, 896}},     {dtype::Q4_K, {"q05_ffn_down_896x4864", 896, 4864}},
    {dtype::Q6_K, {"q05_ffn_down_896x4864", 896, 4864}},
};

// One decoder layer's 7 matmuls, in the engine's order.
const shape k_layer[] = {{"q", 576, 576},    {"k", 192, 576},    {"v", 192, 576},   {"o", 576, 576},
                         {"gate", 1536, 576}, {"up", 1536, 576}, {"down", 576, 1536}};

std::vector<uint8_t> make_weights(dtype t, int64_t rows, int64_t cols) { return quant_random_rows(t, rows, cols, 1); }

std::vector<float> make_acts(int64_t n) {
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x((size_t)n);
    for (auto& v : x) v = u(rng);
    return x;
}

void bm_matmul(benchmark::State& st, dtype t, shape s, int64_t n_tok, int n_threads) {
    const auto wdata = make_weights(t, s.rows, s.cols);
    const auto x = make_acts(n_tok * s.cols);
    std::vector<float> y((size_t)(n_tok * s.rows));
    thread_pool pool(n_threads);
    matmul_scratch scratch;
    const weight_view w{t, s.rows, s.cols, wdata.data()};
    for (auto _ : st) {
        kernel_matmul(w, x.data(), n_tok, y.data(), pool, scratch);
        benchmark::DoNotOptimize(y.data());
    }
    st.SetBytesProcessed((int64_t)st.iterations() * (int64_t)wdata.size());
    st.counters["rows/s"] = benchmark::Counter((double)s.rows * st.iterations(), benchmark::Counter::kIsRate);
    st.counters["MAC/s"] =
        benchmark::Counter((double)s.rows * s.cols * n_tok * st.iterations(), benchmark::Counter::kIsRate);
}

// One decoder layer of the default model at decode: q, k, v, o, gate, up, down.
void bm_layer(benchmark::State& st, int64_t n_tok, int n_threads) {
    const auto& ls = k_layer;
    std::vector<std::vector<uint8_t>> ws;
    size_t bytes = 0;
    for (const auto& s : ls) {
        ws.push_back(make_weights(dtype::Q4_1, s.rows, s.cols));
        bytes += ws.back().size();
    }
    const auto x = make_acts(n_tok * 1536);
    std::vector<float> y((size_t)(n_tok * 1536));
    thread_pool pool(n_threads);
    matmul_scratch scratch;
    for (auto _ : st) {
        for (size_t i = 0; i < ws.size(); i++)
            kernel_matmul({dtype::Q4_1, ls[i].rows, ls[i].cols, ws[i].data()}, x.data(), n_tok, y.data(), pool,
                          scratch);
        benchmark::DoNotOptimize(y.data());
    }
    st.SetBytesProcessed((int64_t)st.iterations() * (int64_t)bytes);
    st.counters["tok/s"] = benchmark::Counter((double)n_tok * st.iterations(), benchmark::Counter::kIsRate);
}

// Every matmul of one decode step of the default model: 30 layers, each with
// its own copy of the weights (66 MB of Q4_1), then the 49152 x 576 Q8_0 output
// (28 MB). Together they are three times the L3, so the weights stream from
// DRAM as in a real decode step; bm_layer's 2 MB stay in cache. Q/K/V and
// gate/up go through kernel_matmul_multi as in the engine.
void bm_model(benchmark::State& st, int n_threads) {
    constexpr int n_layers = 30;
    const auto& ls = k_layer;
    std::vector<std::vector<uint8_t>> one;
    for (const auto& s : ls) one.push_back(make_weights(dtype::Q4_1, s.rows, s.cols));
    std::vector<std::vector<std::vector<uint8_t>>> layers(n_layers, one);  // distinct copies
    const auto out = make_weights(dtype::Q8_0, 49152, 576);
    size_t bytes = out.size();
    for (const auto& w : one) bytes += w.size() * n_layers;
    const auto x = make_acts(1536);
    std::vector<float> y0(49152), y1(1536), y2(1536);
    thread_pool pool(n_threads);
    matmul_scratch scratch;
    for (auto _ : st) {
        for (auto& l : layers) {
            weight_view qkv[3];
            float* qkv_y[3] = {y0.data(), y1.data(), y2.data()};
            for (int i = 0; i < 3; i++) qkv[i] = {dtype::Q4_1, ls[i].rows, ls[i].cols, l[i].data()};
            kernel_matmul_multi(qkv, qkv_y, 3, x.data(), 1, pool, scratch);
            kernel_matmul({dtype::Q4_1, 576, 576, l[3].data()}, x.data(), 1, y0.data(), pool, scratch);
            weight_view gu[2] = {{dtype::Q4_1, 1536, 576, l[4].data()}, {dtype::Q4_1, 1536, 576, l[5].data()}};
            float* gu_y[2] = {y1.data(), y2.data()};
            kernel_matmul_multi(gu, gu_y, 2, x.data(), 1, pool, scratch);
            kernel_matmul({dtype::Q4_1, 576, 1536, l[6].data()}, x.data(), 1, y0.data(), pool, scratch);
        }
        kernel_matmul({dtype::Q8_0, 49152, 576, out.data()}, x.data(), 1, y0.data(), pool, scratch);
        benchmark::DoNotOptimize(y0.data());
    }
    st.SetBytesProcessed((int64_t)st.iterations() * (int64_t)bytes);
    st.counters["tok/s"] = benchmark::Counter((double)st.iterations(), benchmark::Counter::kIsRate);
}

// ---------------------------------------------------------------- Qwen2.5-Coder-1.5B (Q4_K_M)
// dim 1536, FFN 8960, 12/2 heads of 128; Q4_K everywhere except V and (in half
// of the layers) the FFN down projection, which are Q6_K, as the output.
struct qshape {
    const char* name;
    dtype t;
    int64_t rows, cols;
};
const qshape k_qwen15[] = {
    {"q_1536x1536", dtype::Q4_K, 1536, 1536},    {"k_256x1536", dtype::Q4_K, 256, 1536},
    {"v_256x1536", dtype::Q6_K, 256, 1536},      {"gate_8960x1536", dtype::Q4_K, 8960, 1536},
    {"down_1536x8960", dtype::Q4_K, 1536, 8960}, {"down_1536x8960", dtype::Q6_K, 1536, 8960},
    // a .zack's folded W_o (Q8_0), and the 0.5B's FFN up projection (Q5_0)
    {"o_1536x1536", dtype::Q8_0, 1536, 1536},    {"q05_up_4864x896", dtype::Q5_0, 4864, 896},
};

struct free_deleter {
    void operator()(void* p) const { std::free(p); }
};

// A weight as the engine holds it: GGUF bytes, and a packed copy when asked for.
struct bench_weight {
    std::vector<uint8_t> gguf;
    std::unique_ptr<void, free_deleter> packed;
    weight_view view;
    bench_weight(dtype t, int64_t rows, int64_t cols, bool pack) : gguf(make_weights(t, rows, cols)) {
        view = weight_view{t, rows, cols, gguf.data()};
        if (pack) {
            packed.reset(std::aligned_alloc(64, (quant_pack_size(t, rows, cols) + 63) / 64 * 64));
            thread_pool pool(1);
            view = kernel_matmul_pack(view, packed.get(), pool);
        }
    }
};

void bm_qwen15(benchmark::State& st, qshape s, int64_t n_tok, bool pack, int n_threads) {
    const bench_weight w(s.t, s.rows, s.cols, pack);
    const auto x = make_acts(n_tok * s.cols);
    std::vector<float> y((size_t)(n_tok * s.rows));
    thread_pool pool(n_threads);
    matmul_scratch scratch;
    for (auto _ : st) {
        kernel_matmul(w.view, x.data(), n_tok, y.data(), pool, scratch);
        benchmark::DoNotOptimize(y.data());
    }
    st.SetBytesProcessed((int64_t)st.iterations() * (int64_t)w.gguf.size());
    st.counters["MAC/s"] =
        benchmark::Counter((double)s.rows * s.cols * n_tok * st.iterations(), benchmark::Counter::kIsRate);
}

// One decoder layer of the 1.5B (the Q6_K-down kind) as the engine runs it:
// Q/K/V and gate/up as multi-matmuls.
void bm_qwen15_layer(benchmark::State& st, int64_t n_tok, bool pack, int n_threads) {
    const int64_t E = 1536, F = 8960;
    const bench_weight q(dtype::Q4_K, E, E, pack), k(dtype::Q4_K, 256, E, pack), v(dtype::Q6_K, 256, E, pack),
        o(dtype::Q4_K, E, E, pack), gate(dtype::Q4_K, F, E, pack), up(dtype::Q4_K, F, E, pack),
        down(dtype::Q6_K, E, F, pack);
    const auto x = make_acts(n_tok * F);
    std::vector<float> y0((size_t)(n_tok * F)), y1((size_t)(n_tok * F)), y2((size_t)(n_tok * 256));
    thread_pool pool(n_threads);
    matmul_scratch scratch;
    for (auto _ : st) {
        const weight_view qkv[3] = {q.view, k.view, v.view};
        float* qkv_y[3] = {y0.data(), y1.data(), y2.data()};
        kernel_matmul_multi(qkv, qkv_y, 3, x.data(), n_tok, pool, scratch);
        kernel_matmul(o.view, x.data(), n_tok, y0.data(), pool, scratch);
        const weight_view gu[2] = {gate.view, up.view};
        float* gu_y[2] = {y0.data(), y1.data()};
        kernel_matmul_multi(gu, gu_y, 2, x.data(), n_tok, pool, scratch);
        kernel_matmul(down.view, x.data(), n_tok, y0.data(), pool, scratch);
        benchmark::DoNotOptimize(y0.data());
    }
    st.counters["tok/s"] = benchmark::Counter((double)n_tok * st.iterations(), benchmark::Counter::kIsRate);
}

// Every matmul of one decode step of the 1.5B, from DRAM: 28 layers (Q/K/V and
// gate/up as multi-matmuls; V and half the down projections Q6_K) and the
// 151936 x 1536 Q6_K output, 0.92 GB of weights, as the engine streams them.
void bm_qwen15_decode(benchmark::State& st, bool pack, int n_threads) {
    const int64_t E = 1536, F = 8960;
    struct layer {
        std::unique_ptr<bench_weight> q, k, v, o, gate, up, down;
    };
    std::vector<layer> ls(28);
    size_t bytes = 0;
    for (size_t i = 0; i < ls.size(); i++) {
        layer& l = ls[i];
        l.q = std::make_unique<bench_weight>(dtype::Q4_K, E, E, pack);
        l.k = std::make_unique<bench_weight>(dtype::Q4_K, 256, E, pack);
        l.v = std::make_unique<bench_weight>(dtype::Q6_K, 256, E, pack);
        l.o = std::make_unique<bench_weight>(dtype::Q4_K, E, E, pack);
        l.gate = std::make_unique<bench_weight>(dtype::Q4_K, F, E, pack);
        l.up = std::make_unique<bench_weight>(dtype::Q4_K, F, E, pack);
        l.down = std::make_unique<bench_weight>(i % 2 ? dtype::Q4_K : dtype::Q6_K, E, F, pack);
        for (const bench_weight* w : {l.q.get(), l.k.get(), l.v.get(), l.o.get(), l.gate.get(), l.up.get(), l.down.get()})
            bytes += w->gguf.size();
    }
    const bench_weight out(dtype::Q6_K, 151936, E, pack);
    bytes += out.gguf.size();
    const auto x = make_acts(F);
    std::vector<float> y0(151936), y1(F), y2(F);
    thread_pool pool(n_threads);
    matmul_scratch scratch;
    for (auto _ : st) {
        for (const layer& l : ls) {
            const weight_view qkv[3] = {l.q->view, l.k->view, l.v->view};
            float* qkv_y[3] = {y0.data(), y1.data(), y2.data()};
            kernel_matmul_multi(qkv, qkv_y, 3, x.data(), 1, pool, scratch);
            kernel_matmul(l.o->view, x.data(), 1, y0.data(), pool, scratch);
            const weight_view gu[2] = {l.gate->view, l.up->view};
            float* gu_y[2] = {y1.data(), y2.data()};
            kernel_matmul_multi(gu, gu_y, 2, x.data(), 1, pool, scratch);
            kernel_matmul(l.down->view, x.data(), 1, y0.data(), pool, scratch);
        }
        kernel_matmul(out.view, x.data(), 1, y0.data(), pool, scratch);
        benchmark::DoNotOptimize(y0.data());
    }
    st.SetBytesProcessed((int64_t)st.iterations() * (int64_t)bytes);
    st.counters["tok/s"] = benchmark::Counter((double)st.iterations(), benchmark::Counter::kIsRate);
}

// Read bandwidth of this machine with n threads: each sums its share of a
// 1 GiB buffer (the bound for decode, which reads every weight once per token).
void bm_read_bandwidth(benchmark::State& st, int n_threads) {
    const size_t n = (size_t)1 << 28;  // floats: 1 GiB
    std::unique_ptr<float, free_deleter> buf((float*)std::aligned_alloc(64, n * sizeof(float)));
    for (size_t i = 0; i < n; i++) buf.get()[i] = 1.0f;
    thread_pool pool(n_threads);
    std::vector<float> part((size_t)n_threads * 16);
    for (auto _ : st) {
        const float* p = buf.get();
        pool.run([&](int ith, int nth) {
            const size_t b = n * ith / nth, e = n * (ith + 1) / nth;
#if defined(__AVX2__)
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;  // 4 chains of 32-byte loads
            for (size_t i = b; i + 32 <= e; i += 32) {
                a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
                a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
                a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
                a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
            }
            alignas(32) float t[8];
            _mm256_store_ps(t, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
            part[(size_t)ith * 16] = t[0] + t[7];
#else
            float s0 = 0;
            for (size_t i = b; i < e; i++) s0 += p[i];
            part[(size_t)ith * 16] = s0;
#endif
        });
        benchmark::DoNotOptimize(part.data());
    }
    st.SetBytesProcessed((int64_t)st.iterations() * (int64_t)(n * sizeof(float)));
}

int register_all() {
    for (int th : {1, 2})
        benchmark::RegisterBenchmark(("ReadBandwidth/1GiB/threads:" + std::to_string(th)).c_str(), bm_read_bandwidth, th)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    for (int th : {1, 2})
        for (bool pack : {false, true})
            benchmark::RegisterBenchmark(("Qwen15/decode/packed:" + std::to_string(pack) + "/threads:" + std::to_string(th)).c_str(),
                                         bm_qwen15_decode, pack, th)
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
    for (int th : {1, 2})
        for (bool pack : {false, true}) {
            if (pack && !quant_pack_supported(dtype::Q4_K, 1536)) continue;
            const std::string suffix = "/packed:" + std::to_string(pack) + "/threads:" + std::to_string(th);
            for (int64_t n_tok : {1, 64, 512})
                benchmark::RegisterBenchmark(("Qwen15/layer/tok:" + std::to_string(n_tok) + suffix).c_str(),
                                             bm_qwen15_layer, n_tok, pack, th)
                    ->UseRealTime()
                    ->Unit(benchmark::kMillisecond);
            for (const qshape& s : k_qwen15)
                for (int64_t n_tok : {1, 4, 16, 64, 512}) {
                    if (pack && !quant_pack_supported(s.t, s.cols)) continue;
                    benchmark::RegisterBenchmark((std::string("Qwen15/") + dtype_name(s.t) + "/" + s.name + "/tok:" +
                                                  std::to_string(n_tok) + suffix)
                                                     .c_str(),
                                                 bm_qwen15, s, n_tok, pack, th)
                        ->UseRealTime()
                        ->Unit(benchmark::kMicrosecond);
                }
        }
    for (int th : {1, 2})
        benchmark::RegisterBenchmark(("Model/decode/threads:" + std::to_string(th)).c_str(), bm_model, th)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
    for (int64_t n_tok : {1, 64})
        for (int th : {1, 2}) {
            const std::string suffix = "/tok:" + std::to_string(n_tok) + "/threads:" + std::to_string(th);
            // The model's own combinations.
            for (const shape& s : k_shapes) {
                const dtype t = s.rows == 49152 ? dtype::Q8_0 : dtype::Q4_1;
                benchmark::RegisterBenchmark((std::string("Matmul/") + dtype_name(t) + "/" + s.name + suffix).c_str(),
                                             bm_matmul, t, s, n_tok, th)
                    ->UseRealTime()
                    ->Unit(benchmark::kMicrosecond);
            }
            // Every weight type at the FFN down shape (1536 columns: whole K-quant blocks).
            for (dtype t : quant_weight_types()) {
                if (t == dtype::Q4_1) continue;  // registered above as the model's own
                benchmark::RegisterBenchmark((std::string("Matmul/") + dtype_name(t) + "/" + k_shapes[3].name + suffix).c_str(),
                                             bm_matmul, t, k_shapes[3], n_tok, th)
                    ->UseRealTime()
                    ->Unit(benchmark::kMicrosecond);
            }
            for (const typed_shape& ts : k_qwen05)
                benchmark::RegisterBenchmark((std::string("Matmul/") + dtype_name(ts.t) + "/" + ts.s.name + suffix).c_str(),
                                             bm_matmul, ts.t, ts.s, n_tok, th)
                    ->UseRealTime()
                    ->Unit(benchmark::kMicrosecond);
            benchmark::RegisterBenchmark(("Layer/Q4_1" + suffix).c_str(), bm_layer, n_tok, th)
                ->UseRealTime()
                ->Unit(benchmark::kMicrosecond);
        }
    return 0;
}

const int registered = register_all();

}  // namespace
