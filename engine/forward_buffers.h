// The activations and scratch of forward passes (engine/session.h), made by
// the backend (engine/backend.h, buffers_create) and sized once, so a pass
// allocates nothing; and the per-sequence view of a pass that attention sees.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/kv_select.h"
#include "engine/model.h"
#include "kernels/matmul.h"

namespace zk {

class kv_cache;
class evict_policy;

// An activation array of forward passes in the memory of the backend that
// made it: host memory for the CPU, device memory for CUDA. The forward pass
// (engine/session.cpp, engine/arch_block.cpp) only takes addresses in it and
// hands them to the backend; only the backend that made it reads or writes it.
class fb_array {
public:
    // Frees what an allocator returned.
    using release_fn = void (*)(void*);
    fb_array() = default;
    fb_array(float* p, size_t n, release_fn release) : p_(p), n_(n), release_(release) {}
    fb_array(fb_array&& o) noexcept : p_(o.p_), n_(o.n_), release_(o.release_) { o.p_ = nullptr, o.n_ = 0; }
    fb_array& operator=(fb_array&& o) noexcept {
        if (this != &o) {
            reset();
            p_ = o.p_, n_ = o.n_, release_ = o.release_;
            o.p_ = nullptr, o.n_ = 0;
        }
        return *this;
    }
    fb_array(const fb_array&) = delete;
    fb_array& operator=(const fb_array&) = delete;
    ~fb_array() { reset(); }
    float* data() const { return p_; }
    size_t size() const { return n_; }

private:
    void reset() {
        if (p_ && release_) release_(p_);
        p_ = nullptr;
    }
    float* p_ = nullptr;
    size_t n_ = 0;
    release_fn release_ = nullptr;
};

// Where a backend's activation arrays live: alloc returns n zeroed floats
// (throwing zk::error when it cannot), release frees them.
// fb_allocator_host() is host memory (the CPU backend's); the CUDA backend
// allocates on the device and asks for no host attention scratch.
struct fb_allocator {
    float* (*alloc)(size_t n);
    fb_array::release_fn release;
    bool host_attention = true;  // size part, score, prefill scratch etc. for the CPU's attention
};
const fb_allocator& fb_allocator_host();

// Decode-style passes (a few new tokens per sequence) split each head's slots
// into ranges so that every thread has work; longer segments (prefill) get one
// attention task per token.
constexpr int64_t k_session_decode_max_tok = 4;

// One sequence's part of a pass, as attention and the q/k projection see it:
// rows [row0, row0 + n) of the activations, at positions n_past .. n_past + n - 1.
struct backend_seq {
    kv_cache* cache = nullptr;
    evict_policy* policy = nullptr;  // shown the attention logits when it needs them
    // The logits a decode segment shows the policy,
    // [n_head_kv x k_session_decode_max_tok x group x capacity] (null when not observing).
    float* logits_buf = nullptr;
    // Compressed heads: per (layer, KV head) the key basis's projections stored
    // transposed, [head_dim x head_dim] (engine/session.h); null = not compressed.
    const std::vector<std::vector<float>>* proj_q = nullptr;
    const std::vector<std::vector<float>>* proj_k = nullptr;
    // With them, per (layer, KV head) the mean key in the key basis, [head_dim]:
    // keys are cached less its first r_k channels (engine/session.h); null = none.
    const std::vector<std::vector<float>>* k_shift = nullptr;
    int64_t row0 = 0, n = 0;
    int64_t n_past = 0;  // tokens in the sequence before this pass
    int64_t n_ctx = 0;   // the sequence's context (positions run up to it)
    int n_threads = 1;   // the sequence's own thread count: it sets a decode segment's split
    bool prefill_tiled = true;
    bool prefill_hold = true;  // session_params::prefill_hold
    bool compressed() const { return proj_q != nullptr; }
};

// Whether sequence s's segment appends with hold (kv_cache::append): a prefill
// chunk, whose queries then read kv_cache::view_attend. Every backend asks
// this, so they attend to the same rows.
inline bool kv_append_holds(const backend_seq& s) { return s.prefill_hold && s.n > k_session_decode_max_tok; }

// An attention task of a forward pass: (sequence, KV head, slot range) for a
// decode segment, (sequence, KV head, token) for a prefill segment.
struct attn_task {
    int64_t cost;  // ~ slots x (r_k + r_v); tasks run longest first
    int32_t seq;   // index into the pass's sequences
    int32_t g;     // KV head
    int64_t c;     // decode: slot range index; prefill: token index in the segment
    int64_t part;  // offset of its partial (m, l, acc) in forward_buffers::part
};

// v.size() >= n, doubling when it grows (a step's selection groups grow one at
// a time; doubling keeps that from reallocating for every group).
template <class T>
void fb_grow_to(std::vector<T>& v, int64_t n) {
    if ((int64_t)v.size() < n) v.resize((size_t)std::max<int64_t>(n, 2 * (int64_t)v.size()));
}

// Activations and scratch of forward passes over up to n_rows token rows that
// may belong to up to max_seqs sequences (rows of one sequence are contiguous);
// R = n_rows below.
// Made by the backend of whoever runs passes: a session for its own decode()
// calls, a batch_decoder (engine/batch.h) for steps over several sessions.
// Sized once, so a pass allocates nothing.
struct forward_buffers {
    // n_threads: at least the pool's size and every sequence's own thread count
    // (it sets how many slot ranges a sequence's heads are split into);
    // cap: the largest cache capacity among the sequences; gear_rank: the largest
    // GEAR rank (0 = none); observe: some sequence's policy needs attention logits.
    // alloc: the backend's memory for the activation arrays (x .. rope_cs_swa).
    forward_buffers(const model_hparams& hp, int64_t n_rows, int max_seqs, int n_threads, int64_t cap,
                    int gear_rank, bool observe, const fb_allocator& alloc = fb_allocator_host());

    int64_t n_rows;
    int max_seqs;
    int n_threads;
    int n_head_kv;
    int64_t cap;
    int64_t max_chunks = 1;       // slot ranges per (sequence, head) in a decode segment, 4 x n_threads (<= 64)
    matmul_scratch mm;
    fb_array x;               // [R x n_embd] residual stream
    fb_array xn;              // [R x n_embd] normalised input of a sub-layer
    fb_array q;               // [R x n_head x head_dim]
    fb_array k;               // [R x n_head_kv x head_dim]
    fb_array v;               // [R x n_head_kv x head_dim]
    fb_array attn;            // [R x n_head x head_dim] attention output
    fb_array tmp;             // [R x n_embd] projection output
    fb_array gate;            // [R x n_ff]
    fb_array up;              // [R x n_ff]
    fb_array rope_cs;         // [R x rope_dims/2 x 2]
    fb_array rope_cs_swa;     // the same for sliding-window layers (empty without)
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
    std::vector<backend_seq> seqs;  // [max_seqs] the pass's sequences, as attention sees them
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
    // A prefill chunk over quantized slots (backend_cpu::attention_prefill_tails):
    // per KV head the first slot the tiled kernel took (tail_lo, past the exact
    // sinks; empty: none this pass), and its partials, per head [n x group] m, then l,
    // then [n x group x r_v] acc, at g x n x group x (2 + head_dim).
    std::vector<int64_t> tail_lo;
    std::vector<float> tail_part;
    // ... and every head's slots as f16 (or f32) rows ([n_head_kv x n_slots x
    // (r_k + r_v)], grown with the context, doubling), dequantized through
    // per-thread f32 scratch (deq_tmp, [n_threads x 256 x head_dim]).
    std::vector<float> deq;
    std::vector<float> deq_tmp;
    // Decode-time key-group selection (engine/kv_select.h): per-thread scratch
    // and partials [n_threads x stride], and per (sequence, KV head) of the pass
    // the runs of slots the step attends to (sel_n: how many, 0 = every slot;
    // sel_slots: the slots they hold). Sized for the caches' capacities
    // (reserve_select); grown, doubling, only past them.
    // (sel_task_runs: per thread, the runs of a task's share of the slots.)
    std::vector<float> sel_f;
    std::vector<int64_t> sel_i, sel_runs, sel_task_runs, sel_n, sel_slots;
    int64_t sel_f_stride = 0, sel_i_stride = 0, sel_runs_stride = 0;
    // Sizes the sel_ arrays for a sequence whose cache needs at most s
    // (kv_select_sizes_max), so that they need not grow during decode.
    void reserve_select(const kv_select_sizes& s);
};

}  // namespace zk
