#include "engine/kv_vq.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"

namespace zk {

int kv_vq_books::bits() const {
    int b = 0;
    while ((1 << b) < K) b++;
    return b;
}

void kvq_vq_check(int c, int K, int d) {
    if (c < 1 || c > 16) ZK_THROW("value codes: %d channels a code; 1 to 16 are supported", c);
    if (K < 2 || K > KV_VQ_MAX_K || (K & (K - 1)))
        ZK_THROW("value codes: %d centroids; a power of two from 2 to %d is supported", K, KV_VQ_MAX_K);
    if (K > KV_VQ_CELLS_PER_CH * c)
        ZK_THROW("value codes: %d centroids of %d channels; at most %d per channel", K, c, KV_VQ_CELLS_PER_CH);
    if (d < c || d % c) ZK_THROW("value codes: the head dim %d is not a multiple of %d channels a code", d, c);
}

void kvq_vq_check_rank(const kv_vq_books& b, int r, const char* where) {
    if (r < b.c || r > b.d || r % b.c)
        ZK_THROW("%s: vector-coded values need a value rank that is a multiple of %d up to %d, got %d", where, b.c, b.d,
                 r);
}

void kvq_vq_decoding_book(int c, int K, int d, const float* enc, const float* gain, float* dec) {
    for (int q = 0; q < d / c; q++)
        for (int k = 0; k < K; k++)
            for (int j = 0; j < c; j++) {
                const size_t at = ((size_t)q * K + k) * c + j;
                dec[at] = enc[at] * gain[q * c + j];
            }
}

void kvq_vq_encode_row(const kv_vq_books& b, const kv_vq_book& h, const float* x, int r, uint8_t* codes,
                       uint16_t* scale) {
    const int c = b.c, K = b.K, bits = b.bits(), ng = r / c;
    double ss = 0;
    for (int i = 0; i < r; i++) ss += (double)x[i] * x[i];
    *scale = fp32_to_fp16((float)std::sqrt(ss / b.d));
    const float s = fp16_to_fp32(*scale);
    const float inv = s > 0 ? 1.0f / s : 0.0f;
    std::memset(codes, 0, (size_t)kv_vq_row_bytes(ng, bits));
    float y[16];
    for (int g = 0; g < ng; g++) {
        for (int j = 0; j < c; j++) y[j] = x[g * c + j] * inv;
        const float* e = h.enc + (size_t)g * K * c;
        int best = 0;
        float bd = std::numeric_limits<float>::infinity();
        for (int k = 0; k < K; k++, e += c) {
            float dd = 0;
            for (int j = 0; j < c; j++) dd += (y[j] - e[j]) * (y[j] - e[j]);
            if (dd < bd) bd = dd, best = k;
        }
        const int at = g * bits;  // little-endian bit stream; a code spans at most two bytes
        codes[at >> 3] |= (uint8_t)(best << (at & 7));
        if ((at & 7) + bits > 8) codes[(at >> 3) + 1] |= (uint8_t)(best >> (8 - (at & 7)));
    }
}

void kvq_vq_decode_row(const kv_vq_books& b, const kv_vq_book& h, const uint8_t* codes, uint16_t scale, int r,
                       float* x) {
    const int c = b.c, K = b.K, bits = b.bits();
    const float s = fp16_to_fp32(scale);
    for (int g = 0; g < r / c; g++) {
        // kv_vq_code reads two bytes; the last code of a row may sit in its last byte
        const int at = g * bits;
        unsigned w = codes[at >> 3];
        if ((at & 7) + bits > 8) w |= (unsigned)codes[(at >> 3) + 1] << 8;
        const int code = (int)((w >> (at & 7)) & ((1u << bits) - 1));
        const float* d = h.dec + ((size_t)g * K + code) * c;
        for (int j = 0; j < c; j++) x[g * c + j] = s * d[j];
    }
}

}  // namespace zk
