#include "engine/forward_buffers.h"

#include <algorithm>

#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/attention_prefill.h"

namespace zk {

namespace {

float* host_alloc(size_t n) { return new float[n](); }
void host_release(void* p) { delete[] (float*)p; }

}  // namespace

const fb_allocator& fb_allocator_host() {
    static const fb_allocator a{&host_alloc, &host_release, true};
    return a;
}

forward_buffers::forward_buffers(const model_hparams& hp, int64_t n_rows_, int max_seqs_, int n_threads_,
                                 int64_t cap_, int gear_rank, bool observe, const fb_allocator& alloc)
    : n_rows(n_rows_), max_seqs(max_seqs_), n_threads(n_threads_), n_head_kv(hp.n_head_kv), cap(cap_) {
    ZK_ASSERT(n_rows >= 1 && max_seqs >= 1 && n_threads >= 1 && cap >= 1);
    const int64_t R = n_rows, E = hp.n_embd, D = hp.head_dim, KV = hp.n_head_kv, G = hp.n_group();
    auto make = [&alloc](int64_t n) { return fb_array(alloc.alloc((size_t)n), (size_t)n, alloc.release); };
    x = make(R * E);
    xn = make(R * E);
    q = make(R * hp.n_head * D);
    k = make(R * KV * D);
    v = make(R * KV * D);
    attn = make(R * hp.n_head * D);
    tmp = make(R * E);
    gate = make(R * hp.n_ff);
    up = make(R * hp.n_ff);
    rope_cs = make(R * hp.rope.n_dims);
    if (hp.n_swa > 0) rope_cs_swa = make(R * hp.rope_swa.n_dims);
    pos.resize(R);
    row_seq.resize(R);
    seqs.resize(max_seqs);
    if (!alloc.host_attention) return;
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
    sel_n.resize((size_t)max_seqs * KV);
    sel_slots.resize((size_t)max_seqs * KV);
    if (observe) {
        thread_logits.resize((size_t)n_threads * G * cap);
        thread_scores.assign((size_t)n_threads * KV * cap, 0.0f);
    }
    prefill_tokens = kernel_prefill_tokens((int)G);
    prefill_scratch_stride = kernel_prefill_scratch((int)G, prefill_tokens, (int)D, (int)D);
    prefill_scratch.resize((size_t)n_threads * prefill_scratch_stride);
    tail_part.resize((size_t)(R * KV * G * (2 + D)));
    tail_lo.reserve((size_t)KV);
}

void forward_buffers::reserve_select(const kv_select_sizes& s) {
    fb_grow_to(sel_f, n_threads * s.f);
    fb_grow_to(sel_i, n_threads * s.i);
    fb_grow_to(sel_runs, (int64_t)max_seqs * n_head_kv * 2 * s.runs);
    fb_grow_to(sel_task_runs, n_threads * 2 * s.runs);
}

}  // namespace zk
