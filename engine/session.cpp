#include "engine/session.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <set>
#include <string>

#include "engine/arch_block.h"
#include "ggml-like/error.h"

namespace zk {

void session_validate_params(const session_params& p, const model_hparams& hp) {
    if (p.n_ctx <= 0) ZK_THROW("context size must be positive, got %lld", (long long)p.n_ctx);
    if (p.n_ctx > (1 << 20)) ZK_THROW("context size %lld is too large (max 1048576)", (long long)p.n_ctx);
    if (p.n_threads <= 0 || p.n_threads > 512)
        ZK_THROW("thread count must be between 1 and 512, got %d", p.n_threads);
    if (p.n_batch <= 0) ZK_THROW("batch size must be positive, got %lld", (long long)p.n_batch);
    if (p.kv.scores || p.kv.evicting || p.kv.sinks != 0 || p.kv.sink_dim != 0)
        ZK_THROW_PARAM("kv", "session_params::kv: its sinks, sink_dim, scores and evicting fields are the "
                             "session's to set (from evict and the model); leave them at their defaults");
    kv_cache_validate_params(p.kv, hp.n_layer, hp.n_head_kv);
    evict_validate_params(p.evict, p.n_ctx);
}

namespace {

// Prints `line` on stderr the first time `key` is seen in this process: bench
// and eval make a session per configuration, and one notice is enough.
void say_once(const std::string& key, const std::string& line) {
    static std::mutex mu;
    static std::set<std::string> said;
    std::lock_guard<std::mutex> lock(mu);
    if (said.insert(key).second) std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

std::vector<std::string> session_key8_hazards(const zack_info& z, const kv_cache_params& kv,
                                              const std::vector<int>& kbasis, int n_layer, int n_head_kv) {
    std::vector<std::string> out;
    const size_t nh = (size_t)n_layer * n_head_kv, np = z.sens_qbits.size();
    auto at = [&](int bits) {
        for (size_t i = 0; i < np; i++)
            if (z.sens_qbits[i] == bits) return (int)i;
        return -1;
    };
    const int i8 = at(8), i4 = at(4), i16 = at(16);
    if (i8 < 0 || i16 < 0 || z.sens_q.size() != np * np * nh) return out;
    for (size_t h = 0; h < nh; h++) {
        if (kv_cache_bits(kv, KV_ROLE_KEYS, h) != 8 || (!kbasis.empty() && kbasis[h] != 0)) continue;
        const float l8 = z.sens_q[((size_t)i8 * np + i16) * nh + h];
        if (!(l8 > 1.0f)) continue;
        const float l4 = i4 < 0 ? NAN : z.sens_q[((size_t)i4 * np + i16) * nh + h];
        char b[160];
        std::snprintf(b, sizeof b, "layer %zu, KV head %zu: loss %.3g at 8 bits, %.3g at 4", h / n_head_kv,
                      h % n_head_kv, l8, l4);
        out.push_back(b);
    }
    return out;
}

bool session_key_widths_unequal(const kv_cache_params& kv, size_t h) {
    const int bits = kv_cache_bits(kv, KV_ROLE_KEYS, h);
    return (bits == 4 || bits == 2) && (kv_cache_key_tail(kv, h) > 0 || kv_cache_key_zero(kv, h) > 0 ||
                                        (bits == 4 && kv_cache_key_mid(kv, h) > 0));
}

session::session(const model& m, const session_params& p) : m_(m), params_(p) {
    const model_hparams& hp = m.hp;
    session_validate_params(p, hp);
    params_.n_batch = std::min(p.n_batch, p.n_ctx);
    be_ = device_create(params_.device);
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
                // A full-rank pca key row whose KIVI codes have 2-bit channels
                // (in 4-bit keys), a 1-bit tail or 0-bit channels is coded in the
                // .zack's quantization pair where it has one (calib/keybasis.h
                // keybasis_quant_pair: its directions already in their order),
                // else takes the pca directions in the .zack's quantization
                // order: which ones get the narrow codes. The sensitivity pass
                // measured such rows the same way.
                const bool unequal = b == 0 && rk[h] == D && session_key_widths_unequal(p.kv, h);
                if (unequal && zl.kwa) A = zl.kwa, B = zl.kwb;
                const int32_t* order =
                    unequal && !zl.kwa && !zl.korder.empty() ? zl.korder.data() + (size_t)g * D : nullptr;
                // all D rows: exact sinks need the whole projected q and k
                for (int side = 0; side < 2; side++) {
                    const float* R = (side ? B : A) + (size_t)g * D * D;
                    std::vector<float>& P = (side ? proj_k_ : proj_q_)[h];
                    P.resize((size_t)D * D);
                    for (int j = 0; j < D; j++) {
                        const int dj = order ? (int)order[j] : j;
                        for (int i = 0; i < D; i++) P[(size_t)j * D + i] = R[(size_t)i * D + dj];
                    }
                }
                if (zl.kmean) {
                    if (shift_k_.empty()) shift_k_.resize(nh);
                    const float* mu = zl.kmean + (size_t)g * D;
                    const std::vector<float>& P = proj_k_[h];
                    shift_k_[h].resize((size_t)D);
                    for (int j = 0; j < D; j++) {
                        double s = 0;
                        for (int i = 0; i < D; i++) s += (double)P[(size_t)j * D + i] * mu[i];
                        shift_k_[h][(size_t)j] = (float)s;
                    }
                }
            }
        const std::vector<std::string> bad = session_key8_hazards(m.zack, p.kv, p.kbasis, hp.n_layer, hp.n_head_kv);
        if (!bad.empty())
            say_once("key8 " + m.file->path(),
                     "zack: warning: 8-bit keys in the ZACK basis wreck " + std::to_string(bad.size()) + " head" +
                         (bad.size() > 1 ? "s" : "") + " of this model, as calibration measured (" + bad[0] +
                         (bad.size() > 1 ? "; ..." : "") +
                         "); 4- or 2-bit keys (--kv-bits 4, or a --kv-plan) keep them");
    }
    // KV cache: with eviction it only needs room for the budget plus one chunk
    // of new tokens (decode chunk or prefill batch), while positions still run
    // up to n_ctx.
    policy_ = evict_policy_create(p.evict, p.n_ctx);
    kv_cache_params kp = p.kv;
    for (int code = 0; code < KV_VQ_CODES; code++) {  // the model's value codebooks
        if (!kv_cache_vq(kp, code) || kp.vq[code]) continue;
        if (m.zack.vq[code].heads.empty())
            ZK_THROW("%s: vector-coded values at a plan's value precision %d need the codebooks of a .zack made by "
                     "this version's zack calibrate; this file has none", m.file->path().c_str(), code);
        kp.vq[code] = &m.zack.vq[code];
    }
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
    // Sliding-window layers hold their window, the group a KIVI block keeps
    // whole at its edge, and one chunk of new tokens (window_drop).
    std::vector<int64_t> layer_cap;
    if (hp.n_swa > 0 && p.window_cache) {
        const int64_t chunk = std::max(params_.n_batch, evicting_ ? p.evict.chunk : int64_t(1));
        // a KIVI block also keeps its residual window (window_drop never cuts into it)
        const int64_t kivi = kv_cache_windowed(kp) ? kp.group + kv_cache_residual(kp, capacity) : 0;
        const int64_t swa_cap = hp.n_swa + kivi + chunk;
        if (swa_cap < capacity) {
            layer_cap.assign(hp.n_layer, 0);
            for (int il = 0; il < hp.n_layer; il++)
                if (hp.layer_is_swa(il)) layer_cap[il] = swa_cap;
            windowed_layers_ = true;
        }
    }
    cache_ = std::make_unique<kv_cache>(hp.n_layer, hp.n_head_kv, capacity, kp, rk, rv, layer_cap);
    if (windowed_layers_) keep_.resize((size_t)cache_->capacity());
    const int64_t cap = cache_->capacity();
    try {
        be_->cache_check(kp);
        fb_ = be_->buffers_create(hp, params_.n_batch, 1, p.n_threads, cap, kp.gear ? kp.gear_rank : 0,
                                  policy_->needs_attention());
    } catch (const zk::error& e) {
        if (be_->device() == backend_device::CPU || p.device_fallback == session_params::fallback::THROW) throw;
        fall_back(e.what());
        be_ = device_create(backend_device::CPU);
        fb_ = be_->buffers_create(hp, params_.n_batch, 1, p.n_threads, cap, kp.gear ? kp.gear_rank : 0,
                                  policy_->needs_attention());
    }
    fb_->reserve_select(kv_select_sizes_max(*cache_, hp.n_group()));
    logits_.resize(hp.n_vocab);
    if (policy_->needs_attention())
        logits_buf_.resize((size_t)hp.n_head_kv * k_session_decode_max_tok * hp.n_group() * cap);
}

session::~session() = default;

std::unique_ptr<backend> session::device_create(backend_device d) {
    if (d != backend_device::CPU && params_.device_fallback != session_params::fallback::THROW) {
        try {
            backend_check_device(d);
        } catch (const zk::error& e) {
            fall_back(e.what());
            d = backend_device::CPU;
        }
    }
    params_.device = d;
    return backend_create(backend_params{d, params_.n_threads});
}

void session::fall_back(const char* why) {
    if (params_.device_fallback == session_params::fallback::CPU_NOTICE) {
        std::string w = why;  // the refusal's advice ("; use device cpu") is what happens now
        w = w.substr(0, w.find("; use "));
        say_once("device " + w, "zack: " + w + "; running on the CPU");
    }
    params_.device = backend_device::CPU;
}

void session::set_observer(session_observer* obs) {
    if (obs && be_->device() != backend_device::CPU)
        ZK_THROW("device %s: observing a forward pass (calibration statistics) needs activations in host memory; "
                 "use device cpu", backend_device_name(be_->device()));
    observer_ = obs;
}

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
    return decode_rows(tokens, n, logits_all, 0, nullptr);
}

const float* session::decode_from(int first_layer, const float* x, const int32_t* tokens, int64_t n,
                                  bool logits_all) {
    if (first_layer < 0 || first_layer >= m_.hp.n_layer)
        ZK_THROW("decode_from: layer %d is outside 0..%d", first_layer, m_.hp.n_layer - 1);
    if (be_->device() != backend_device::CPU)
        ZK_THROW("device %s: decoding from a layer's inputs needs activations in host memory; use device cpu",
                 backend_device_name(be_->device()));
    return decode_rows(tokens, n, logits_all, first_layer, x);
}

const float* session::decode_rows(const int32_t* tokens, int64_t n, bool logits_all, int first_layer,
                                  const float* x) {
    const model_hparams& hp = m_.hp;
    check_tokens(tokens, n);
    if (logits_all && (int64_t)logits_.size() < n * hp.n_vocab) logits_.resize(n * hp.n_vocab);
    for (int64_t done = 0; done < n; done += params_.n_batch) {
        const int64_t c = std::min(params_.n_batch, n - done);
        const bool last = done + c == n;
        float* out = logits_all ? logits_.data() + done * hp.n_vocab : (last ? logits_.data() : nullptr);
        evict_before(c);
        const forward_seq seq{this, 0, c};
        forward(&seq, 1, tokens + done, logits_all, out, *fb_, *be_, first_layer, x ? x + done * hp.n_embd : nullptr);
    }
    evict_after(n);
    return logits_.data();
}

// A sliding-window layer's block that `incoming` tokens would overflow drops
// the slots no query of theirs can see (positions up to n_past - n_swa); a
// KIVI block keeps the group holding its first visible slot whole, so its
// groups stay full and nothing is re-quantized. The attention of what is kept
// is the same arithmetic as with every token kept (tests/test_window_cache.cpp).
void session::window_drop(int64_t incoming) {
    const model_hparams& hp = m_.hp;
    const int32_t first = (int32_t)(n_past_ - hp.n_swa + 1);  // the first position the chunk sees
    for (int il = 0; il < hp.n_layer; il++) {
        if (!hp.layer_is_swa(il)) continue;
        for (int g = 0; g < hp.n_head_kv; g++) {
            const kv_block& b = cache_->block(il, g);
            if (b.n_used + incoming <= b.capacity) continue;
            // slots ascend by position
            int64_t k0 = std::lower_bound(b.pos, b.pos + b.n_used, first) - b.pos;
            if (b.windowed) {
                // whole groups only, and never the residual window: the groups
                // are quantized when they would have been with every token kept
                k0 = std::min(k0, b.n_quant);
                const auto starts_end = b.group_start.begin() + b.n_groups + 1;
                if (k0 < b.n_quant) k0 = *(std::upper_bound(b.group_start.begin(), starts_end, (int32_t)k0) - 1);
            }
            if (k0 == 0) continue;
            std::fill(keep_.begin(), keep_.begin() + k0, (uint8_t)0);
            std::fill(keep_.begin() + k0, keep_.begin() + b.n_used, (uint8_t)1);
            cache_->compact(il, g, keep_.data());
        }
    }
}

void session::evict_before(int64_t incoming) {
    if (windowed_layers_) window_drop(incoming);
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

backend_seq session::view(int64_t row0, int64_t n) {
    backend_seq v;
    v.cache = cache_.get();
    v.policy = policy_.get();
    v.logits_buf = logits_buf_.empty() ? nullptr : logits_buf_.data();
    if (compressed_) v.proj_q = &proj_q_, v.proj_k = &proj_k_;
    if (!shift_k_.empty()) v.k_shift = &shift_k_;
    v.row0 = row0;
    v.n = n;
    v.n_past = n_past_;
    v.n_ctx = params_.n_ctx;
    v.n_threads = params_.n_threads;
    v.prefill_tiled = params_.prefill_tiled;
    v.prefill_hold = params_.prefill_hold;
    return v;
}

void session::forward(const forward_seq* seqs, int n_seqs, const int32_t* tokens, bool logits_all,
                      float* logits_out, forward_buffers& fb, backend& be, int first_layer, const float* x_in) {
    ZK_ASSERT(n_seqs >= 1 && n_seqs <= fb.max_seqs && be.host_pool().size() <= fb.n_threads);
    const model& m = seqs[0].s->m_;
    const model_hparams& hp = m.hp;
    const int64_t E = hp.n_embd, D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;

    // rows: each sequence's tokens in turn, each at its own next position
    int64_t n = 0;
    bool compressed = false;
    backend_seq* bs = fb.seqs.data();
    for (int i = 0; i < n_seqs; i++) {
        const forward_seq& sq = seqs[i];
        ZK_ASSERT(&sq.s->m_ == &m && sq.row0 == n && sq.n >= 1 && n + sq.n <= fb.n_rows);
        ZK_ASSERT(sq.s->cache_->capacity() <= fb.cap);
        for (int64_t t = 0; t < sq.n; t++) {
            fb.pos[n + t] = (int32_t)(sq.s->n_past_ + t);
            fb.row_seq[n + t] = i;
        }
        bs[i] = sq.s->view(sq.row0, sq.n);
        n += sq.n;
        compressed |= sq.s->compressed_;
    }
    arch_block_embed(m, tokens, n, fb, be);  // also the RoPE tables
    if (x_in) std::copy(x_in, x_in + n * E, fb.x.data());  // host buffers (decode_from)

    float* x = fb.x.data();
    float* xn = fb.xn.data();
    for (int il = first_layer; il < hp.n_layer; il++) {
        for (int i = 0; i < n_seqs; i++)
            if (seqs[i].s->observer_) seqs[i].s->observer_->on_layer_input(il, seqs[i].n, x + seqs[i].row0 * E);
        // attention sub-layer
        arch_block_attn_in(m, il, n, fb, be);
        for (int i = 0; i < n_seqs; i++) {
            const forward_seq& sq = seqs[i];
            if (sq.s->observer_)
                sq.s->observer_->on_qkv(il, sq.n, fb.pos.data() + sq.row0, fb.q.data() + sq.row0 * H * D,
                                        fb.k.data() + sq.row0 * KV * D, fb.v.data() + sq.row0 * KV * D);
        }
        if (compressed) be.project_qk(bs, n_seqs, hp, il, fb);
        be.kv_append(bs, n_seqs, hp, il, fb);
        be.attention(bs, n_seqs, hp, il, fb);
        for (int i = 0; i < n_seqs; i++) {
            const forward_seq& sq = seqs[i];
            if (sq.s->observer_) sq.s->observer_->on_attn(il, sq.n, fb.attn.data() + sq.row0 * H * D);
        }
        arch_block_attn_out(m, il, n, fb, be);
        // feed-forward sub-layer
        arch_block_ffn(m, il, n, fb, be);
    }
    for (int i = 0; i < n_seqs; i++) seqs[i].s->n_past_ += seqs[i].n;

    if (!logits_out) {
        be.pass_end(bs, n_seqs, hp, fb);
        return;
    }
    // Only the rows whose logits are wanted go through the output matrix:
    // gathered, normalised, into xn [rows x n_embd].
    int64_t rows = 0;
    for (int i = 0; i < n_seqs; i++) {
        const forward_seq& sq = seqs[i];
        const int64_t first = logits_all ? 0 : sq.n - 1;
        be.rmsnorm(x + (sq.row0 + first) * E, m.output_norm, xn + rows * E, sq.n - first, E, hp.rms_eps);
        rows += sq.n - first;
    }
    arch_block_logits(m, xn, rows, logits_out, fb, be);
    be.pass_end(bs, n_seqs, hp, fb);
}

}  // namespace zk
