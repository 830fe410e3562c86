// kernel_matmul at the default model's shapes (SmolLM2-135M: dim 576, FFN 1536,
// KV dim 192, vocab 49152; Q4_1 layers, Q8_0 output), every weight type at its
// FFN down shape, and Qwen2.5-Coder 0.5B's shapes and types; decode (n_tok 1)
// and a prefill slice (n_tok 64), 1 and 2 threads. Counters: weight bytes/s
// (decode is bound by it), rows/s and int8 MAC/s.
//
//   bench_matmul --benchmark_filter='Layer'   one decoder layer's 7 matmuls
//   bench_matmul --benchmark_filter='Model'   all of a decode step's matmuls, from DRAM
#include <benchmark/benchmark.h>

#include <random>
#include <string>
#include <vector>

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

int register_all() {
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
