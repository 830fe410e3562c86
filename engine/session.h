// Mutable run state for one sequence on a model: the KV cache, the compute
// backend chosen at creation (engine/backend.h) and the activation buffers it
// made, sized once for a batch of tokens. decode() runs
// the decoder over new tokens and returns their logits. The forward pass itself
// takes rows of several sequences at once; engine/batch.h decodes a batch of
// sessions through it.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
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
    backend_device device = backend_device::CPU;  // engine/backend.h: chosen once, at creation
    // What a session does when `device` cannot run it (no device, or a feature
    // the device's backend lacks: backend_cuda refuses in one line): THROW the
    // reason; CPU_QUIET runs on the CPU; CPU_NOTICE also says why on stderr.
    enum class fallback { THROW, CPU_QUIET, CPU_NOTICE };
    fallback device_fallback = fallback::THROW;
    int64_t n_batch = 256;    // tokens per forward chunk during prefill
    // Compressed attention (a .zack model): K and V ranks per (layer, KV head),
    // [n_layer x n_head_kv] row-major. Empty = full head dim (no compression).
    std::vector<int> ranks_k;
    std::vector<int> ranks_v;
    // Key basis of each compressed head (calib/keybasis.h: 0 pca, 1 score,
    // 2 pairs), [n_layer x n_head_kv]; empty = pca everywhere.
    std::vector<int> kbasis;
    // The KV cache's precision and layouts (engine/kv_cache.h): row type,
    // bits or per-head bits_k / bits_v (KV plans set them), KIVI group and
    // window, GEAR. Its eviction and sink fields are the session's to set
    // (from `evict` and the model): left at their defaults here.
    kv_cache_params kv;
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
    // A prefill chunk's queries attend to its own keys and values at full
    // precision before a quantized cache's window quantizes them (kv_cache::
    // append's hold), as KIVI's prefill does. Off, a chunk's appends quantize
    // first: what calibration's KL windows measure (calib/plan_kl.h).
    bool prefill_hold = true;
    // Sliding-window layers (model_hparams::n_swa) hold only their window and
    // the next chunk, dropping older slots (session::window_drop), as
    // llama.cpp's SWA cache does; off, they keep every token behind the mask.
    // Same logits either way.
    bool window_cache = true;
};

void session_validate_params(const session_params& p, const model_hparams& hp);

class session;

// One sequence's part of a forward pass: rows [row0, row0 + n) of the
// activations are its next n tokens, at positions n_past() .. n_past() + n - 1.
struct forward_seq {
    session* s;
    int64_t row0;
    int64_t n;
};

// The heads whose keys a session would store at 8 bits in the ZACK basis (a
// rank table: every head in basis `kbasis[h]`, 0 = pca when empty) although the
// .zack's calibration measured that to wreck them: a relative loss above 1 for
// 8-bit keys in its table's column with the values exact. Why: the 8-bit layout
// shares one scale among 32 channels of a token, and the pca basis gathers a
// massive key component into one channel (Qwen2.5-Coder-1.5B layer 0: RMS 912
// against 6.3 for the next), so the rest of that block rounds to nothing (loss
// 38, perplexity 149 against 2.1 with `--kv-rate 0.1 --kv-bits 8`); per-channel
// 4/2-bit grids do not care (0.007). A .zack with the mean key (blk.N.zack.kmean)
// caches keys less it and measures its table so, which removes the hazard (ppl
// 1.82 against 1.80 with f16 on tests/test_qwen_key_mean.py's text, 32.9 before):
// the warning is for older files. One line per head ("layer L, KV head G: loss X at 8 bits,
// Y at 4"), none when the file has no such table.
std::vector<std::string> session_key8_hazards(const zack_info& z, const kv_cache_params& kv,
                                              const std::vector<int>& kbasis, int n_layer, int n_head_kv);

// Whether head h's keys are KIVI codes of unequal widths (4 or 2 bits with a
// 1-bit tail or 0-bit channels): at full rank in the pca basis such a head
// takes the .zack's quantization order of the directions (zack_layer::korder, from blk.N.zack.kscore).
bool session_key_widths_unequal(const kv_cache_params& kv, size_t h);

class session {
public:
    session(const model& m, const session_params& p);
    ~session();

    // Runs tokens at positions n_past() .. n_past() + n - 1 and appends them to the
    // cache. Returns the logits of the last token [n_vocab], or with logits_all
    // those of every token [n x n_vocab]. Throws if the context would overflow.
    const float* decode(const int32_t* tokens, int64_t n, bool logits_all = false);
    // decode() from layer `first_layer` on: x [n x n_embd] is the residual
    // stream entering that layer for these tokens (what a session_observer's
    // on_layer_input saw of them, chunk by chunk), and the layers below it
    // neither run nor cache anything. With the same chunks and the same cache
    // in the layers it runs, the logits are decode()'s bit for bit. What it is
    // for: measuring a change confined to layers >= first_layer without
    // running the prefix again (calib/layer_gain.h). Host memory only: throws
    // on a device backend, and when first_layer is outside [0, n_layer).
    const float* decode_from(int first_layer, const float* x, const int32_t* tokens, int64_t n,
                             bool logits_all = false);

    int64_t n_past() const { return n_past_; }
    int64_t n_ctx() const { return params_.n_ctx; }
    const session_params& params() const { return params_; }
    void reset();
    // Not owned; nullptr detaches. Called from the thread that runs decode().
    // Throws on a device whose activations are not in host memory (CUDA).
    void set_observer(session_observer* obs);
    const kv_cache& cache() const { return *cache_; }
    // Tests: the backend's own copy of the cache against it (backend::kv_copy_check; "" = equal).
    std::string kv_copy_check() { return be_->kv_copy_check(*cache_); }
    const model& mdl() const { return m_; }
    thread_pool& pool() { return be_->host_pool(); }  // host-side work (calibration statistics)

private:
    friend class batch_decoder;

    // The backend of device d, or of the CPU after fall_back when d cannot run
    // and params_.device_fallback allows it; params_.device says which.
    std::unique_ptr<backend> device_create(backend_device d);
    void fall_back(const char* why);

    // The engine's one forward pass, for decode() (one sequence) and
    // batch_decoder (several), on backend `be`: the weight matmuls run once over
    // every row, each row uses its own position, each sequence's K/V go to its
    // own cache and its attention tasks share one longest-first schedule.
    // Advances every sequence's n_past. logits_out (null = none) gets, sequence
    // by sequence, the logits of its last row, or of all its rows with
    // logits_all: [rows x n_vocab]. Eviction is the caller's (evict_before /
    // evict_after).
    // first_layer > 0: the layers below it are skipped and x_in [rows x n_embd]
    // (host memory) is the residual stream entering first_layer (decode_from).
    static void forward(const forward_seq* seqs, int n_seqs, const int32_t* tokens, bool logits_all,
                        float* logits_out, forward_buffers& fb, backend& be, int first_layer = 0,
                        const float* x_in = nullptr);
    const float* decode_rows(const int32_t* tokens, int64_t n, bool logits_all, int first_layer, const float* x);
    // What the backend's attention needs of this session's rows [row0, row0 + n).
    backend_seq view(int64_t row0, int64_t n);
    // Throws unless n tokens are valid ids and fit in the context.
    void check_tokens(const int32_t* tokens, int64_t n) const;
    // Makes room for a chunk of `incoming` tokens: sliding-window layers drop
    // what their window has left (window_drop), then the policy evicts down to
    // the budget when the chunk would not fit; evict_after does so after a
    // decode() call.
    void evict_before(int64_t incoming);
    void window_drop(int64_t incoming);
    void evict_after(int64_t n_call);

    const model& m_;
    session_params params_;
    std::unique_ptr<backend> be_;
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
    // The mean key of the .zack in each head's key basis, [head_dim] per head
    // (B^T mean): keys are cached less its first r_k channels, sink rows too,
    // so every key of a query shifts its score by the same q~.mean~ and the
    // softmax does not see it; empty when the .zack has no mean (older files).
    std::vector<std::vector<float>> shift_k_;
    std::vector<float> logits_;   // [n_vocab] or [n x n_vocab]
    // Eviction: the policy, and the attention logits of a decode segment shown
    // to it, [n_head_kv x k_session_decode_max_tok x group x capacity].
    std::unique_ptr<evict_policy> policy_;
    bool evicting_ = false;
    // Sliding-window layers with a capacity of their own, and the keep mask
    // window_drop hands the cache, [capacity].
    bool windowed_layers_ = false;
    std::vector<uint8_t> keep_;
    std::vector<float> logits_buf_;
};

}  // namespace zk
