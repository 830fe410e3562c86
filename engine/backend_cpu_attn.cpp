// The CPU backend's attention side (engine/backend_cpu.h): the q/k projection
// of compressed heads, KV append, and attention of every row against its own
// sequence's cache, scheduled as the paper's section 5.3 says: tasks cost
// ~ slots x (r_k + r_v), run longest first on the pool's threads, with a
// decode segment's slots split into ranges merged afterwards (flash-decoding).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/backend_cpu.h"
#include "engine/evict/evict.h"
#include "engine/kv_cache.h"
#include "engine/kv_layout.h"
#include "engine/kv_select.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "kernels/attention_prefill.h"
#include "kernels/project.h"

namespace zk {

namespace {

// A decode segment's slot ranges hold at least this many slots.
constexpr int64_t k_min_range = 128;

// Sliding-window layers (model_hparams::n_swa; 0 = a global layer): a query at
// position p sees the positions > p - n_swa. Slots ascend by position, so
// those are the slots from the one returned here on. The session drops the
// slots a window has left only when the layer's smaller capacity fills
// (session::window_drop), so the mask still hides the rest.
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

void backend_cpu::kv_append(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                            forward_buffers& fb) {
    const int64_t D = hp.head_dim, KV = hp.n_head_kv, n_tasks = n_seqs * KV;
    // V needs no work before this: W_v is folded, so a rank-r_v head keeps the
    // first r_v channels of v. A prefill chunk's queries attend to its own rows
    // at full precision (kv_cache::view_attend; decode segments read view()).
    auto append = [&](int64_t task) {
        const backend_seq& sq = seqs[task / KV];
        const int g = (int)(task % KV);
        sq.cache->append(il, g, sq.n, fb.k.data() + (sq.row0 * KV + g) * D, KV * D,
                         fb.v.data() + (sq.row0 * KV + g) * D, KV * D, fb.pos.data() + sq.row0,
                         kv_append_holds(sq));
    };
    // Storing rows is cheap and runs here; a group quantized is not (a
    // 128-dim KIVI key head searches 81 clipped grids a channel: every layer's
    // window fills at the same step, and on Qwen2.5-Coder-1.5B's 4-bit cache
    // one decode step in 32 spent ~13 ms more in appends, ~8 ms in parallel on
    // two threads), so appends that quantize run in parallel over (sequence,
    // KV head).
    bool flushes = false;
    for (int64_t t = 0; t < n_tasks && !flushes; t++)
        flushes = seqs[t / KV].cache->append_flushes(il, (int)(t % KV), seqs[t / KV].n);
    if (flushes && n_tasks > 1 && pool_.size() > 1)
        pool_.parallel_for(n_tasks, 1, [&append](int64_t b, int64_t e, int) {  // one reference: no allocation
            for (int64_t t = b; t < e; t++) append(t);
        });
    else
        for (int64_t t = 0; t < n_tasks; t++) append(t);
}

// q~ = q R[:, :r_k] for every query head and k~ = k R[:, :r_k] (less the mean
// key's, where the .zack has one) for every KV
// head, in place, with the projection of the row's own sequence: head h's first
// r_k channels of q/k become the projection (the rest is left unused; with
// exact sinks all head_dim channels are rotated, q R and k R). Layout stays
// [n x heads x head_dim]. Rows of uncompressed sequences are left as they are.
void backend_cpu::project_qk(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                             forward_buffers& fb) {
    int64_t n = 0;
    for (int i = 0; i < n_seqs; i++) n += seqs[i].n;
    const int D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    auto body = [&](int64_t b, int64_t e, int) {
        for (int64_t task = b; task < e; task++) {
            const int64_t t = task / KV;
            const int g = (int)(task % KV);
            const backend_seq& s = seqs[fb.row_seq[t]];
            if (!s.compressed()) continue;
            const float* Pq = (*s.proj_q)[(size_t)il * KV + g].data();
            const float* Pk = (*s.proj_k)[(size_t)il * KV + g].data();
            // the cache keeps r_k channels; exact sinks need all of them, of
            // every query and of their own keys
            const int r_k = s.cache->block(il, g).r_k, sinks = s.cache->params().sinks;
            const int rq = sinks > 0 ? D : r_k;
            float* k = fb.k.data() + (t * KV + g) * D;
            kernel_project_head(Pk, fb.pos[t] < sinks ? D : r_k, D, k);
            if (s.k_shift) {  // the mean key's first r_k channels, from sink rows too: one shift per query
                const float* mu = (*s.k_shift)[(size_t)il * KV + g].data();
                for (int c = 0; c < r_k; c++) k[c] -= mu[c];
            }
            for (int j = 0; j < G; j++) kernel_project_head(Pq, rq, D, fb.q.data() + (t * H + g * G + j) * D);
        }
    };
    // the closure holds one reference, so std::function stores it without allocating
    pool_.parallel_for(n * KV, 1, [&body](int64_t b, int64_t e, int ith) { body(b, e, ith); });
}

namespace {

// The tiled kernel (kernels/attention_prefill.h) over view_of(g), a view of
// rows only, of every KV head g, for a prefill segment alone in its pass: the
// attention output into fb.attn, or (partial) each head's partials into
// fb.tail_part. Tasks are (KV head, block of fb.prefill_tokens tokens), longest
// first; every block of a head reads the same keys, transposed once here.
template <class ViewOf>
void prefill_tiled_run(thread_pool& pool, const backend_seq& s, const model_hparams& hp, int il,
                       forward_buffers& fb, const ViewOf& view_of, bool partial) {
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group(), n = s.n;
    const int64_t kb = kernel_prefill_key_block();
    int64_t kt_size = 0, nblk = 0;  // per head: floats of the transposed keys, key blocks
    for (int g = 0; g < KV; g++) {
        const attn_kv_view kv = view_of(g);
        kt_size = std::max(kt_size, kernel_prefill_keys_size(kv.n_slots, kv.r_k));
        nblk = std::max(nblk, (kv.n_slots + kb - 1) / kb);
    }
    if ((int64_t)fb.prefill_kt.size() < KV * kt_size) fb.prefill_kt.resize((size_t)(KV * kt_size));
    auto transpose = [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; i++) {
            const attn_kv_view kv = view_of((int)(i / nblk));
            const int64_t blk = i % nblk;
            if (blk * kb < kv.n_slots)
                kernel_prefill_keys(kv, blk, blk + 1, fb.prefill_kt.data() + (i / nblk) * kt_size);
        }
    };
    // one reference captured: std::function keeps it without allocating
    pool.parallel_for(KV * nblk, 4, [&transpose](int64_t b, int64_t e, int) { transpose(b, e); });
    const int64_t nt = fb.prefill_tokens;
    fb.tasks.clear();
    for (int g = 0; g < KV; g++) {
        const attn_kv_view kv = view_of(g);
        for (int64_t t0 = 0; t0 < n; t0 += nt) {
            const int32_t last = fb.pos[s.row0 + std::min(n, t0 + nt) - 1];
            const int64_t seen = std::upper_bound(kv.pos, kv.pos + kv.n_slots, last) - kv.pos;
            fb.tasks.push_back({seen * (kv.r_k + kv.r_v), 0, g, t0, 0});
        }
    }
    std::sort(fb.tasks.begin(), fb.tasks.end(), [](const attn_task& a, const attn_task& b) {
        if (a.cost != b.cost) return a.cost > b.cost;
        return a.g != b.g ? a.g < b.g : a.c < b.c;
    });
    const float scale = hp.score_scale();
    auto run = [&](int64_t i, int ith) {
        const attn_task& tk = fb.tasks[i];
        const attn_kv_view kv = view_of(tk.g);
        const int64_t t0 = tk.c, nb = std::min(nt, n - t0);
        const attn_q_view q{fb.q.data() + (s.row0 + t0) * H * D + tk.g * G * D, H * D, D, (int)G, nb,
                            fb.pos.data() + s.row0 + t0, scale};
        float* kt = fb.prefill_kt.data() + tk.g * kt_size;
        float* scratch = fb.prefill_scratch.data() + ith * fb.prefill_scratch_stride;
        if (partial) {
            float* base = fb.tail_part.data() + tk.g * n * G * (2 + D);
            const attn_partial p{base + t0 * G, base + n * G + t0 * G, base + 2 * n * G + t0 * G * kv.r_v};
            kernel_attention_prefill_partial(kv, kt, q, p, scratch);
        } else {
            kernel_attention_prefill(kv, kt, q, fb.attn.data() + (s.row0 + t0) * H * D + tk.g * G * D, H * D, D,
                                     scratch);
        }
    };
    pool.parallel_for((int64_t)fb.tasks.size(), 1, [&run, &fb](int64_t b, int64_t e, int ith) {
        for (int64_t i = b; i < e; i++) run(i, ith);
    });
}

}  // namespace

// Attention of every row against its own sequence's cache. A decode segment
// (<= k_session_decode_max_tok tokens) gets (head, slot range) tasks, merged
// per head afterwards (flash-decoding); a prefill segment gets a task per
// (head, token). All tasks of the pass share one longest-first schedule.
bool backend_cpu::attention_prefill(const backend_seq& sq, const model_hparams& hp, int il,
                                    forward_buffers& fb) {
    const backend_seq& s = sq;
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv;
    if (!prefill_tiles(s, hp, il)) return false;
    for (int g = 0; g < KV; g++)
        if (!kernel_prefill_supported(s.cache->view(il, g))) return false;
    // Compressed heads write only their first r_v channels; W_o's folded rows
    // for the rest must see zeros.
    if (s.compressed()) std::memset(fb.attn.data() + sq.row0 * H * D, 0, sizeof(float) * sq.n * H * D);
    auto view_of = [&](int g) { return s.cache->view(il, g); };
    prefill_tiled_run(pool_, s, hp, il, fb, view_of, false);
    return true;
}

// A prefill segment over a cache with quantized slots, which the tiled kernel
// does not read: each KV head's slots, the quantized ones dequantized
// (kv_cache::read_quant) and the rows (the residual window and, holding, the
// chunk's own rows) copied, become f16 rows in fb.deq once for the chunk, and
// every slot past the exact sinks goes through the tiled kernel as partials,
// which the per-token tasks merge with the sinks'. One pass over the codes a
// chunk, where the per-token kernel made one a token: on Qwen2.5-Coder-1.5B at
// 2K the attention of the 4-bit cache and of a 10% plan then takes the f16
// cache's time (it took 1.1x and 1.6x; bench/RESULTS.md). The rows are
// rounded to f16 as the f16 cache's are; the per-token kernel's int8 query
// rounding is not made. fb.tail_lo[g] is where head g's tiled slots start (its
// exact sinks end); fb.tail_lo is left empty (nothing done) where this does
// not apply.
void backend_cpu::attention_prefill_tails(const backend_seq& s, const model_hparams& hp, int il,
                                          forward_buffers& fb) {
    const int64_t KV = hp.n_head_kv;
    if (!prefill_tiles(s, hp, il)) return;
    const bool holds = kv_append_holds(s);
    auto cache_view = [&](int g) { return holds ? s.cache->view_attend(il, g) : s.cache->view(il, g); };
    // Rows in f16, as the f16 cache's; f32 for a cache of f32 rows, and where a
    // side is 8-bit (its codes carry more than f16 would keep of them).
    dtype type = dtype::F16;
    int64_t stride = 0;  // one head's rows in fb.deq, 16 elements of padding after each side (then bytes)
    for (int g = 0; g < KV; g++) {
        const attn_kv_view kv = cache_view(g);
        if (kv.type == dtype::F32 || kv.k.layout == KV_LAYOUT_Q8 || kv.v.layout == KV_LAYOUT_Q8) type = dtype::F32;
        stride = std::max(stride, kv.n_slots * (kv.r_k + kv.r_v) + 32);
    }
    const size_t elem = kv_elem_size(type);
    stride *= (int64_t)elem;
    fb_grow_to(fb.deq, KV * stride / (int64_t)sizeof(float));
    // head g as rows [n_slots x r_k] then [n_slots x r_v] of `type`; the sinks' slots are left unwritten
    auto rows_view = [&](int g) {
        const attn_kv_view kv = cache_view(g);
        attn_kv_view f{};
        f.type = type;
        f.pos = kv.pos;
        f.n_slots = kv.n_slots;
        f.r_k = kv.r_k;
        f.r_v = kv.r_v;
        const uint8_t* base = (const uint8_t*)fb.deq.data() + g * stride;
        f.k.rows = base;
        f.v.rows = base + (size_t)(kv.n_slots * kv.r_k + 16) * elem;
        f.n_sink_slots = kv.n_sink_slots;
        return f;
    };
    auto view_of = [&](int g) {
        int64_t lo = 0;
        return kernel_prefill_row_tail(rows_view(g), &lo);
    };
    for (int g = 0; g < KV; g++)
        if (!kernel_prefill_supported(view_of(g))) return;
    constexpr int64_t slice = 256;  // slots a task
    int64_t n_slices = 0;
    for (int g = 0; g < KV; g++) n_slices = std::max(n_slices, (cache_view(g).n_slots + slice - 1) / slice);
    fb_grow_to(fb.deq_tmp, (int64_t)fb.n_threads * slice * hp.head_dim);
    auto fill = [&](int64_t b, int64_t e, int ith) {
        float* tmp = fb.deq_tmp.data() + (size_t)ith * slice * hp.head_dim;
        for (int64_t i = b; i < e; i++) {
            const int g = (int)(i / n_slices);
            const attn_kv_view kv = cache_view(g);
            const attn_kv_view f = rows_view(g);
            const int64_t a = std::max((i % n_slices) * slice, kv.n_sink_slots);
            const int64_t z = std::min(kv.n_slots, (i % n_slices + 1) * slice);
            for (int side = 0; side < 2 && a < z; side++) {
                const attn_side_view& sv = side == 0 ? kv.k : kv.v;
                const int r = side == 0 ? kv.r_k : kv.r_v;
                uint8_t* X = (uint8_t*)(side == 0 ? f.k.rows : f.v.rows);
                const size_t row = (size_t)r * elem, src_row = (size_t)r * kv_elem_size(kv.type);
                const int64_t q = std::clamp(sv.n_quant, a, z);
                if (a < q) {
                    s.cache->read_quant(il, g, side == 0, a, q, tmp);
                    for (int64_t t = a; t < q; t++) kv_store_row(type, tmp + (t - a) * r, X + t * row, r);
                }
                // a tier's codes next (kv_cache_params::tier), then the rows of whichever side holds the window
                const attn_side_view* rs = &sv;
                int64_t q2 = q, r0 = sv.n_quant;
                if (kv.tier) {
                    rs = side == 0 ? &kv.tier->k : &kv.tier->v;
                    r0 = sv.n_quant + rs->n_quant;
                    q2 = std::clamp(r0, a, z);
                    if (q < q2) {
                        s.cache->read_tier_quant(il, g, side == 0, q - sv.n_quant, q2 - sv.n_quant, tmp, holds);
                        for (int64_t t = q; t < q2; t++) kv_store_row(type, tmp + (t - q) * r, X + t * row, r);
                    }
                }
                for (int64_t t = q2; t < z; t++) {
                    const uint8_t* src = (const uint8_t*)rs->rows + (size_t)(t - r0) * src_row;
                    if (kv.type == type) {
                        std::memcpy(X + t * row, src, row);
                    } else {
                        kv_load_row(kv.type, src, tmp, r);
                        kv_store_row(type, tmp, X + t * row, r);
                    }
                }
            }
        }
    };
    // one reference captured: std::function keeps it without allocating
    pool_.parallel_for(KV * n_slices, 1, [&fill](int64_t b, int64_t e, int ith) { fill(b, e, ith); });
    for (int g = 0; g < KV; g++) fb.tail_lo.push_back(cache_view(g).n_sink_slots);
    prefill_tiled_run(pool_, s, hp, il, fb, view_of, true);
}

// Whether a segment's prefill attention may take the tiled kernel: a prefill
// segment whose policy needs no attention logits, and not a local layer whose
// window has moved on (the kernel masks causally only; the per-token tasks
// start at the window).
bool backend_cpu::prefill_tiles(const backend_seq& s, const model_hparams& hp, int il) {
    if (s.n <= k_session_decode_max_tok || s.policy->needs_attention() || !s.prefill_tiled) return false;
    return !(hp.layer_is_swa(il) && s.n_past + s.n > hp.n_swa);
}

void backend_cpu::attention(const backend_seq* seqs, int n_seqs, const model_hparams& hp, int il,
                            forward_buffers& fb) {
    if (n_seqs == 1 && attention_prefill(seqs[0], hp, il, fb)) return;
    fb.tail_lo.clear();  // (attention_prefill_tails fills it where it applies)
    if (n_seqs == 1) attention_prefill_tails(seqs[0], hp, il, fb);
    const bool tails = !fb.tail_lo.empty();
    const int64_t D = hp.head_dim, H = hp.n_head, KV = hp.n_head_kv, G = hp.n_group();
    const float scale = hp.score_scale();  // of the original head dim, also when compressed
    const int64_t n_swa = hp.layer_is_swa(il) ? hp.n_swa : 0;
    // Decode segments share one slot range per task, which the window's start
    // must not cut inside: several tokens whose windows differ go per token.
    auto is_decode = [n_swa](const backend_seq& sq) {
        return sq.n <= k_session_decode_max_tok && !(n_swa > 0 && sq.n > 1 && sq.n_past + sq.n > n_swa);
    };
    const int nth = pool_.size();
    const int64_t score_stride = (int64_t)fb.score.size() / fb.n_threads;

    int n_decode = 0;
    for (int i = 0; i < n_seqs; i++) n_decode += is_decode(seqs[i]);
    // The per-thread observation sums of a prefill segment serve one sequence.
    ZK_ASSERT(n_decode == n_seqs || n_seqs == 1);

    // Decode-time key-group selection (engine/kv_select.h): one-token decode
    // segments on global layers whose policy needs no logits; each head longer
    // than the budget gets its runs of slots here, from its last choice
    // (kv_select_recall) or, when due, chosen afresh.
    int64_t most_f = 0, most_i = 0, most_runs = 0;
    for (int i = 0; i < n_seqs; i++) {
        const backend_seq& sq = seqs[i];
        const int64_t sel = sq.cache->params().select;
        const bool on = sel > 0 && is_decode(sq) && sq.n == 1 && n_swa == 0 && !sq.policy->needs_attention();
        for (int g = 0; g < KV; g++) {
            int64_t& sn = fb.sel_n[(size_t)(i * KV + g)];
            sn = 0;
            if (!on) continue;
            const attn_kv_view kv = sq.cache->view(il, g);
            if (!kv_select_applies(kv, sel)) continue;
            sn = -1;  // to choose
            most_f = std::max(most_f, kv_select_float_scratch(kv, (int)G));
            most_i = std::max(most_i, kv_select_index_scratch(kv));
            most_runs = std::max(most_runs, kv_select_max_runs(kv, sel));
        }
    }
    if (most_runs > 0) {
        fb.sel_f_stride = most_f;
        fb.sel_i_stride = most_i;
        fb.sel_runs_stride = 2 * most_runs;
        fb_grow_to(fb.sel_f, fb.n_threads * fb.sel_f_stride);
        fb_grow_to(fb.sel_i, fb.n_threads * fb.sel_i_stride);
        fb_grow_to(fb.sel_runs, n_seqs * KV * fb.sel_runs_stride);
        fb_grow_to(fb.sel_task_runs, fb.n_threads * fb.sel_runs_stride);
        bool choose = false;
        for (int64_t task = 0; task < n_seqs * KV; task++) {
            if (fb.sel_n[(size_t)task] != -1) continue;
            const backend_seq& sq = seqs[task / KV];
            const int g = (int)(task % KV);
            if (!kv_select_due(il, fb.pos[sq.row0], sq.cache->params().select_every)) {
                const kv_block& blk = sq.cache->block(il, g);
                fb.sel_n[(size_t)task] = kv_select_recall(blk.select_memo, sq.cache->view(il, g), blk.edits,
                                                          fb.sel_runs.data() + task * fb.sel_runs_stride,
                                                          &fb.sel_slots[(size_t)task]);
            }
            choose |= fb.sel_n[(size_t)task] == -1;
        }
        auto choose_heads = [&](int64_t b, int64_t e, int ith) {
            for (int64_t task = b; task < e; task++) {
                if (fb.sel_n[(size_t)task] != -1) continue;
                const backend_seq& sq = seqs[task / KV];
                const int g = (int)(task % KV);
                const attn_q_view q{fb.q.data() + sq.row0 * H * D + g * G * D, H * D, D, (int)G, 1,
                                    fb.pos.data() + sq.row0, scale};
                const attn_kv_view kv = sq.cache->view(il, g);
                int64_t* runs = fb.sel_runs.data() + task * fb.sel_runs_stride;
                const int64_t n = kv_select_runs(kv, q, sq.cache->params().select,
                                                 fb.sel_f.data() + ith * fb.sel_f_stride,
                                                 fb.sel_i.data() + ith * fb.sel_i_stride, runs,
                                                 &fb.sel_slots[(size_t)task]);
                kv_block& blk = sq.cache->block(il, g);
                kv_select_remember(blk.select_memo, kv, blk.edits, runs, n);
                fb.sel_n[(size_t)task] = n;
            }
        };
        // one reference captured: std::function keeps it without allocating
        if (choose)
            pool_.parallel_for(n_seqs * KV, 1, [&choose_heads](int64_t b, int64_t e, int ith) {
                choose_heads(b, e, ith);
            });
    }

    // tasks, and where their partials go
    fb.tasks.clear();
    int64_t part = 0;
    for (int i = 0; i < n_seqs; i++) {
        const backend_seq& sq = seqs[i];
        const backend_seq& s = sq;
        const kv_cache& cache = *s.cache;
        auto cost = [&](int g, int64_t slots) {
            const kv_block& b = cache.block(il, g);
            return slots * (b.r_k + b.r_v);
        };
        fb.seg_part[i] = part;
        // Compressed heads write only their first r_v channels; W_o's folded rows
        // for the rest must see zeros.
        if (s.compressed()) std::memset(fb.attn.data() + sq.row0 * H * D, 0, sizeof(float) * sq.n * H * D);
        if (is_decode(sq)) {
            // Slot ranges per head as for this sequence decoded alone on its own
            // threads (enough that each has work on the KV heads). Not fewer in a
            // batch, though the batch has more heads to share out: the split
            // decides the merge's rounding, and on this engine (8-bit
            // activations) a 1e-7 change grows into different greedy tokens. So
            // a batched row is the same arithmetic as its sequence alone
            // (tests/test_batch.cpp).
            const int64_t nt = s.n_threads;
            int64_t nc = std::min<int64_t>((cache.n_used_max() + k_min_range - 1) / k_min_range,
                                           (2 * nt + KV - 1) / KV);
            nc = std::max<int64_t>(1, std::min(nc, fb.max_chunks));
            fb.seg_nc[i] = nc;
            for (int g = 0; g < KV; g++)
                for (int64_t c = 0; c < nc; c++) {
                    const size_t ig = (size_t)(i * KV + g);
                    const int64_t slots = fb.sel_n[ig] > 0 ? fb.sel_slots[ig] : cache.block(il, g).n_used;
                    fb.tasks.push_back({cost(g, slots / nc), i, g, c, part});
                    part += sq.n * G * (2 + D);
                }
        } else {
            fb.seg_nc[i] = 0;
            for (int g = 0; g < KV; g++)
                for (int64_t t = 0; t < sq.n; t++) {
                    int64_t slots = std::min(cache.block(il, g).n_used, s.n_past + t + 1);
                    if (tails) slots = std::min(slots, fb.tail_lo[(size_t)g]);
                    fb.tasks.push_back({cost(g, slots), i, g, t, part});
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
        const backend_seq& sq = seqs[tk.seq];
        const backend_seq& s = sq;
        const int64_t nc = fb.seg_nc[tk.seq];
        // a prefill token reads its chunk's rows at full precision (kv_append_holds)
        const attn_kv_view kv = kv_append_holds(s) && nc == 0 ? s.cache->view_attend(il, tk.g) : s.cache->view(il, tk.g);
        const bool observe = s.policy->needs_attention();
        const float* q_seg = fb.q.data() + sq.row0 * H * D + tk.g * G * D;
        const int32_t* pos_seg = fb.pos.data() + sq.row0;
        float* pb = fb.part.data() + tk.part;
        float* scratch = fb.score.data() + ith * score_stride;
        if (nc > 0) {
            const int64_t n = sq.n, cap = s.cache->capacity();
            attn_partial p{pb, pb + n * G, pb + 2 * n * G};
            if (observe) {
                p.logits = s.logits_buf + tk.g * n * G * cap;
                p.logits_stride = cap;
            }
            const attn_q_view q{q_seg, H * D, D, (int)G, n, pos_seg, scale};
            const size_t ig = (size_t)(tk.seq * KV + tk.g);
            if (fb.sel_n[ig] > 0) {
                // selected groups: this task's share [v0, v1) of the runs' slots
                // laid end to end, as runs of its own, in one partial
                const int64_t* runs = fb.sel_runs.data() + ig * fb.sel_runs_stride;
                const int64_t T = fb.sel_slots[ig], v0 = T * tk.c / nc, v1 = T * (tk.c + 1) / nc;
                int64_t* mine = fb.sel_task_runs.data() + ith * fb.sel_runs_stride;
                int64_t n_mine = 0;
                for (int64_t r = 0, at = 0; r < fb.sel_n[ig] && at < v1; r++) {
                    const int64_t len = runs[2 * r + 1] - runs[2 * r];
                    const int64_t a = std::max(v0, at), b = std::min(v1, at + len);
                    if (a < b) {
                        mine[2 * n_mine] = runs[2 * r] + a - at;
                        mine[2 * n_mine + 1] = runs[2 * r] + b - at;
                        n_mine++;
                    }
                    at += len;
                }
                kernel_attention_runs(kv, mine, n_mine, q, p, scratch);
                return;
            }
            // (one token, or tokens whose windows all start at slot 0)
            const int64_t lo = window_first_slot(kv, n_swa, pos_seg[0]);
            const int64_t s0 = lo + (kv.n_slots - lo) * tk.c / nc, s1 = lo + (kv.n_slots - lo) * (tk.c + 1) / nc;
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
        // (with tails, the tiled kernel's partials cover the slots from tail_lo on)
        const int64_t s1 = std::min({kv.n_slots, s.n_past + t + 1, tails ? fb.tail_lo[(size_t)tk.g] : kv.n_slots});
        const int64_t lo = std::min(window_first_slot(kv, n_swa, pos_seg[t]), s1);
        if (lg && lo > 0) window_mask_logits(lg, fb.cap, G, lo);
        kernel_attention_range(kv, lo, s1, q, p, scratch);
        attn_partial parts[3] = {p, p, p};
        int n_parts = 1;
        if (tails) {
            float* base = fb.tail_part.data() + tk.g * sq.n * G * (2 + D);
            parts[n_parts++] = attn_partial{base + t * G, base + sq.n * G + t * G, base + 2 * sq.n * G + t * G * kv.r_v};
        }
        const attn_kv_view kvs = window_sinks(kv, lo);
        if (kvs.n_sink_slots > 0) {
            float* sb = fb.sink_part.data() + (size_t)ith * fb.sink_part_stride;
            parts[n_parts] = attn_partial{sb, sb + G, sb + 2 * G, lg ? lg + (kvs.pos - kv.pos) : nullptr, fb.cap,
                                          kv.sink_dim};
            kernel_attention_sinks(kvs, q, parts[n_parts++]);
        }
        kernel_attention_merge(parts, n_parts, 1, (int)G, kv.r_v,
                               fb.attn.data() + (sq.row0 + t) * H * D + tk.g * G * D, H * D, D);
        if (observe) {
            const evict_observation o{il, tk.g, pos_seg[t], t, sq.n, s.n_ctx, kv.pos};
            float* acc = fb.thread_scores.data() + ((size_t)ith * KV + tk.g) * fb.cap;
            for (int64_t j = 0; j < G; j++) s.policy->observe(o, lg + j * fb.cap, s1, acc);
        }
    };
    pool_.parallel_for((int64_t)fb.tasks.size(), 1, [&run_task, &fb](int64_t b, int64_t e, int ith) {
        for (int64_t i = b; i < e; i++) run_task(fb.tasks[i], ith);
    });

    // decode segments: merge each head's ranges, then show the policy the logits
    bool observe_decode = false;
    for (int i = 0; i < n_seqs; i++) {
        const backend_seq& sq = seqs[i];
        const int64_t nc = fb.seg_nc[i];
        if (nc == 0) continue;
        observe_decode |= sq.policy->needs_attention();
        const int64_t per_task = sq.n * G * (2 + D);
        const backend_seq& s = sq;
        for (int g = 0; g < KV; g++) {
            attn_partial parts[65];
            for (int64_t c = 0; c < nc; c++) {
                float* pb = fb.part.data() + fb.seg_part[i] + (g * nc + c) * per_task;
                parts[c] = attn_partial{pb, pb + sq.n * G, pb + 2 * sq.n * G};
            }
            int n_parts = (int)nc;
            const attn_kv_view kv = s.cache->view(il, g);
            // a window that has moved on (one token: see run_task) hides the
            // slots below lo, exact sinks included
            const int64_t lo = window_first_slot(kv, n_swa, fb.pos[sq.row0]);
            const int64_t cap = s.cache->capacity();
            if (lo > 0 && s.policy->needs_attention())
                window_mask_logits(s.logits_buf + g * sq.n * G * cap, cap, sq.n * G, lo);
            const attn_kv_view kvs = window_sinks(kv, lo);
            if (kvs.n_sink_slots > 0) {
                // a few rows per head: serial, on the sink buffer of thread 0
                float* sb = fb.sink_part.data();
                const int64_t n = sq.n;
                attn_partial p{sb, sb + n * G, sb + 2 * n * G, nullptr, 0, kv.sink_dim};
                if (s.policy->needs_attention()) {
                    p.logits = s.logits_buf + g * n * G * cap + (kvs.pos - kv.pos);
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
                const backend_seq& sq = seqs[task / KV];
                const backend_seq& s = sq;
                const int g = (int)(task % KV);
                if (fb.seg_nc[task / KV] == 0 || !s.policy->needs_attention()) continue;
                kv_block& blk = s.cache->block(il, g);
                const int64_t n = sq.n, cap = s.cache->capacity();
                for (int64_t t = 0; t < n; t++) {
                    const evict_observation o{il, g, fb.pos[sq.row0 + t], t, n, s.n_ctx, blk.pos};
                    for (int64_t j = 0; j < G; j++)
                        s.policy->observe(o, s.logits_buf + ((g * n + t) * G + j) * cap, blk.n_used,
                                           blk.score.data());
                }
            }
        };
        pool_.parallel_for(n_seqs * KV, 1, [&observe_head](int64_t b, int64_t e, int ith) { observe_head(b, e, ith); });
    }
    if (n_decode == 0 && seqs[0].policy->needs_attention()) {
        // prefill: per-thread sums into the blocks' scores, in thread order
        const backend_seq& s = seqs[0];
        auto add_scores = [&](int64_t b, int64_t e, int) {
            for (int64_t g = b; g < e; g++) {
                kv_block& blk = s.cache->block(il, (int)g);
                for (int i = 0; i < nth; i++) {
                    float* acc = fb.thread_scores.data() + ((size_t)i * KV + g) * fb.cap;
                    for (int64_t sl = 0; sl < blk.n_used; sl++) blk.score[sl] += acc[sl], acc[sl] = 0;
                }
            }
        };
        pool_.parallel_for(KV, 1, [&add_scores](int64_t b, int64_t e, int ith) { add_scores(b, e, ith); });
    }
}

}  // namespace zk
