#include "calib/fold.h"

#include <algorithm>

#include "ggml-like/error.h"

namespace zk {

void fold_wv(float* wv, float* bv, const double* rv, int n_kv, int d, int64_t n_embd) {
    std::vector<double> acc((size_t)d * n_embd);
    for (int g = 0; g < n_kv; g++) {
        const double* R = rv + (size_t)g * d * d;
        float* W = wv + (size_t)g * d * n_embd;  // [d x n_embd]
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int i = 0; i < d; i++) {
            const float* wi = W + (size_t)i * n_embd;
            for (int j = 0; j < d; j++) {
                const double r = R[(size_t)i * d + j];
                double* aj = acc.data() + (size_t)j * n_embd;
                for (int64_t e = 0; e < n_embd; e++) aj[e] += r * wi[e];
            }
        }
        for (size_t x = 0; x < acc.size(); x++) W[x] = (float)acc[x];
        if (bv) {
            float* b = bv + (size_t)g * d;
            std::vector<double> nb(d, 0.0);
            for (int i = 0; i < d; i++)
                for (int j = 0; j < d; j++) nb[j] += R[(size_t)i * d + j] * b[i];
            for (int j = 0; j < d; j++) b[j] = (float)nb[j];
        }
    }
}

void fold_wo(float* wo, const double* rv, int n_head, int n_kv, int d, int64_t n_embd) {
    ZK_ASSERT(n_kv > 0 && n_head % n_kv == 0);
    const int G = n_head / n_kv;
    const int64_t HD = (int64_t)n_head * d;
    std::vector<double> nb(d);
    for (int64_t e = 0; e < n_embd; e++) {
        for (int i = 0; i < n_head; i++) {
            const double* R = rv + (size_t)(i / G) * d * d;
            float* w = wo + e * HD + (int64_t)i * d;  // one row's block of head i [d]
            std::fill(nb.begin(), nb.end(), 0.0);
            for (int a = 0; a < d; a++) {
                const double wa = w[a];
                const double* Ra = R + (size_t)a * d;
                for (int j = 0; j < d; j++) nb[j] += wa * Ra[j];
            }
            for (int j = 0; j < d; j++) w[j] = (float)nb[j];
        }
    }
}

dtype fold_output_type(dtype src, int64_t n_cols) {
    switch (src) {
        case dtype::F32: case dtype::F16: case dtype::BF16:
            return src;
        case dtype::Q8_0:
            return src;
        case dtype::Q4_0: case dtype::Q4_1: case dtype::Q5_0: case dtype::Q5_1: case dtype::IQ4_NL:
        case dtype::Q2_K: case dtype::Q3_K: case dtype::Q4_K: case dtype::Q5_K: case dtype::Q6_K:
            return n_cols % dtype_get_traits(dtype::Q8_0).block_size == 0 ? dtype::Q8_0 : dtype::F16;
        default:
            break;
    }
    ZK_THROW("cannot fold a weight of type %s (weight types: %s)", dtype_name(src), dtype_weight_names().c_str());
}

std::vector<float> fold_dequantize(const gguf_tensor& t) {
    if (t.shape.empty() || t.shape.size() > 2)
        ZK_THROW("tensor '%s': expected a vector or matrix, got %zu dimensions", t.name.c_str(), t.shape.size());
    const int64_t cols = t.shape[0], rows = t.n_rows();
    const size_t rb = dtype_row_size(t.type, cols);
    std::vector<float> out((size_t)rows * cols);
    for (int64_t r = 0; r < rows; r++) dtype_dequantize_row(t.type, t.data + rb * r, out.data() + r * cols, cols);
    return out;
}

std::vector<uint8_t> fold_quantize(const float* x, int64_t n_rows, int64_t n_cols, dtype type) {
    const size_t rb = dtype_row_size(type, n_cols);
    std::vector<uint8_t> out(rb * n_rows);
    for (int64_t r = 0; r < n_rows; r++) dtype_quantize_row(type, x + r * n_cols, out.data() + rb * r, n_cols);
    return out;
}

}  // namespace zk
