#include "engine/arch_block.h"

namespace zk {

namespace {

// x += post_norm(y) (post_norm null: x += y), y [n x E] overwritten.
void residual_add(backend& be, float* x, float* y, const float* post_norm, int64_t n, int64_t E, float eps) {
    if (post_norm) be.rmsnorm(y, post_norm, y, n, E, eps);
    be.add(x, y, n * E);
}

}  // namespace

void arch_block_embed(const model& m, const int32_t* tokens, int64_t n, forward_buffers& fb, backend& be) {
    const model_hparams& hp = m.hp;
    be.embed(m.tok_embd, tokens, n, hp.embd_scale, fb.x.data());
    be.rope_table(hp.rope, fb.pos.data(), n, fb.rope_cs.data());
    if (hp.n_swa > 0) be.rope_table(hp.rope_swa, fb.pos.data(), n, fb.rope_cs_swa.data());
}

void arch_block_attn_in(const model& m, int il, int64_t n, forward_buffers& fb, backend& be) {
    const model_hparams& hp = m.hp;
    const layer_weights& L = m.layers[il];
    const int64_t E = hp.n_embd, D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;
    be.rmsnorm(fb.x.data(), L.attn_norm, fb.xn.data(), n, E, hp.rms_eps);
    {
        const weight_view w[3] = {L.wq, L.wk, L.wv};
        float* const y[3] = {fb.q.data(), fb.k.data(), fb.v.data()};
        be.matmul_multi(w, y, 3, fb.xn.data(), n, fb);
    }
    if (L.bq) be.add_bias(fb.q.data(), L.bq, n, H * D);
    if (L.bk) be.add_bias(fb.k.data(), L.bk, n, KV * D);
    if (L.bv) be.add_bias(fb.v.data(), L.bv, n, KV * D);
    // QK-norm: every head of q and k is one row of head_dim
    if (L.q_norm) be.rmsnorm(fb.q.data(), L.q_norm, fb.q.data(), n * H, D, hp.rms_eps);
    if (L.k_norm) be.rmsnorm(fb.k.data(), L.k_norm, fb.k.data(), n * KV, D, hp.rms_eps);
    const bool local = hp.layer_is_swa(il);
    const rope_params& rp = local ? hp.rope_swa : hp.rope;
    const float* cs = local ? fb.rope_cs_swa.data() : fb.rope_cs.data();
    be.rope_apply(fb.q.data(), n, H, D, rp, cs);
    be.rope_apply(fb.k.data(), n, KV, D, rp, cs);
}

void arch_block_attn_out(const model& m, int il, int64_t n, forward_buffers& fb, backend& be) {
    const model_hparams& hp = m.hp;
    const layer_weights& L = m.layers[il];
    be.matmul(L.wo, fb.attn.data(), n, fb.tmp.data(), fb);
    residual_add(be, fb.x.data(), fb.tmp.data(), L.attn_post_norm, n, hp.n_embd, hp.rms_eps);
}

void arch_block_ffn(const model& m, int il, int64_t n, forward_buffers& fb, backend& be) {
    const model_hparams& hp = m.hp;
    const layer_weights& L = m.layers[il];
    be.rmsnorm(fb.x.data(), L.ffn_norm, fb.xn.data(), n, hp.n_embd, hp.rms_eps);
    {
        const weight_view w[2] = {L.w_gate, L.w_up};
        float* const y[2] = {fb.gate.data(), fb.up.data()};
        be.matmul_multi(w, y, 2, fb.xn.data(), n, fb);
    }
    be.glu(hp.act, fb.gate.data(), fb.up.data(), n, hp.n_ff);
    be.matmul(L.w_down, fb.gate.data(), n, fb.tmp.data(), fb);
    residual_add(be, fb.x.data(), fb.tmp.data(), L.ffn_post_norm, n, hp.n_embd, hp.rms_eps);
}

void arch_block_logits(const model& m, const float* xn, int64_t rows, float* out, forward_buffers& fb, backend& be) {
    const int64_t n = rows * m.hp.n_vocab;
    float* y = be.logits_target(out, n);
    be.matmul(m.output, xn, rows, y, fb);
    if (m.hp.logit_softcap > 0) be.softcap(y, n, m.hp.logit_softcap);
    be.logits_fetch(out, y, n);
}

}  // namespace zk
