#include "engine/arch_block.h"

#include <cmath>

#include "engine/session.h"
#include "kernels/geglu.h"
#include "kernels/matmul.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace zk {

namespace {

void add_bias(float* y, const float* b, int64_t n_tok, int64_t n) {
    if (!b) return;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

// x += post_norm(y) (post_norm null: x += y), y [n x E] overwritten.
void residual_add(float* x, float* y, const float* post_norm, int64_t n, int64_t E, float eps) {
    if (post_norm) kernel_rmsnorm(y, post_norm, y, n, E, eps);
    for (int64_t i = 0; i < n * E; i++) x[i] += y[i];
}

}  // namespace

void arch_block_embed(const model& m, const int32_t* tokens, int64_t n, forward_buffers& fb) {
    const model_hparams& hp = m.hp;
    const int64_t E = hp.n_embd;
    const size_t emb_row = dtype_row_size(m.tok_embd.type, E);
    for (int64_t t = 0; t < n; t++) {
        float* x = fb.x.data() + t * E;
        dtype_dequantize_row(m.tok_embd.type, (const uint8_t*)m.tok_embd.data + emb_row * tokens[t], x, E);
        if (hp.embd_scale != 1.0f)
            for (int64_t i = 0; i < E; i++) x[i] *= hp.embd_scale;
    }
    kernel_rope_table(hp.rope, fb.pos.data(), n, fb.rope_cs.data());
    if (hp.n_swa > 0) kernel_rope_table(hp.rope_swa, fb.pos.data(), n, fb.rope_cs_swa.data());
}

void arch_block_attn_in(const model& m, int il, int64_t n, forward_buffers& fb, thread_pool& pool) {
    const model_hparams& hp = m.hp;
    const layer_weights& L = m.layers[il];
    const int64_t E = hp.n_embd, D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;
    kernel_rmsnorm(fb.x.data(), L.attn_norm, fb.xn.data(), n, E, hp.rms_eps);
    {
        const weight_view w[3] = {L.wq, L.wk, L.wv};
        float* const y[3] = {fb.q.data(), fb.k.data(), fb.v.data()};
        kernel_matmul_multi(w, y, 3, fb.xn.data(), n, pool, fb.mm);
    }
    add_bias(fb.q.data(), L.bq, n, H * D);
    add_bias(fb.k.data(), L.bk, n, KV * D);
    add_bias(fb.v.data(), L.bv, n, KV * D);
    // QK-norm: every head of q and k is one row of head_dim
    if (L.q_norm) kernel_rmsnorm(fb.q.data(), L.q_norm, fb.q.data(), n * H, D, hp.rms_eps);
    if (L.k_norm) kernel_rmsnorm(fb.k.data(), L.k_norm, fb.k.data(), n * KV, D, hp.rms_eps);
    const bool local = hp.layer_is_swa(il);
    const rope_params& rp = local ? hp.rope_swa : hp.rope;
    const float* cs = local ? fb.rope_cs_swa.data() : fb.rope_cs.data();
    kernel_rope_apply(fb.q.data(), n, H, D, rp, cs);
    kernel_rope_apply(fb.k.data(), n, KV, D, rp, cs);
}

void arch_block_attn_out(const model& m, int il, int64_t n, forward_buffers& fb, thread_pool& pool) {
    const model_hparams& hp = m.hp;
    const layer_weights& L = m.layers[il];
    kernel_matmul(L.wo, fb.attn.data(), n, fb.tmp.data(), pool, fb.mm);
    residual_add(fb.x.data(), fb.tmp.data(), L.attn_post_norm, n, hp.n_embd, hp.rms_eps);
}

void arch_block_ffn(const model& m, int il, int64_t n, forward_buffers& fb, thread_pool& pool) {
    const model_hparams& hp = m.hp;
    const layer_weights& L = m.layers[il];
    kernel_rmsnorm(fb.x.data(), L.ffn_norm, fb.xn.data(), n, hp.n_embd, hp.rms_eps);
    {
        const weight_view w[2] = {L.w_gate, L.w_up};
        float* const y[2] = {fb.gate.data(), fb.up.data()};
        kernel_matmul_multi(w, y, 2, fb.xn.data(), n, pool, fb.mm);
    }
    {
        // every thread a share of the rows (a prefill chunk is a few M elements)
        // (one captured pointer: the std::function keeps it in its small
        // buffer, so a decode step allocates nothing here)
        const struct {
            float* g;
            const float* u;
            int64_t F;
            bool gelu;
        } sw{fb.gate.data(), fb.up.data(), hp.n_ff, hp.act == arch_act::GELU_TANH_GLU};
        const auto* swp = &sw;
        pool.parallel_for(n, 8, [swp](int64_t t0, int64_t t1, int) {
            float* g = swp->g + t0 * swp->F;
            const float* u = swp->u + t0 * swp->F;
            if (swp->gelu)
                kernel_geglu(g, u, g, (t1 - t0) * swp->F);
            else
                kernel_swiglu(g, u, g, (t1 - t0) * swp->F);
        });
    }
    kernel_matmul(L.w_down, fb.gate.data(), n, fb.tmp.data(), pool, fb.mm);
    residual_add(fb.x.data(), fb.tmp.data(), L.ffn_post_norm, n, hp.n_embd, hp.rms_eps);
}

void arch_block_logits(const model& m, const float* xn, int64_t rows, float* out, forward_buffers& fb,
                       thread_pool& pool) {
    kernel_matmul(m.output, xn, rows, out, pool, fb.mm);
    const float c = m.hp.logit_softcap;
    if (c > 0) {
        const int64_t n = rows * m.hp.n_vocab;
        for (int64_t i = 0; i < n; i++) out[i] = c * std::tanh(out[i] / c);
    }
}

}  // namespace zk
