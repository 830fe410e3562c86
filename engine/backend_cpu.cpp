#include "engine/backend_cpu.h"

#include <cmath>

#include "ggml-like/quant_pack.h"
#include "kernels/geglu.h"
#include "kernels/rmsnorm.h"
#include "kernels/swiglu.h"

namespace zk {

backend_cpu::backend_cpu(int n_threads) : pool_(n_threads) {}

std::unique_ptr<forward_buffers> backend_cpu::buffers_create(const model_hparams& hp, int64_t n_rows, int max_seqs,
                                                             int n_threads, int64_t cap, int gear_rank,
                                                             bool observe) {
    return std::make_unique<forward_buffers>(hp, n_rows, max_seqs, n_threads, cap, gear_rank, observe);
}

void backend_cpu::embed(const weight_view& table, const int32_t* tokens, int64_t n, float scale, float* x) {
    const int64_t E = table.n_cols;
    const size_t row = dtype_row_size(table.type, E);
    for (int64_t t = 0; t < n; t++) {
        float* xt = x + t * E;
        if (table.packed)  // a table tied to the packed output (model_pack_weights)
            quant_pack_dequantize_row(table.type, table.packed, E, tokens[t], xt);
        else
            dtype_dequantize_row(table.type, (const uint8_t*)table.data + row * tokens[t], xt, E);
        if (scale != 1.0f)
            for (int64_t i = 0; i < E; i++) xt[i] *= scale;
    }
}

void backend_cpu::matmul(const weight_view& w, const float* x, int64_t n_tok, float* y, forward_buffers& fb) {
    kernel_matmul(w, x, n_tok, y, pool_, fb.mm);
}

void backend_cpu::matmul_multi(const weight_view* ws, float* const* ys, int n_w, const float* x, int64_t n_tok,
                               forward_buffers& fb) {
    kernel_matmul_multi(ws, ys, n_w, x, n_tok, pool_, fb.mm);
}

void backend_cpu::rmsnorm(const float* x, const float* w, float* y, int64_t n_tok, int64_t n, float eps) {
    kernel_rmsnorm(x, w, y, n_tok, n, eps);
}

void backend_cpu::add_bias(float* y, const float* b, int64_t n_tok, int64_t n) {
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

void backend_cpu::add(float* x, const float* y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += y[i];
}

void backend_cpu::rope_table(const rope_params& p, const int32_t* pos, int64_t n_tok, float* cs) {
    kernel_rope_table(p, pos, n_tok, cs);
}

void backend_cpu::rope_apply(float* x, int64_t n_tok, int64_t n_heads, int64_t head_dim, const rope_params& p,
                             const float* cs) {
    kernel_rope_apply(x, n_tok, n_heads, head_dim, p, cs);
}

void backend_cpu::glu(arch_act act, float* g, const float* u, int64_t n_tok, int64_t F) {
    // every thread a share of the rows (a prefill chunk is a few M elements)
    // (one captured pointer: the std::function keeps it in its small buffer,
    // so a decode step allocates nothing here)
    const struct {
        float* g;
        const float* u;
        int64_t F;
        bool gelu;
    } sw{g, u, F, act == arch_act::GELU_TANH_GLU};
    const auto* swp = &sw;
    pool_.parallel_for(n_tok, 8, [swp](int64_t t0, int64_t t1, int) {
        float* gt = swp->g + t0 * swp->F;
        const float* ut = swp->u + t0 * swp->F;
        if (swp->gelu)
            kernel_geglu(gt, ut, gt, (t1 - t0) * swp->F);
        else
            kernel_swiglu(gt, ut, gt, (t1 - t0) * swp->F);
    });
}

void backend_cpu::softcap(float* y, int64_t n, float c) {
    for (int64_t i = 0; i < n; i++) y[i] = c * std::tanh(y[i] / c);
}

}  // namespace zk
