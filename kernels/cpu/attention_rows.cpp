// Decode attention over full-precision rows (f16 or f32): the 16-bit cache,
// and the residual window of every quantized layout. Fast path: the
// register-blocked loops of attention_stripes.h; reference: one row at a time
// through float dot products and axpys.
#include <cstdint>

#include "kernels/cpu/attention_layout.h"
#include "kernels/cpu/attention_stripes.h"

namespace zk {
namespace attn {

void rows_scores(dtype type, const void* rows, int64_t off, int r, int64_t a, int64_t b, int64_t s0, int64_t n,
                 const float* qt, int64_t qhs, int G, float scale, range_scratch& w, bool ref) {
#ifdef ZK_SIMD_AVX2
    if (!ref && fp_fast_ok(G, r)) {
        if (type == dtype::F16)
            scores_fast((const uint16_t*)rows, nullptr, 0, off, a, b, s0, n, r, qt, qhs, G, w.sc);
        else
            scores_fast((const float*)rows, nullptr, 0, off, a, b, s0, n, r, qt, qhs, G, w.sc);
    } else
#endif
        for (int64_t s = a; s < b; s++) {
            const float* kr = kv_row(type, rows, s - off, r, w.krow);
            for (int j = 0; j < G; j++) w.sc[j * n + s - s0] = simd::dot_f32(qt + j * qhs, kr, r);
        }
    for (int j = 0; j < G; j++) simd::scale_f32(w.sc + j * n + a - s0, (int)(b - a), scale);
}

void rows_values(dtype type, const void* rows, int64_t off, int r, int64_t a, int64_t b, int64_t s0, int64_t n,
                 int G, float* acc, range_scratch& w, bool ref) {
#ifdef ZK_SIMD_AVX2
    if (!ref && fp_fast_ok(G, r)) {
        if (type == dtype::F16)
            values_fp_fast((const uint16_t*)rows, off, a, b, s0, n, r, G, w.sc, acc);
        else
            values_fp_fast((const float*)rows, off, a, b, s0, n, r, G, w.sc, acc);
        return;
    }
#endif
    for (int64_t s = a; s < b; s++) {
        const float* vr = kv_row(type, rows, s - off, r, w.vrow);
        for (int j = 0; j < G; j++) simd::axpy_f32(w.sc[j * n + s - s0], vr, acc + j * r, r);
    }
}

}  // namespace attn
}  // namespace zk
