// Random weight matrices of every weight type, for tests/ and bench/: quantized
// random floats where zack has a quantizer (F32, F16, BF16, Q4_0, Q4_1, Q8_0),
// otherwise random bytes with sane f16 scales written over the scale fields
// (every bit pattern of the quants and sub-block scales is a valid block).
#pragma once
#include <cstddef>
#include <cstdint>
#include <random>
#include <vector>

#include "ggml-like/quant_ref.h"

namespace zk {

// The f16 fields of a block of t that need sane values, and their ranges.
struct quant_scale_field {
    size_t offset;
    float lo, hi;
};

inline std::vector<quant_scale_field> quant_scale_fields(dtype t) {
    const float lo = 0.001f, hi = 0.01f;
    switch (t) {
        case dtype::Q5_0: return {{offsetof(block_q5_0, d), lo, hi}};
        case dtype::Q5_1: return {{offsetof(block_q5_1, d), lo, hi}, {offsetof(block_q5_1, m), -0.2f, 0.0f}};
        case dtype::IQ4_NL: return {{offsetof(block_iq4_nl, d), lo, hi}};
        case dtype::Q2_K: return {{offsetof(block_q2_K, d), lo, hi}, {offsetof(block_q2_K, dmin), lo, hi}};
        case dtype::Q3_K: return {{offsetof(block_q3_K, d), lo, hi}};
        case dtype::Q4_K: return {{offsetof(block_q4_K, d), lo, hi}, {offsetof(block_q4_K, dmin), lo, hi}};
        case dtype::Q5_K: return {{offsetof(block_q5_K, d), lo, hi}, {offsetof(block_q5_K, dmin), lo, hi}};
        case dtype::Q6_K: return {{offsetof(block_q6_K, d), lo, hi}};
        default: return {};
    }
}

// [n_rows x n_cols] of t, rows contiguous.
inline std::vector<uint8_t> quant_random_rows(dtype t, int64_t n_rows, int64_t n_cols, uint32_t seed) {
    const size_t row = dtype_row_size(t, n_cols);
    std::vector<uint8_t> w(row * (size_t)n_rows);
    std::mt19937 rng(seed);
    const auto fields = quant_scale_fields(t);
    if (!fields.empty()) {
        for (auto& b : w) b = (uint8_t)rng();
        const size_t bs = dtype_get_traits(t).type_size;
        for (size_t off = 0; off < w.size(); off += bs)
            for (const auto& f : fields) {
                const uint16_t h = fp32_to_fp16(std::uniform_real_distribution<float>(f.lo, f.hi)(rng));
                w[off + f.offset] = (uint8_t)h;
                w[off + f.offset + 1] = (uint8_t)(h >> 8);
            }
        return w;
    }
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> x((size_t)n_cols);
    for (int64_t r = 0; r < n_rows; r++) {
        for (auto& v : x) v = u(rng);
        dtype_quantize_row(t, x.data(), w.data() + row * (size_t)r, n_cols);
    }
    return w;
}

// Every type a weight matrix may have (from dtype.cpp's table), in id order.
inline const std::vector<dtype>& quant_weight_types() {
    static const std::vector<dtype> types = [] {
        std::vector<dtype> v;
        for (uint32_t id = 0; id < 256; id++)
            if (dtype_is_known(id) && dtype_is_weight((dtype)id)) v.push_back((dtype)id);
        return v;
    }();
    return types;
}

}  // namespace zk
