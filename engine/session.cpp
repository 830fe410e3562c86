#include "engine/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/project.h"
#include "kernels/rmsnorm.h"
#include "kernels/rope.h"
#include "kernels/swiglu.h"

namespace zk {

namespace {

// Decode steps (few new tokens) split each head's slots into ranges so that
// every thread has work even with 3 KV heads; prefill has a task per token.
constexpr int64_t k_decode_max_tok = 4;
constexpr int64_t k_min_range = 128;

void add_bias(float* y, const float* b, int64_t n_tok, int64_t n) {
    if (!b) return;
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) y[t * n + i] += b[i];
}

}  // namespace

kv_cache_params session_kv_params(const session_params& p) {
    kv_cache_params k;
    k.type = p.kv_type;
    k.bits = p.kv_bits;
    k.group = p.kv_group;
    k.residual = p.kv_residual;
    k.gear = p.kv_gear;
    k.gear_rank = p.kv_gear_rank;
    k.gear_outliers = p.kv_gear_outliers;
    return k;
}

void session_validate_params(const session_params& p, const model_hparams& hp) {
    if (p.n_ctx <= 0) ZK_THROW("context size must be positive, got %lld", (long long)p.n_ctx);
    if (p.n_ctx > (1 << 20)) ZK_THROW("context size %lld is too large (max 1048576)", (long long)p.n_ctx);
    if (p.n_threads <= 0 || p.n_threads > 512)
        ZK_THROW("thread count must be between 1 and 512, got %d", p.n_threads);
    if (p.n_batch <= 0) ZK_THROW("batch size must be positive, got %lld", (long long)p.n_batch);
    if (p.kv_type != dtype::F32 && p.kv_type != dtype::F16)
        ZK_THROW("KV cache type %s is not supported (f32, f16)", dtype_name(p.kv_type));
    kv_cache_validate_params(session_kv_params(p));
    evict_validate_params(p.evict, p.n_ctx);
}

session::session(const model& m, const session_params& p) : m_(m), params_(p) {
    const model_hparams& hp = m.hp;
    session_validate_params(p, hp);
    params_.n_batch = std::min(p.n_batch, p.n_ctx);
    pool_ = std::make_unique<thread_pool>(p.n_threads);
    const size_t nh = (size_t)hp.n_layer * hp.n_head_kv;
    std::vector<int> rk(nh, hp.head_dim), rv(nh, hp.head_dim);
    if (!p.ranks_k.empty() || !p.ranks_v.empty()) {
        if (!m.zack.present)
            ZK_THROW("%s: compressed attention needs a .zack model (run zack calibrate first)",
                     m.file->path().c_str());
        if (p.ranks_k.size() != nh || p.ranks_v.size() != nh)
            ZK_THROW("rank tables must have %zu entries (layers x KV heads), got %zu and %zu", nh,
                     p.ranks_k.size(), p.ranks_v.size());
        for (size_t i = 0; i < nh; i++)
            if (p.ranks_k[i] < 1 || p.ranks_k[i] > hp.head_dim || p.ranks_v[i] < 1 || p.ranks_v[i] > hp.head_dim)
                ZK_THROW("rank of (layer %zu, head %zu) is outside 1..%d", i / hp.n_head_kv, i % hp.n_head_kv,
                         hp.head_dim);
        rk = p.ranks_k;
        rv = p.ranks_v;
        compressed_ = true;
        const int D = hp.head_dim;
        proj_.resize(nh);
        for (int il = 0; il < hp.n_layer; il++)
            for (int g = 0; g < hp.n_head_kv; g++) {
                const size_t h = (size_t)il * hp.n_head_kv + g;
                const float* R = m.zack.layers[il].rqk + (size_t)g * D * D;  // R[i][j]
                std::vector<float>& P = proj_[h];
                P.resize((size_t)rk[h] * D);
                for (int j = 0; j < rk[h]; j++)
                    for (int i = 0; i < D; i++) P[(size_t)j * D + i] = R[(size_t)i * D + j];
            }
    }
    // KV cache: with eviction it only needs room for the budget plus one chunk
    // of new tokens (decode chunk or prefill batch), while positions still run
    // up to n_ctx.
    policy_ = evict_policy_create(p.evict, p.n_ctx);
    kv_cache_params kp = session_kv_params(p);
    int64_t capacity = p.n_ctx;
    if (p.evict.policy != "none") {
        evicting_ = p.evict.budget < p.n_ctx;
        kp.evicting = evicting_;
        kp.scores = policy_->needs_attention();
        if (evicting_) capacity = std::min(p.n_ctx, p.evict.budget + std::max(p.evict.chunk, params_.n_batch));
    }
    cache_ = std::make_unique<kv_cache>(hp.n_layer, hp.n_head_kv, capacity, kp, rk, rv);
    const int64_t B = params_.n_batch, E = hp.n_embd, D = hp.head_dim;
    x_.resize(B * E);
    xn_.resize(B * E);
    q_.resize(B * hp.n_head * D);
    k_.resize(B * hp.n_head_kv * D);
    v_.resize(B * hp.n_head_kv * D);
    attn_.resize(B * hp.n_head * D);
    tmp_.resize(B * E);
    gate_.resize(B * hp.n_ff);
    up_.resize(B * hp.n_ff);
    rope_cs_.resize(B * hp.rope.n_dims);
    pos_.resize(B);
    logits_.resize(hp.n_vocab);
    const int64_t G = hp.n_group();
    max_chunks_ = std::min<int64_t>(64, std::max<int64_t>(1, 4 * p.n_threads));
    const int64_t per_task_decode = k_decode_max_tok * G * (2 + D);
    const int64_t per_task_prefill = G * (2 + D);
    part_buf_.resize(std::max(hp.n_head_kv * max_chunks_ * per_task_decode,
                              hp.n_head_kv * B * per_task_prefill));
    const int64_t cap = cache_->capacity();
    score_buf_.resize((size_t)p.n_threads * kernel_attention_scratch((int)G, cap, (int)D, (int)D, kp.gear ? kp.gear_rank : 0));
    if (policy_->needs_attention()) {
        logits_buf_.resize((size_t)hp.n_head_kv * k_decode_max_tok * G * cap);
        thread_logits_.resize((size_t)p.n_threads * G * cap);
        thread_scores_.assign((size_t)p.n_threads * hp.n_head_kv * cap, 0.0f);
    }
}

session::~session() = default;

void session::reset() {
    cache_->clear();
    n_past_ = 0;
}

const float* session::decode(const int32_t* tokens, int64_t n, bool logits_all) {
    const model_hparams& hp = m_.hp;
    if (n <= 0) ZK_THROW("decode needs at least one token");
    if (n_past_ + n > params_.n_ctx)
        ZK_THROW("context is full: %lld tokens in the cache + %lld new > context size %lld",
                 (long long)n_past_, (long long)n, (long long)params_.n_ctx);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp.n_vocab)
            ZK_THROW("token id %d is outside the vocabulary (0..%d)", tokens[i], hp.n_vocab - 1);
    if (logits_all && (int64_t)logits_.size() < n * hp.n_vocab) logits_.resize(n * hp.n_vocab);
    for (int64_t done = 0; done < n; done += params_.n_batch) {
        const int64_t c = std::min(params_.n_batch, n - done);
        const bool last = done + c == n;
        float* out = logits_all ? logits_.data() + done * hp.n_vocab : (last ? logits_.data() : nullptr);
        evict_before(c);
        forward_chunk(tokens + done, c, logits_all, out);
    }
    evict_after(n);
    return logits_.data();
}

void session::evict_before(int64_t incoming) {
    if (evicting_ && cache_->n_used_max() + incoming > cache_->capacity())
        evict_run(*cache_, *policy_, params_.evict.budget);
}

// After a prompt (more than a few tokens) the cache goes down to the budget at
// once (SnapKV's "after prefill"); decode steps evict in chunks so the cost is
// amortized.
void session::evict_after(int64_t n_call) {
    if (!evicting_) return;
    const int64_t slack = n_call > k_decode_max_tok ? 0 : params_.evict.chunk;
    if (cache_->n_used_max() > params_.evict.budget + slack) evict_run(*cache_, *policy_, params_.evict.budget);
}

void session::forward_chunk(const int32_t* tokens, int64_t n, bool logits_all, float* logits_out) {
    const model_hparams& hp = m_.hp;
    const int64_t E = hp.n_embd, D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;
    thread_pool& pool = *pool_;

    for (int64_t t = 0; t < n; t++) {
        pos_[t] = (int32_t)(n_past_ + t);
        const size_t row = dtype_row_size(m_.tok_embd.type, E);
        dtype_dequantize_row(m_.tok_embd.type, (const uint8_t*)m_.tok_embd.data + row * tokens[t],
                             x_.data() + t * E, E);
    }
    kernel_rope_table(hp.rope, pos_.data(), n, rope_cs_.data());

    for (int il = 0; il < hp.n_layer; il++) {
        const layer_weights& L = m_.layers[il];
        // attention sub-layer
        kernel_rmsnorm(x_.data(), L.attn_norm, xn_.data(), n, E, hp.rms_eps);
        kernel_matmul(L.wq, xn_.data(), n, q_.data(), pool, mm_scratch_);
        kernel_matmul(L.wk, xn_.data(), n, k_.data(), pool, mm_scratch_);
        kernel_matmul(L.wv, xn_.data(), n, v_.data(), pool, mm_scratch_);
        add_bias(q_.data(), L.bq, n, H * D);
        add_bias(k_.data(), L.bk, n, KV * D);
        add_bias(v_.data(), L.bv, n, KV * D);
        kernel_rope_apply(q_.data(), n, H, D, hp.rope, rope_cs_.data());
        kernel_rope_apply(k_.data(), n, KV, D, hp.rope, rope_cs_.data());
        if (observer_) observer_->on_qkv(il, n, pos_.data(), q_.data(), k_.data(), v_.data());
        if (compressed_) compress_qk(il, n);
        // V needs no work here: W_v is folded, so a rank-r_v head keeps the first
        // r_v channels of v.
        for (int g = 0; g < KV; g++)
            cache_->append(il, g, n, k_.data() + g * D, KV * D, v_.data() + g * D, KV * D, pos_.data());
        attention(il, n);
        if (observer_) observer_->on_attn(il, n, attn_.data());
        kernel_matmul(L.wo, attn_.data(), n, tmp_.data(), pool, mm_scratch_);
        for (int64_t i = 0; i < n * E; i++) x_[i] += tmp_[i];

        // feed-forward sub-layer
        kernel_rmsnorm(x_.data(), L.ffn_norm, xn_.data(), n, E, hp.rms_eps);
        kernel_matmul(L.w_gate, xn_.data(), n, gate_.data(), pool, mm_scratch_);
        kernel_matmul(L.w_up, xn_.data(), n, up_.data(), pool, mm_scratch_);
        kernel_swiglu(gate_.data(), up_.data(), gate_.data(), n * hp.n_ff);
        kernel_matmul(L.w_down, gate_.data(), n, tmp_.data(), pool, mm_scratch_);
        for (int64_t i = 0; i < n * E; i++) x_[i] += tmp_[i];
    }
    n_past_ += n;

    if (!logits_out) return;
    // Only the rows whose logits are wanted go through the output matrix.
    const int64_t first = logits_all ? 0 : n - 1;
    const int64_t rows = n - first;
    kernel_rmsnorm(x_.data() + first * E, m_.output_norm, xn_.data(), rows, E, hp.rms_eps);
    kernel_matmul(m_.output, xn_.data(), rows, logits_out, pool, mm_scratch_);
}

// q~ = q R[:, :r_k] for every query head and k~ = k R[:, :r_k] for every KV
// head, in place: head h's first r_k channels of q_/k_ become the projection
// (the rest is left unused). Layout stays [n x heads x head_dim].
void session::compress_qk(int il, int64_t n) {
    const model_hparams& hp = m_.hp;
    const int D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    pool_->parallel_for(n * KV, 1, [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; task++) {
            const int64_t t = task / KV;
            const int g = (int)(task % KV);
            const std::vector<float>& P = proj_[(size_t)il * KV + g];
            const int r = (int)(P.size() / D);
            kernel_project_head(P.data(), r, D, k_.data() + (t * KV + g) * D);
            for (int j = 0; j < G; j++) kernel_project_head(P.data(), r, D, q_.data() + (t * H + g * G + j) * D);
        }
    });
}

void session::attention(int il, int64_t n) {
    const model_hparams& hp = m_.hp;
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    const float scale = 1.0f / std::sqrt((float)D);  // the original head dim, also when compressed
    // Compressed heads write only their first r_v channels; W_o's folded rows for
    // the rest must see zeros.
    if (compressed_) std::memset(attn_.data(), 0, sizeof(float) * n * H * D);
    const int64_t score_stride = (int64_t)score_buf_.size() / params_.n_threads;
    const int64_t cap = cache_->capacity();
    const bool observe = policy_->needs_attention();
    auto cost = [&](int g, int64_t slots) {
        const kv_block& b = cache_->block(il, g);
        return slots * (b.r_k + b.r_v);
    };
    // Heads differ in rank (and, evicted, in slots): hand the tasks out longest first.
    auto order_tasks = [&]() {
        std::sort(tasks_.begin(), tasks_.end(), [](const std::pair<int64_t, int64_t>& a,
                                                   const std::pair<int64_t, int64_t>& b) {
            return a.first != b.first ? a.first > b.first : a.second < b.second;
        });
    };

    if (n <= k_decode_max_tok) {
        // flash-decoding: (head, slot range) tasks, then a merge per head
        const int64_t n_slots = cache_->n_used_max();
        int64_t nc = std::min<int64_t>((n_slots + k_min_range - 1) / k_min_range,
                                       (2 * params_.n_threads + KV - 1) / KV);
        nc = std::max<int64_t>(1, std::min(nc, max_chunks_));
        const int64_t per_task = n * G * (2 + D);
        auto part_of = [&](int64_t task) {
            float* b = part_buf_.data() + task * per_task;
            attn_partial p{b, b + n * G, b + 2 * n * G};
            if (observe) {
                p.logits = logits_buf_.data() + (task / nc) * n * G * cap;
                p.logits_stride = cap;
            }
            return p;
        };
        tasks_.clear();
        for (int64_t task = 0; task < KV * nc; task++) {
            const int g = (int)(task / nc);
            tasks_.push_back({cost(g, cache_->block(il, g).n_used / nc), task});
        }
        order_tasks();
        pool_->parallel_for(KV * nc, 1, [&](int64_t b, int64_t e, int ith) {
            for (int64_t i = b; i < e; i++) {
                const int64_t task = tasks_[i].second;
                const int g = (int)(task / nc);
                const int64_t c = task % nc;
                const attn_kv_view kv = cache_->view(il, g);
                const int64_t s0 = kv.n_slots * c / nc, s1 = kv.n_slots * (c + 1) / nc;
                attn_q_view q{q_.data() + g * G * D, H * D, D, (int)G, n, pos_.data(), scale};
                kernel_attention_range(kv, s0, s1, q, part_of(task), score_buf_.data() + ith * score_stride);
            }
        });
        for (int g = 0; g < KV; g++) {
            attn_partial parts[64];
            for (int64_t c = 0; c < nc; c++) parts[c] = part_of(g * nc + c);
            const int r_v = cache_->block(il, g).r_v;
            kernel_attention_merge(parts, (int)nc, n, (int)G, r_v, attn_.data() + g * G * D, H * D, D);
        }
        if (observe) {
            pool_->parallel_for(KV, 1, [&](int64_t b, int64_t e, int) {
                for (int64_t g = b; g < e; g++) {
                    kv_block& blk = cache_->block(il, (int)g);
                    for (int64_t t = 0; t < n; t++) {
                        const evict_observation o{il, (int)g, pos_[t], t, n, params_.n_ctx, blk.pos.data()};
                        for (int64_t j = 0; j < G; j++)
                            policy_->observe(o, logits_buf_.data() + ((g * n + t) * G + j) * cap, blk.n_used,
                                             blk.score.data());
                    }
                }
            });
        }
        return;
    }

    // prefill: one task per (head, token); each sees the slots up to its position
    const int64_t per_task = G * (2 + D);
    tasks_.clear();
    for (int64_t task = 0; task < KV * n; task++) {
        const int g = (int)(task / n);
        tasks_.push_back({cost(g, std::min(cache_->block(il, g).n_used, n_past_ + task % n + 1)), task});
    }
    order_tasks();
    pool_->parallel_for(KV * n, 1, [&](int64_t b, int64_t e, int ith) {
        for (int64_t i = b; i < e; i++) {
            const int64_t task = tasks_[i].second;
            const int g = (int)(task / n);
            const int64_t t = task % n;
            const attn_kv_view kv = cache_->view(il, g);
            float* pb = part_buf_.data() + task * per_task;
            attn_partial part{pb, pb + G, pb + 2 * G};
            float* lg = observe ? thread_logits_.data() + (size_t)ith * G * cap : nullptr;
            part.logits = lg;
            part.logits_stride = cap;
            attn_q_view q{q_.data() + t * H * D + g * G * D, H * D, D, (int)G, 1, pos_.data() + t, scale};
            // slots beyond this token's position are invisible; stop the range there
            // (slot index <= position, also after eviction)
            const int64_t s1 = std::min(kv.n_slots, n_past_ + t + 1);
            kernel_attention_range(kv, 0, s1, q, part, score_buf_.data() + ith * score_stride);
            kernel_attention_merge(&part, 1, 1, (int)G, kv.r_v, attn_.data() + t * H * D + g * G * D, H * D, D);
            if (observe) {
                const evict_observation o{il, g, pos_[t], t, n, params_.n_ctx, kv.pos};
                float* acc = thread_scores_.data() + ((size_t)ith * KV + g) * cap;
                for (int64_t j = 0; j < G; j++) policy_->observe(o, lg + j * cap, s1, acc);
            }
        }
    });
    if (observe) {
        // per-thread sums into the blocks' scores, in thread order
        pool_->parallel_for(KV, 1, [&](int64_t b, int64_t e, int) {
            for (int64_t g = b; g < e; g++) {
                kv_block& blk = cache_->block(il, (int)g);
                for (int i = 0; i < params_.n_threads; i++) {
                    float* acc = thread_scores_.data() + ((size_t)i * KV + g) * cap;
                    for (int64_t s = 0; s < blk.n_used; s++) blk.score[s] += acc[s], acc[s] = 0;
                }
            }
        });
    }
}

}  // namespace zk
