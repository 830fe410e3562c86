// Mutable run state for one sequence on a model: the KV cache, activation
// buffers sized once for a batch of tokens, and the thread pool. decode() runs
// the decoder over new tokens and returns their logits.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/evict/evict.h"
#include "engine/kv_cache.h"
#include "engine/model.h"
#include "ggml-like/threadpool.h"
#include "kernels/matmul.h"

namespace zk {

// Sees the per-layer Q, K, V activations of every forward pass (calibration
// statistics). Arrays are after RoPE and before any compression:
// q [n x n_head x head_dim], k and v [n x n_head_kv x head_dim].
struct session_observer {
    virtual ~session_observer() = default;
    virtual void on_qkv(int layer, int64_t n, const int32_t* pos, const float* q, const float* k,
                        const float* v) = 0;
    // The attention output that feeds W_o, [n x n_head x head_dim].
    virtual void on_attn(int layer, int64_t n, const float* attn) {}
};

struct session_params {
    int64_t n_ctx = 4096;     // tokens the cache can hold
    int n_threads = 2;
    int64_t n_batch = 256;    // tokens per forward chunk during prefill
    dtype kv_type = dtype::F16;
    // Compressed attention (a .zack model): K and V ranks per (layer, KV head),
    // [n_layer x n_head_kv] row-major. Empty = full head dim (no compression).
    std::vector<int> ranks_k;
    std::vector<int> ranks_v;
    // KV cache precision (engine/kv_cache.h): 16 = kv_type rows, 8 or 4-bit.
    int kv_bits = 16;
    int kv_group = 32;            // 4-bit: tokens per key group
    int kv_residual = 0;          // 4-bit: full-precision window (0 = kv_group)
    bool kv_gear = false;         // 4-bit: GEAR error correction
    int kv_gear_rank = 2;
    float kv_gear_outliers = 0.02f;
    // Token eviction (engine/evict/evict.h); policy "none" keeps every token.
    evict_params evict;
};

void session_validate_params(const session_params& p, const model_hparams& hp);
// The KV cache parameters session_params describe.
kv_cache_params session_kv_params(const session_params& p);

class session {
public:
    session(const model& m, const session_params& p);
    ~session();

    // Runs tokens at positions n_past() .. n_past() + n - 1 and appends them to the
    // cache. Returns the logits of the last token [n_vocab], or with logits_all
    // those of every token [n x n_vocab]. Throws if the context would overflow.
    const float* decode(const int32_t* tokens, int64_t n, bool logits_all = false);

    int64_t n_past() const { return n_past_; }
    int64_t n_ctx() const { return params_.n_ctx; }
    void reset();
    // Not owned; nullptr detaches. Called from the thread that runs decode().
    void set_observer(session_observer* obs) { observer_ = obs; }
    const kv_cache& cache() const { return *cache_; }
    const model& mdl() const { return m_; }
    thread_pool& pool() { return *pool_; }

private:
    void forward_chunk(const int32_t* tokens, int64_t n, bool logits_all, float* logits_out);
    void compress_qk(int il, int64_t n);
    void attention(int il, int64_t n);
    // Evicts down to the budget when the policy says so: before a chunk of
    // `incoming` tokens that would not fit, or after a decode() call.
    void evict_before(int64_t incoming);
    void evict_after(int64_t n_call);

    const model& m_;
    session_params params_;
    std::unique_ptr<thread_pool> pool_;
    std::unique_ptr<kv_cache> cache_;
    matmul_scratch mm_scratch_;
    int64_t n_past_ = 0;
    session_observer* observer_ = nullptr;

    // Activations for a chunk of up to B = n_batch tokens.
    std::vector<float> x_;        // [B x n_embd] residual stream
    std::vector<float> xn_;       // [B x n_embd] normalised input of a sub-layer
    std::vector<float> q_;        // [B x n_head x head_dim]
    std::vector<float> k_;        // [B x n_head_kv x head_dim]
    std::vector<float> v_;        // [B x n_head_kv x head_dim]
    // Compressed heads: per (layer, KV head) the projection R[:, :r_k] stored
    // transposed, [r_k x head_dim], so each output channel is one contiguous dot.
    bool compressed_ = false;
    std::vector<std::vector<float>> proj_;  // [n_layer * n_head_kv]
    std::vector<float> attn_;     // [B x n_head x head_dim] attention output
    std::vector<float> tmp_;      // [B x n_embd] projection output
    std::vector<float> gate_;     // [B x n_ff]
    std::vector<float> up_;       // [B x n_ff]
    std::vector<float> rope_cs_;  // [B x rope_dims/2 x 2]
    std::vector<int32_t> pos_;    // [B]
    std::vector<float> logits_;   // [n_vocab] or [n x n_vocab]
    // Attention partials: [n_tasks x (2 + r_v) x B x group], and per-thread score scratch.
    std::vector<float> part_buf_;
    std::vector<float> score_buf_;
    int64_t max_chunks_ = 0;
    // Eviction: the policy; attention logits shown to it, decode [n_head_kv x
    // k_decode_max_tok x group x capacity] and prefill per thread [group x
    // capacity]; per-thread prefill score sums [n_threads x n_head_kv x capacity].
    std::unique_ptr<evict_policy> policy_;
    bool evicting_ = false;
    std::vector<float> logits_buf_;
    std::vector<float> thread_logits_;
    std::vector<float> thread_scores_;
    // Attention tasks ordered longest first (cost ~ slots x (r_k + r_v)).
    std::vector<std::pair<int64_t, int64_t>> tasks_;
};

}  // namespace zk
