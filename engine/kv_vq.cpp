#include "engine/kv_vq.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/cpu/simd.h"

namespace zk {

int kvq_vq_nearest(const float* y, const float* e, int K, int c) {
#ifdef ZK_SIMD_AVX2
    if ((c == 8 || c == 4) && K % 8 == 0) {
        // 8 centroids at a time: their squared distances summed by a tree of
        // horizontal adds into one vector; each lane keeps its least (strictly
        // less: its first) and that centroid's index. c = 8: a centroid a vector,
        // lane i ends with centroid k + i; c = 4: two a vector (y in both halves),
        // lanes 0-3 with k, k + 2, k + 4, k + 6 and 4-7 with k + 1, k + 3, ...
        const __m256 yv = c == 8 ? _mm256_loadu_ps(y) : _mm256_broadcast_ps((const __m128*)y);
        __m256 best = _mm256_set1_ps(INFINITY);
        __m256i bi = _mm256_setzero_si256();
        __m256i idx = c == 8 ? _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7) : _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
        const __m256i step = _mm256_set1_epi32(8);
        for (int k = 0; k < K; k += 8, e += 8 * c, idx = _mm256_add_epi32(idx, step)) {
            __m256 dist;
            auto sq = [&](int i) {
                const __m256 t = _mm256_sub_ps(yv, _mm256_loadu_ps(e + 8 * i));
                return _mm256_mul_ps(t, t);
            };
            if (c == 8) {
                // hadd(a, b) = [a01 a23 b01 b23 | a45 a67 b45 b67]; q0 = [d0 d1 d2 d3 over
                // channels 0-3 | the same over 4-7], q1 likewise for d4..d7
                const __m256 h01 = _mm256_hadd_ps(sq(0), sq(1)), h23 = _mm256_hadd_ps(sq(2), sq(3));
                const __m256 h45 = _mm256_hadd_ps(sq(4), sq(5)), h67 = _mm256_hadd_ps(sq(6), sq(7));
                const __m256 q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
                dist = _mm256_add_ps(_mm256_permute2f128_ps(q0, q1, 0x20), _mm256_permute2f128_ps(q0, q1, 0x31));
            } else {
                dist = _mm256_hadd_ps(_mm256_hadd_ps(sq(0), sq(1)), _mm256_hadd_ps(sq(2), sq(3)));
            }
            const __m256 lt = _mm256_cmp_ps(dist, best, _CMP_LT_OQ);
            best = _mm256_blendv_ps(best, dist, lt);
            bi = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(bi), _mm256_castsi256_ps(idx), lt));
        }
        alignas(32) float bv[8];
        alignas(32) int32_t bk[8];
        _mm256_store_ps(bv, best);
        _mm256_store_si256((__m256i*)bk, bi);
        int out = bk[0];
        float od = bv[0];
        for (int i = 1; i < 8; i++)
            if (bv[i] < od || (bv[i] == od && bk[i] < out)) od = bv[i], out = bk[i];
        return out;
    }
#endif
    int best = 0;
    float bd = std::numeric_limits<float>::infinity();
    for (int k = 0; k < K; k++, e += c) {
        float dd = 0;
        for (int j = 0; j < c; j++) dd += (y[j] - e[j]) * (y[j] - e[j]);
        if (dd < bd) bd = dd, best = k;
    }
    return best;
}

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

void kvq_vq_int8_book(int c, int K, int d, const float* dec, int8_t* dec8, float* scale) {
    const size_t per = (size_t)K * c;
    for (int q = 0; q < d / c; q++) {
        const float* x = dec + q * per;
        float m = 0.0f;
        for (size_t i = 0; i < per; i++) m = std::max(m, std::fabs(x[i]));
        const float s = m / 127.0f, inv = m > 0 ? 127.0f / m : 0.0f;
        scale[q] = s;
        for (size_t i = 0; i < per; i++) dec8[q * per + i] = (int8_t)std::lrint(x[i] * inv);
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
        const int best = kvq_vq_nearest(y, h.enc + (size_t)g * K * c, K, c);
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
