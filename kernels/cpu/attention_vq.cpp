// Decode attention's value sums over vector-coded values (KV_LAYOUT_VQ; the
// format in kernels/attention.h). A slot's value is scale_s book[g][code_g]
// for each group g of c channels, so
//   acc_j = sum_s p_j(s) v(s) = sum_g sum_k H_j[g][k] book[g][k],
//   H_j[g][k] = sum of p_j(s) scale_s over the slots whose group g has code k.
// The fast path builds H (r / c adds a slot and head, no channel work) and
// meets the book once per range (r x K multiply-adds a head); a range shorter
// than K slots, where that product would cost more than the slots, and the
// reference path decode each slot's row and add it.
#include <cstring>

#include "kernels/cpu/attention_layout.h"

namespace zk {
namespace attn {

void vq_values(const attn_kv_view& kv, int64_t a, int64_t b, int64_t s0, int64_t n, int G, float* acc,
               range_scratch& w, bool ref) {
    const attn_side_view& v = kv.v;
    const int r = kv.r_v, c = v.vq.c, K = v.vq.K, bits = v.vq.bits, ng = r / c;
    const int rb = kv_vq_row_bytes(ng, bits);
    const uint8_t* codes = (const uint8_t*)v.codes;
    const float* book = v.vq.book;  // [ng x K x c]
    if (ref || b - a < K) {
        for (int64_t s = a; s < b; s++) {
            const uint8_t* row = codes + s * rb;
            const float sc = h2f(v.scale[s]);
            for (int g = 0; g < ng; g++) {
                const float* d = book + ((size_t)g * K + kv_vq_code(row, g, bits)) * c;
                for (int i = 0; i < c; i++) w.vrow[g * c + i] = sc * d[i];
            }
            for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], w.vrow, acc + j * r, r);
        }
        return;
    }
    const int cells = ng * K;
    std::memset(w.hist, 0, sizeof(float) * (size_t)G * cells);
    int32_t* cell = w.vcode;  // [ng] the slot's cells g K + code_g
    for (int64_t s = a; s < b; s++) {
        const uint8_t* row = codes + s * rb;
        for (int g = 0; g < ng; g++) cell[g] = g * K + kv_vq_code(row, g, bits);
        const float sc = h2f(v.scale[s]);
        for (int j = 0; j < G; j++) {
            const float p = w.sc[j * n + s - s0] * sc;
            float* h = w.hist + (size_t)j * cells;
            for (int g = 0; g < ng; g++) h[cell[g]] += p;
        }
    }
    for (int j = 0; j < G; j++) {
        const float* h = w.hist + (size_t)j * cells;
        float* o = acc + j * r;
        for (int g = 0; g < ng; g++) {
            // o[g c .. g c + c) += sum_k H[g][k] book[g][k]: the book's rows in order
            const float* bk = book + (size_t)g * K * c;
            float* og = o + g * c;
            for (int k = 0; k < K; k++) {
                const float hk = h[g * K + k];
                if (hk == 0.0f) continue;
                for (int i = 0; i < c; i++) og[i] += hk * bk[k * c + i];
            }
        }
    }
}

}  // namespace attn
}  // namespace zk
