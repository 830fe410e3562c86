// Mutable run state for one sequence on a model: the KV cache, activation
// buffers sized once for a batch of tokens, and the thread pool. decode() runs
// the decoder over new tokens and returns their logits. The forward pass itself
// takes rows of several sequences at once; engine/batch.h decodes a batch of
// sessions through it.
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
    // The residual stream entering layer `layer` (before its attention norm), [n x n_embd].
    virtual void on_layer_input(int layer, int64_t n, const float* x) {}
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
    // Key basis of each compressed head (calib/keybasis.h: 0 pca, 1 score,
    // 2 pairs), [n_layer x n_head_kv]; empty = pca everywhere.
    std::vector<int> kbasis;
    // KV cache precision (engine/kv_cache.h): 16 = kv_type rows, 8, or 4 or 2-bit KIVI.
    int kv_bits = 16;
    // Per (layer, KV head) precision of the keys and of the values (16, 8, 4 or
    // 2), [n_layer x n_head_kv] row-major; empty = kv_bits (KV plans set them).
    std::vector<int> kv_bits_k;
    std::vector<int> kv_bits_v;
    int kv_group = 32;            // KIVI: tokens per key group
    int kv_residual = 0;          // KIVI: full-precision window (0 = kv_cache_residual default, 128)
    bool kv_gear = false;         // KIVI: GEAR error correction
    int kv_gear_rank = 2;
    float kv_gear_outliers = 0.02f;
    // Token eviction (engine/evict/evict.h); policy "none" keeps every token.
    // evict.n_sink also sets the exact sinks of a quantized or compressed cache:
    // the first n_sink tokens are kept in f32 at full head dim (engine/kv_cache.h).
    evict_params evict;
    // Prefill attention of a full-precision cache with the tiled kernel
    // (kernels/attention_prefill.h) where the policy needs no attention
    // weights. Its sums run in another order than the per-token decode kernel,
    // so a prefill differs from the same tokens decoded one by one by float
    // rounding (grown by the 8-bit activations); off, both paths are one
    // arithmetic (tests compare policies bit for bit that way).
    bool prefill_tiled = true;
};

void session_validate_params(const session_params& p, const model_hparams& hp);
// The KV cache parameters session_params describe (the exact sinks are set by
// the session, which knows the head dim and whether the cache is lossy).
kv_cache_params session_kv_params(const session_params& p);

class session;

// Decode-style passes (a few new tokens per sequence) split each head's slots
// into ranges so that every thread has work; longer segments (prefill) get one
// attention task per token.
constexpr int64_t k_session_decode_max_tok = 4;

// One sequence's part of a forward pass: rows [row0, row0 + n) of the
// activations are its next n tokens, at positions n_past() .. n_past() + n - 1.
struct forward_seq {
    session* s;
    int64_t row0;
    int64_t n;
};

// An attention task of a forward pass: (sequence, KV head, slot range) for a
// decode segment, (sequence, KV head, token) for a prefill segment.
struct attn_task {
    int64_t cost;  // ~ slots x (r_k + r_v); tasks run longest first
    int32_t seq;   // index into the pass's forward_seq list
    int32_t g;     // KV head
    int64_t c;     // decode: slot range index; prefill: token index in the segment
    int64_t part;  // offset of its partial (m, l, acc) in forward_buffers::part
};

// Activations and scratch of forward passes over up to n_rows token rows that
// may belong to up to max_seqs sequences (rows of one sequence are contiguous);
// R = n_rows below.
// Owned by whoever runs passes on a pool: a session for its own decode() calls,
// a batch_decoder (engine/batch.h) for steps over several sessions. Sized once,
// so a pass allocates nothing.
struct forward_buffers {
    // n_threads: at least the pool's size and every sequence's own thread count
    // (it sets how many slot ranges a sequence's heads are split into);
    // cap: the largest cache capacity among the sequences; gear_rank: the largest
    // GEAR rank (0 = none); observe: some sequence's policy needs attention logits.
    forward_buffers(const model_hparams& hp, int64_t n_rows, int max_seqs, int n_threads, int64_t cap,
                    int gear_rank, bool observe);

    int64_t n_rows;
    int max_seqs;
    int n_threads;
    int64_t cap;
    int64_t max_chunks;           // slot ranges per (sequence, head) in a decode segment, 4 x n_threads (<= 64)
    matmul_scratch mm;
    std::vector<float> x;         // [R x n_embd] residual stream
    std::vector<float> xn;        // [R x n_embd] normalised input of a sub-layer
    std::vector<float> q;         // [R x n_head x head_dim]
    std::vector<float> k;         // [R x n_head_kv x head_dim]
    std::vector<float> v;         // [R x n_head_kv x head_dim]
    std::vector<float> attn;      // [R x n_head x head_dim] attention output
    std::vector<float> tmp;       // [R x n_embd] projection output
    std::vector<float> gate;      // [R x n_ff]
    std::vector<float> up;        // [R x n_ff]
    std::vector<float> rope_cs;   // [R x rope_dims/2 x 2]
    std::vector<float> rope_cs_swa;  // the same for sliding-window layers (empty without)
    std::vector<int32_t> pos;     // [R] each row's own position
    std::vector<int32_t> row_seq; // [R] index of the row's sequence in the pass
    // Attention partials, per task [tokens x group x (2 + head_dim)] (m, l, acc),
    // and per-thread kernel scratch [n_threads x kernel_attention_scratch(cap)].
    std::vector<float> part;
    std::vector<float> score;
    // Exact-sink partials, per thread [k_session_decode_max_tok x group x (2 + head_dim)].
    std::vector<float> sink_part;
    int64_t sink_part_stride = 0;
    std::vector<attn_task> tasks;
    std::vector<int64_t> seg_nc;    // [max_seqs] slot ranges of each decode segment
    std::vector<int64_t> seg_part;  // [max_seqs] first partial of each segment
    // Prefill with an attention-observing policy (one such segment per pass):
    // per-thread logits [n_threads x group x cap] and score sums
    // [n_threads x n_head_kv x cap], added to the blocks in thread order.
    std::vector<float> thread_logits;
    std::vector<float> thread_scores;
    // Tiled prefill attention: per-thread kernel scratch, and the keys of one
    // layer's KV heads transposed ([n_head_kv x kernel_prefill_keys_size]),
    // grown to the longest prefix seen (at most a few times per session).
    std::vector<float> prefill_scratch;
    int64_t prefill_scratch_stride = 0;
    int prefill_tokens = 1;
    std::vector<float> prefill_kt;
};

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
    const session_params& params() const { return params_; }
    void reset();
    // Not owned; nullptr detaches. Called from the thread that runs decode().
    void set_observer(session_observer* obs) { observer_ = obs; }
    const kv_cache& cache() const { return *cache_; }
    const model& mdl() const { return m_; }
    thread_pool& pool() { return *pool_; }

private:
    friend class batch_decoder;

    // The engine's one forward pass, for decode() (one sequence) and
    // batch_decoder (several): the weight matmuls run once over every row, each
    // row uses its own position, each sequence's K/V go to its own cache and its
    // attention tasks share one longest-first schedule. Advances every
    // sequence's n_past. logits_out (null = none) gets, sequence by sequence,
    // the logits of its last row, or of all its rows with logits_all:
    // [rows x n_vocab]. Eviction is the caller's (evict_before / evict_after).
    static void forward(const forward_seq* seqs, int n_seqs, const int32_t* tokens, bool logits_all,
                        float* logits_out, forward_buffers& fb, thread_pool& pool);
    static void compress_qk(const forward_seq* seqs, int il, int64_t n_rows, forward_buffers& fb, thread_pool& pool);
    static void attention(const forward_seq* seqs, int n_seqs, int il, forward_buffers& fb, thread_pool& pool);
    // A prefill segment alone in its pass, with the tiled kernel
    // (kernels/attention_prefill.h); false, doing nothing, where it does not apply.
    static bool attention_prefill(const forward_seq& sq, int il, forward_buffers& fb, thread_pool& pool);
    // Throws unless n tokens are valid ids and fit in the context.
    void check_tokens(const int32_t* tokens, int64_t n) const;
    // Evicts down to the budget when the policy says so: before a chunk of
    // `incoming` tokens that would not fit, or after a decode() call.
    void evict_before(int64_t incoming);
    void evict_after(int64_t n_call);

    const model& m_;
    session_params params_;
    std::unique_ptr<thread_pool> pool_;
    std::unique_ptr<kv_cache> cache_;
    std::unique_ptr<forward_buffers> fb_;  // for chunks of up to n_batch tokens
    int64_t n_past_ = 0;
    session_observer* observer_ = nullptr;

    // Compressed heads: per (layer, KV head) the key basis's projections
    // stored transposed, [head_dim x head_dim] (row j = direction j, one
    // contiguous dot per output channel; the first r_k rows give the r_k-dim
    // q~ = A[:, :r_k]^T q and k~ = B[:, :r_k]^T k, all of them serve exact sinks).
    bool compressed_ = false;
    std::vector<std::vector<float>> proj_q_, proj_k_;  // [n_layer * n_head_kv]
    std::vector<float> logits_;   // [n_vocab] or [n x n_vocab]
    // Eviction: the policy, and the attention logits of a decode segment shown
    // to it, [n_head_kv x k_session_decode_max_tok x group x capacity].
    std::unique_ptr<evict_policy> policy_;
    bool evicting_ = false;
    std::vector<float> logits_buf_;
};

}  // namespace zk
