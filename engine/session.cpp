#include "engine/session.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/arch_block.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/attention_prefill.h"
#include "kernels/project.h"
#include "kernels/rmsnorm.h"

namespace zk {

namespace {

// A decode segment's slot ranges hold at least this many slots.
constexpr int64_t k_min_range = 128;

// Sliding-window layers (model_hparams::n_swa; 0 = a global layer): a query at
// position p sees the positions > p - n_swa. Slots ascend by position, so
// those are the slots from the one returned here on. The cache keeps every
// token (masking, not a window-sized cache).
int64_t window_first_slot(const attn_kv_view& kv, int64_t n_swa, int32_t p) {
    if (n_swa <= 0 || p - n_swa + 1 <= 0) return 0;
    return std::lower_bound(kv.pos, kv.pos + kv.n_slots, (int32_t)(p - n_swa + 1)) - kv.pos;
}

// The exact sinks a query whose first visible slot is lo sees: the view with
// the sink slots below lo cut off (kernel_attention_sinks reads sink rows by
// position, so moving pos on is enough; its logits move on by the same count).
attn_kv_view window_sinks(attn_kv_view kv, int64_t lo) {
    const int64_t cut = std::min(lo, kv.n_sink_slots);
    kv.pos += cut;
    kv.n_sink_slots -= cut;
    return kv;
}

// Logits of slots a windowed query cannot see, for eviction policies: -inf.
void window_mask_logits(float* lg, int64_t stride, int64_t rows, int64_t lo) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t s = 0; s < lo; s++) lg[r * stride + s] = -INFINITY;
}

}  // namespace

forward_buffers::forward_buffers(const model_hparams& hp, int64_t n_rows_, int max_seqs_, int n_threads_,
                                 int64_t cap_, int gear_rank, bool observe)
    : n_rows(n_rows_), max_seqs(max_seqs_), n_threads(n_threads_), cap(cap_) {
    ZK_ASSERT(n_rows >= 1 && max_seqs >= 1 && n_threads >= 1 && cap >= 1);
    const int64_t R = n_rows, E = hp.n_embd, D = hp.head_dim, KV = hp.n_head_kv, G = hp.n_group();
    x.resize(R * E);
    xn.resize(R * E);
    q.resize(R * hp.n_head * D);
    k.resize(R * KV * D);
    v.resize(R * KV * D);
    attn.resize(R * hp.n_head * D);
    tmp.resize(R * E);
    gate.resize(R * hp.n_ff);
    up.resize(R * hp.n_ff);
    rope_cs.resize(R * hp.rope.n_dims);
    if (hp.n_swa > 0) rope_cs_swa.resize(R * hp.rope_swa.n_dims);
    pos.resize(R);
    row_seq.resize(R);
    max_chunks = std::min<int64_t>(64, std::max<int64_t>(1, 4 * n_threads));
    // A decode segment of n tokens needs KV x nc x n x G x (2 + D) floats of
    // partials (nc <= max_chunks), a prefill segment (alone in its pass) KV x n x G x (2 + D).
    const int64_t decode_rows = std::min<int64_t>(R, (int64_t)max_seqs * k_session_decode_max_tok);
    part.resize(KV * G * (2 + D) * std::max(decode_rows * max_chunks, R));
    tasks.reserve(KV * std::max(std::min<int64_t>(max_seqs, R) * max_chunks, R));
    seg_nc.resize(max_seqs);
    seg_part.resize(max_seqs);
    score.resize((size_t)n_threads * kernel_attention_scratch((int)G, cap, (int)D, (int)D, gear_rank));
    sink_part_stride = k_session_decode_max_tok * G * (2 + D);
    sink_part.resize((size_t)n_threads * sink_part_stride);
    if (observe) {
        thread_logits.resize((size_t)n_threads * G * cap);
        thread_scores.assign((size_t)n_threads * KV * cap, 0.0f);
    }
    prefill_tokens = kernel_prefill_tokens((int)G);
    prefill_scratch_stride = kernel_prefill_scratch((int)G, prefill_tokens, (int)D, (int)D);
    prefill_scratch.resize((size_t)n_threads * prefill_scratch_stride);
}

kv_cache_params session_kv_params(const session_params& p) {
    kv_cache_params k;
    k.type = p.kv_type;
    k.bits = p.kv_bits;
    k.bits_k = p.kv_bits_k;
    k.bits_v = p.kv_bits_v;
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
    kv_cache_validate_params(session_kv_params(p), hp.n_layer, hp.n_head_kv);
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
        if (!p.kbasis.empty() && p.kbasis.size() != nh)
            ZK_THROW("the key-basis table must have %zu entries (layers x KV heads), got %zu", nh, p.kbasis.size());
        const int D = hp.head_dim;
        proj_q_.resize(nh);
        proj_k_.resize(nh);
        for (int il = 0; il < hp.n_layer; il++)
            for (int g = 0; g < hp.n_head_kv; g++) {
                const size_t h = (size_t)il * hp.n_head_kv + g;
                const int b = p.kbasis.empty() ? 0 : p.kbasis[h];
                const zack_layer& zl = m.zack.layers[il];
                if (b < 0 || b > 2) ZK_THROW("key basis %d of (layer %d, head %d) is not 0, 1 or 2", b, il, g);
                if (b > 0 && !m.zack.has_key_bases())
                    ZK_THROW("%s: this .zack has no score/pairs key bases (made by an older zack calibrate)",
                             m.file->path().c_str());
                const float* A = b == 0 ? zl.rqk : b == 1 ? zl.kqa : zl.kpair;  // [g][i][j], column j = direction j
                const float* B = b == 0 ? zl.rqk : b == 1 ? zl.kqb : zl.kpair;
                // all D rows: exact sinks need the whole projected q and k
                for (int side = 0; side < 2; side++) {
                    const float* R = (side ? B : A) + (size_t)g * D * D;
                    std::vector<float>& P = (side ? proj_k_ : proj_q_)[h];
                    P.resize((size_t)D * D);
                    for (int j = 0; j < D; j++)
                        for (int i = 0; i < D; i++) P[(size_t)j * D + i] = R[(size_t)i * D + j];
                }
            }
    }
    // KV cache: with eviction it only needs room for the budget plus one chunk
    // of new tokens (decode chunk or prefill batch), while positions still run
    // up to n_ctx.
    policy_ = evict_policy_create(p.evict, p.n_ctx);
    kv_cache_params kp = session_kv_params(p);
    // Exact sinks where the cache loses something (quantized or compressed): the
    // sink tokens draw most of the attention, and keeping them exact costs a
    // fixed few rows (on SmolLM2-135M it lowers 4-bit KL by a quarter).
    if (kv_cache_quantized(kp) || compressed_) {
        kp.sinks = p.evict.n_sink;
        kp.sink_dim = hp.head_dim;
    }
    int64_t capacity = p.n_ctx;
    if (p.evict.policy != "none") {
        evicting_ = p.evict.budget < p.n_ctx;
        kp.evicting = evicting_;
        kp.scores = policy_->needs_attention();
        if (evicting_) capacity = std::min(p.n_ctx, p.evict.budget + std::max(p.evict.chunk, params_.n_batch));
    }
    cache_ = std::make_unique<kv_cache>(hp.n_layer, hp.n_head_kv, capacity, kp, rk, rv);
    const int64_t cap = cache_->capacity();
    fb_ = std::make_unique<forward_buffers>(hp, params_.n_batch, 1, p.n_threads, cap, kp.gear ? kp.gear_rank : 0,
                                            policy_->needs_attention());
    logits_.resize(hp.n_vocab);
    if (policy_->needs_attention())
        logits_buf_.resize((size_t)hp.n_head_kv * k_session_decode_max_tok * hp.n_group() * cap);
}

session::~session() = default;

void session::reset() {
    cache_->clear();
    n_past_ = 0;
}

void session::check_tokens(const int32_t* tokens, int64_t n) const {
    const model_hparams& hp = m_.hp;
    if (n <= 0) ZK_THROW("decode needs at least one token");
    if (n_past_ + n > params_.n_ctx)
        ZK_THROW("context is full: %lld tokens in the cache + %lld new > context size %lld",
                 (long long)n_past_, (long long)n, (long long)params_.n_ctx);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= hp.n_vocab)
            ZK_THROW("token id %d is outside the vocabulary (0..%d)", tokens[i], hp.n_vocab - 1);
}

const float* session::decode(const int32_t* tokens, int64_t n, bool logits_all) {
    const model_hparams& hp = m_.hp;
    check_tokens(tokens, n);
    if (logits_all && (int64_t)logits_.size() < n * hp.n_vocab) logits_.resize(n * hp.n_vocab);
    for (int64_t done = 0; done < n; done += params_.n_batch) {
        const int64_t c = std::min(params_.n_batch, n - done);
        const bool last = done + c == n;
        float* out = logits_all ? logits_.data() + done * hp.n_vocab : (last ? logits_.data() : nullptr);
        evict_before(c);
        const forward_seq seq{this, 0, c};
        forward(&seq, 1, tokens + done, logits_all, out, *fb_, *pool_);
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
    const int64_t slack = n_call > k_session_decode_max_tok ? 0 : params_.evict.chunk;
    if (cache_->n_used_max() > params_.evict.budget + slack) evict_run(*cache_, *policy_, params_.evict.budget);
}

// ---------------------------------------------------------------- forward pass

void session::forward(const forward_seq* seqs, int n_seqs, const int32_t* tokens, bool logits_all,
                      float* logits_out, forward_buffers& fb, thread_pool& pool) {
    ZK_ASSERT(n_seqs >= 1 && n_seqs <= fb.max_seqs && pool.size() <= fb.n_threads);
    const model& m = seqs[0].s->m_;
    const model_hparams& hp = m.hp;
    const int64_t E = hp.n_embd, D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;

    // rows: each sequence's tokens in turn, each at its own next position
    int64_t n = 0;
    bool compressed = false;
    for (int i = 0; i < n_seqs; i++) {
        const forward_seq& sq = seqs[i];
        ZK_ASSERT(&sq.s->m_ == &m && sq.row0 == n && sq.n >= 1 && n + sq.n <= fb.n_rows);
        ZK_ASSERT(sq.s->cache_->capacity() <= fb.cap);
        for (int64_t t = 0; t < sq.n; t++) {
            fb.pos[n + t] = (int32_t)(sq.s->n_past_ + t);
            fb.row_seq[n + t] = i;
        }
        n += sq.n;
        compressed |= sq.s->compressed_;
    }
    arch_block_embed(m, tokens, n, fb);

    float* x = fb.x.data();
    float* xn = fb.xn.data();
    for (int il = 0; il < hp.n_layer; il++) {
        for (int i = 0; i < n_seqs; i++)
            if (seqs[i].s->observer_) seqs[i].s->observer_->on_layer_input(il, seqs[i].n, x + seqs[i].row0 * E);
        // attention sub-layer
        arch_block_attn_in(m, il, n, fb, pool);
        for (int i = 0; i < n_seqs; i++) {
            const forward_seq& sq = seqs[i];
            if (sq.s->observer_)
                sq.s->observer_->on_qkv(il, sq.n, fb.pos.data() + sq.row0, fb.q.data() + sq.row0 * H * D,
                                        fb.k.data() + sq.row0 * KV * D, fb.v.data() + sq.row0 * KV * D);
        }
        if (compressed) compress_qk(seqs, il, n, fb, pool);
        // V needs no work here: W_v is folded, so a rank-r_v head keeps the first
        // r_v channels of v.
        for (int i = 0; i < n_seqs; i++) {
            const forward_seq& sq = seqs[i];
            for (int g = 0; g < KV; g++)
                sq.s->cache_->append(il, g, sq.n, fb.k.data() + (sq.row0 * KV + g) * D, KV * D,
                                     fb.v.data() + (sq.row0 * KV + g) * D, KV * D, fb.pos.data() + sq.row0);
        }
        attention(seqs, n_seqs, il, fb, pool);
        for (int i = 0; i < n_seqs; i++) {
            const forward_seq& sq = seqs[i];
            if (sq.s->observer_) sq.s->observer_->on_attn(il, sq.n, fb.attn.data() + sq.row0 * H * D);
        }
        arch_block_attn_out(m, il, n, fb, pool);
        // feed-forward sub-layer
        arch_block_ffn(m, il, n, fb, pool);
    }
    for (int i = 0; i < n_seqs; i++) seqs[i].s->n_past_ += seqs[i].n;

    if (!logits_out) return;
    // Only the rows whose logits are wanted go through the output matrix:
    // gathered, normalised, into xn [rows x n_embd].
    int64_t rows = 0;
    for (int i = 0; i < n_seqs; i++) {
        const forward_seq& sq = seqs[i];
        const int64_t first = logits_all ? 0 : sq.n - 1;
        kernel_rmsnorm(x + (sq.row0 + first) * E, m.output_norm, xn + rows * E, sq.n - first, E, hp.rms_eps);
        rows += sq.n - first;
    }
    arch_block_logits(m, xn, rows, logits_out, fb, pool);
}

// q~ = q R[:, :r_k] for every query head and k~ = k R[:, :r_k] for every KV
// head, in place, with the projection of the row's own sequence: head h's first
// r_k channels of q/k become the projection (the rest is left unused; with
// exact sinks all head_dim channels are rotated, q R and k R). Layout stays
// [n x heads x head_dim]. Rows of uncompressed sequences are left as they are.
void session::compress_qk(const forward_seq* seqs, int il, int64_t n, forward_buffers& fb, thread_pool& pool) {
    const model_hparams& hp = seqs[0].s->m_.hp;
    const int D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    auto body = [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; task++) {
            const int64_t t = task / KV;
            const int g = (int)(task % KV);
            const session& s = *seqs[fb.row_seq[t]].s;
            if (!s.compressed_) continue;
            const float* Pq = s.proj_q_[(size_t)il * KV + g].data();
            const float* Pk = s.proj_k_[(size_t)il * KV + g].data();
            // the cache keeps r_k channels; exact sinks need all of them, of
            // every query and of their own keys
            const int r_k = s.cache_->block(il, g).r_k, sinks = s.cache_->params().sinks;
            const int rq = sinks > 0 ? D : r_k;
            kernel_project_head(Pk, fb.pos[t] < sinks ? D : r_k, D, fb.k.data() + (t * KV + g) * D);
            for (int j = 0; j < G; j++) kernel_project_head(Pq, rq, D, fb.q.data() + (t * H + g * G + j) * D);
        }
    };
    // the closure holds one reference, so std::function stores it without allocating
    pool.parallel_for(n * KV, 1, [&body](int64_t b, int64_t e, int ith) { body(b, e, ith); });
}

// Attention of every row against its own sequence's cache. A decode segment
// (<= k_session_decode_max_tok tokens) gets (head, slot range) tasks, merged
// per head afterwards (flash-decoding); a prefill segment gets a task per
// (head, token). All tasks of the pass share one longest-first schedule.
bool session::attention_prefill(const forward_seq& sq, int il, forward_buffers& fb, thread_pool& pool) {
    const session& s = *sq.s;
    const model_hparams& hp = s.m_.hp;
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    if (sq.n <= k_session_decode_max_tok || s.policy_->needs_attention() || !s.params_.prefill_tiled) return false;
    // the tiled kernel masks causally only: a local layer whose window has
    // moved on takes the per-token tasks, which start at the window
    if (hp.layer_is_swa(il) && s.n_past_ + sq.n > hp.n_swa) return false;
    const int64_t kb = kernel_prefill_key_block();
    int64_t kt_size = 0, nblk = 0;  // per head: floats of the transposed keys, key blocks
    for (int g = 0; g < KV; g++) {
        const attn_kv_view kv = s.cache_->view(il, (int)g);
        if (!kernel_prefill_supported(kv)) return false;
        kt_size = std::max(kt_size, kernel_prefill_keys_size(kv.n_slots, kv.r_k));
        nblk = std::max(nblk, (kv.n_slots + kb - 1) / kb);
    }
    if ((int64_t)fb.prefill_kt.size() < KV * kt_size) fb.prefill_kt.resize((size_t)(KV * kt_size));
    // Compressed heads write only their first r_v channels; W_o's folded rows
    // for the rest must see zeros.
    if (s.compressed_) std::memset(fb.attn.data() + sq.row0 * H * D, 0, sizeof(float) * sq.n * H * D);
    // every query block of the chunk reads the same keys: transpose them once
    pool.parallel_for(KV * nblk, 4, [&](int64_t b, int64_t e, int) {
        for (int64_t i = b; i < e; i++) {
            const attn_kv_view kv = s.cache_->view(il, (int)(i / nblk));
            const int64_t blk = i % nblk;
            if (blk * kb < kv.n_slots)
                kernel_prefill_keys(kv, blk, blk + 1, fb.prefill_kt.data() + (i / nblk) * kt_size);
        }
    });
    // tasks: (KV head, block of prefill_tokens tokens), longest first
    const int64_t nt = fb.prefill_tokens;
    fb.tasks.clear();
    for (int g = 0; g < KV; g++) {
        const kv_block& b = s.cache_->block(il, g);
        for (int64_t t0 = 0; t0 < sq.n; t0 += nt) {
            const int64_t last = std::min(sq.n, t0 + nt) - 1;
            fb.tasks.push_back({std::min(b.n_used, s.n_past_ + last + 1) * (b.r_k + b.r_v), 0, g, t0, 0});
        }
    }
    std::sort(fb.tasks.begin(), fb.tasks.end(), [](const attn_task& a, const attn_task& b) {
        if (a.cost != b.cost) return a.cost > b.cost;
        return a.g != b.g ? a.g < b.g : a.c < b.c;
    });
    const float scale = hp.score_scale();
    auto run = [&](int64_t i, int ith) {
        const attn_task& tk = fb.tasks[i];
        const attn_kv_view kv = s.cache_->view(il, tk.g);
        const int64_t t0 = tk.c, n = std::min(nt, sq.n - t0);
        const attn_q_view q{fb.q.data() + (sq.row0 + t0) * H * D + tk.g * G * D, H * D, D, (int)G, n,
                            fb.pos.data() + sq.row0 + t0, scale};
        kernel_attention_prefill(kv, fb.prefill_kt.data() + tk.g * kt_size, q,
                                 fb.attn.data() + (sq.row0 + t0) * H * D + tk.g * G * D, H * D, D,
                                 fb.prefill_scratch.data() + ith * fb.prefill_scratch_stride);
    };
    pool.parallel_for((int64_t)fb.tasks.size(), 1, [&run](int64_t b, int64_t e, int ith) {
        for (int64_t i = b; i < e; i++) run(i, ith);
    });
    return true;
}

void session::attention(const forward_seq* seqs, int n_seqs, int il, forward_buffers& fb, thread_pool& pool) {
    if (n_seqs == 1 && attention_prefill(seqs[0], il, fb, pool)) return;
    const model_hparams& hp = seqs[0].s->m_.hp;
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    const float scale = hp.score_scale();  // of the original head dim, also when compressed
    const int64_t n_swa = hp.layer_is_swa(il) ? hp.n_swa : 0;
    // Decode segments share one slot range per task, which the window's start
    // must not cut inside: several tokens whose windows differ go per token.
    auto is_decode = [n_swa](const forward_seq& sq) {
        return sq.n <= k_session_decode_max_tok && !(n_swa > 0 && sq.n > 1 && sq.s->n_past_ + sq.n > n_swa);
    };
    const int nth = pool.size();
    const int64_t score_stride = (int64_t)fb.score.size() / fb.n_threads;

    int n_decode = 0;
    for (int i = 0; i < n_seqs; i++) n_decode += is_decode(seqs[i]);
    // The per-thread observation sums of a prefill segment serve one sequence.
    ZK_ASSERT(n_decode == n_seqs || n_seqs == 1);

    // tasks, and where their partials go
    fb.tasks.clear();
    int64_t part = 0;
    for (int i = 0; i < n_seqs; i++) {
        const forward_seq& sq = seqs[i];
        const session& s = *sq.s;
        const kv_cache& cache = *s.cache_;
        auto cost = [&](int g, int64_t slots) {
            const kv_block& b = cache.block(il, g);
            return slots * (b.r_k + b.r_v);
        };
        fb.seg_part[i] = part;
        // Compressed heads write only their first r_v channels; W_o's folded rows
        // for the rest must see zeros.
        if (s.compressed_) std::memset(fb.attn.data() + sq.row0 * H * D, 0, sizeof(float) * sq.n * H * D);
        if (is_decode(sq)) {
            // Slot ranges per head as for this sequence decoded alone on its own
            // threads (enough that each has work on the KV heads). Not fewer in a
            // batch, though the batch has more heads to share out: the split
            // decides the merge's rounding, and on this engine (8-bit
            // activations) a 1e-7 change grows into different greedy tokens. So
            // a batched row is the same arithmetic as its sequence alone
            // (tests/test_batch.cpp).
            const int64_t nt = s.params_.n_threads;
            int64_t nc = std::min<int64_t>((cache.n_used_max() + k_min_range - 1) / k_min_range,
                                           (2 * nt + KV - 1) / KV);
            nc = std::max<int64_t>(1, std::min(nc, fb.max_chunks));
            fb.seg_nc[i] = nc;
            for (int g = 0; g < KV; g++)
                for (int64_t c = 0; c < nc; c++) {
                    fb.tasks.push_back({cost(g, cache.block(il, g).n_used / nc), i, g, c, part});
                    part += sq.n * G * (2 + D);
                }
        } else {
            fb.seg_nc[i] = 0;
            for (int g = 0; g < KV; g++)
                for (int64_t t = 0; t < sq.n; t++) {
                    fb.tasks.push_back({cost(g, std::min(cache.block(il, g).n_used, s.n_past_ + t + 1)), i, g, t, part});
                    part += G * (2 + D);
                }
        }
    }
    ZK_ASSERT(part <= (int64_t)fb.part.size());
    // Heads differ in rank (and, evicted, in slots): hand the tasks out longest first.
    std::sort(fb.tasks.begin(), fb.tasks.end(), [](const attn_task& a, const attn_task& b) {
        if (a.cost != b.cost) return a.cost > b.cost;
        return a.part < b.part;  // creation order
    });

    auto run_task = [&](const attn_task& tk, int ith) {
        const forward_seq& sq = seqs[tk.seq];
        session& s = *sq.s;
        const attn_kv_view kv = s.cache_->view(il, tk.g);
        const bool observe = s.policy_->needs_attention();
        const float* q_seg = fb.q.data() + sq.row0 * H * D + tk.g * G * D;
        const int32_t* pos_seg = fb.pos.data() + sq.row0;
        float* pb = fb.part.data() + tk.part;
        float* scratch = fb.score.data() + ith * score_stride;
        const int64_t nc = fb.seg_nc[tk.seq];
        if (nc > 0) {
            const int64_t n = sq.n, cap = s.cache_->capacity();
            attn_partial p{pb, pb + n * G, pb + 2 * n * G};
            if (observe) {
                p.logits = s.logits_buf_.data() + tk.g * n * G * cap;
                p.logits_stride = cap;
            }
            // (one token, or tokens whose windows all start at slot 0)
            const int64_t lo = window_first_slot(kv, n_swa, pos_seg[0]);
            const int64_t s0 = lo + (kv.n_slots - lo) * tk.c / nc, s1 = lo + (kv.n_slots - lo) * (tk.c + 1) / nc;
            const attn_q_view q{q_seg, H * D, D, (int)G, n, pos_seg, scale};
            kernel_attention_range(kv, s0, s1, q, p, scratch);
            return;
        }
        // prefill token t sees the slots up to its position (slot index <=
        // position, also after eviction): stop the range there
        const int64_t t = tk.c;
        attn_partial p{pb, pb + G, pb + 2 * G};
        float* lg = observe ? fb.thread_logits.data() + (size_t)ith * G * fb.cap : nullptr;
        p.logits = lg;
        p.logits_stride = fb.cap;
        const attn_q_view q{q_seg + t * H * D, H * D, D, (int)G, 1, pos_seg + t, scale};
        const int64_t s1 = std::min(kv.n_slots, s.n_past_ + t + 1);
        const int64_t lo = std::min(window_first_slot(kv, n_swa, pos_seg[t]), s1);
        if (lg && lo > 0) window_mask_logits(lg, fb.cap, G, lo);
        kernel_attention_range(kv, lo, s1, q, p, scratch);
        attn_partial parts[2] = {p, p};
        int n_parts = 1;
        const attn_kv_view kvs = window_sinks(kv, lo);
        if (kvs.n_sink_slots > 0) {
            float* sb = fb.sink_part.data() + (size_t)ith * fb.sink_part_stride;
            parts[n_parts++] = attn_partial{sb, sb + G, sb + 2 * G, lg ? lg + (kvs.pos - kv.pos) : nullptr, fb.cap,
                                            kv.sink_dim};
            kernel_attention_sinks(kvs, q, parts[1]);
        }
        kernel_attention_merge(parts, n_parts, 1, (int)G, kv.r_v,
                               fb.attn.data() + (sq.row0 + t) * H * D + tk.g * G * D, H * D, D);
        if (observe) {
            const evict_observation o{il, tk.g, pos_seg[t], t, sq.n, s.params_.n_ctx, kv.pos};
            float* acc = fb.thread_scores.data() + ((size_t)ith * KV + tk.g) * fb.cap;
            for (int64_t j = 0; j < G; j++) s.policy_->observe(o, lg + j * fb.cap, s1, acc);
        }
    };
    pool.parallel_for((int64_t)fb.tasks.size(), 1, [&run_task, &fb](int64_t b, int64_t e, int ith) {
        for (int64_t i = b; i < e; i++) run_task(fb.tasks[i], ith);
    });

    // decode segments: merge each head's ranges, then show the policy the logits
    bool observe_decode = false;
    for (int i = 0; i < n_seqs; i++) {
        const forward_seq& sq = seqs[i];
        const int64_t nc = fb.seg_nc[i];
        if (nc == 0) continue;
        observe_decode |= sq.s->policy_->needs_attention();
        const int64_t per_task = sq.n * G * (2 + D);
        session& s = *sq.s;
        for (int g = 0; g < KV; g++) {
            attn_partial parts[65];
            for (int64_t c = 0; c < nc; c++) {
                float* pb = fb.part.data() + fb.seg_part[i] + (g * nc + c) * per_task;
                parts[c] = attn_partial{pb, pb + sq.n * G, pb + 2 * sq.n * G};
            }
            int n_parts = (int)nc;
            const attn_kv_view kv = s.cache_->view(il, g);
            // a window that has moved on (one token: see run_task) hides the
            // slots below lo, exact sinks included
            const int64_t lo = window_first_slot(kv, n_swa, fb.pos[sq.row0]);
            const int64_t cap = s.cache_->capacity();
            if (lo > 0 && s.policy_->needs_attention())
                window_mask_logits(s.logits_buf_.data() + g * sq.n * G * cap, cap, sq.n * G, lo);
            const attn_kv_view kvs = window_sinks(kv, lo);
            if (kvs.n_sink_slots > 0) {
                // a few rows per head: serial, on the sink buffer of thread 0
                float* sb = fb.sink_part.data();
                const int64_t n = sq.n;
                attn_partial p{sb, sb + n * G, sb + 2 * n * G, nullptr, 0, kv.sink_dim};
                if (s.policy_->needs_attention()) {
                    p.logits = s.logits_buf_.data() + g * n * G * cap + (kvs.pos - kv.pos);
                    p.logits_stride = cap;
                }
                const attn_q_view q{fb.q.data() + sq.row0 * H * D + g * G * D, H * D, D, (int)G, n,
                                    fb.pos.data() + sq.row0, scale};
                kernel_attention_sinks(kvs, q, p);
                parts[n_parts++] = p;
            }
            kernel_attention_merge(parts, n_parts, sq.n, (int)G, kv.r_v, fb.attn.data() + sq.row0 * H * D + g * G * D,
                                   H * D, D);
        }
    }
    if (observe_decode) {
        auto observe_head = [&](int64_t b, int64_t e, int) {
            for (int64_t task = b; task < e; task++) {
                const forward_seq& sq = seqs[task / KV];
                session& s = *sq.s;
                const int g = (int)(task % KV);
                if (fb.seg_nc[task / KV] == 0 || !s.policy_->needs_attention()) continue;
                kv_block& blk = s.cache_->block(il, g);
                const int64_t n = sq.n, cap = s.cache_->capacity();
                for (int64_t t = 0; t < n; t++) {
                    const evict_observation o{il, g, fb.pos[sq.row0 + t], t, n, s.params_.n_ctx, blk.pos.data()};
                    for (int64_t j = 0; j < G; j++)
                        s.policy_->observe(o, s.logits_buf_.data() + ((g * n + t) * G + j) * cap, blk.n_used,
                                           blk.score.data());
                }
            }
        };
        pool.parallel_for(n_seqs * KV, 1, [&observe_head](int64_t b, int64_t e, int ith) { observe_head(b, e, ith); });
    }
    if (n_decode == 0 && seqs[0].s->policy_->needs_attention()) {
        // prefill: per-thread sums into the blocks' scores, in thread order
        session& s = *seqs[0].s;
        auto add_scores = [&](int64_t b, int64_t e, int) {
            for (int64_t g = b; g < e; g++) {
                kv_block& blk = s.cache_->block(il, (int)g);
                for (int i = 0; i < nth; i++) {
                    float* acc = fb.thread_scores.data() + ((size_t)i * KV + g) * fb.cap;
                    for (int64_t sl = 0; sl < blk.n_used; sl++) blk.score[sl] += acc[sl], acc[sl] = 0;
                }
            }
        };
        pool.parallel_for(KV, 1, [&add_scores](int64_t b, int64_t e, int ith) { add_scores(b, e, ith); });
    }
}

}  // namespace zk
