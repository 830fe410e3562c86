// The KV cache of one sequence, stored per (layer, KV head) so that heads can
// have their own ranks (compressed .zack models), precisions and token sets
// (eviction). Each block holds, for up to `capacity` slots in ascending
// position order, keys [slots x r_k] after RoPE (and after the R_qk projection
// when compressed), values [slots x r_v], the position of each slot and, when an
// eviction policy needs one, a score per slot. RoPE is applied before caching,
// so removing slots later needs no re-rotation.
//
// Precision (kv_cache_params::bits, or per (layer, KV head) and per side
// bits_k / bits_v): each side of a block is stored in a layout
// (engine/kv_layout.h; the formats in kernels/attention.h):
//   16  rows of `type` (F16 or F32).                     engine/kv_layout_rows.h
//   8   per token int8, blocks of 32 channels, f16 scale. engine/kv_layout_q8.h
//   1,0 values only: vector codes against the model's      engine/kv_layout_vq.h
//       codebooks (kv_cache_params::vq[bits]), windowed like KIVI
//   4,2 KIVI: keys per channel over groups of `group`     engine/kv_layout_kivi.h
//       tokens (8-bit scale + min codes per (group, channel), clipped
//       grids, two f16 steps per group), values per token (blocks
//       of KV_Q4_VBLOCK = 64 channels, the same 8-bit codes against the
//       group's steps). A block with a KIVI side is windowed:
//       the newest tokens stay in a residual window of `type` rows; when it
//       holds `residual` tokens its oldest `group` tokens are quantized (an
//       8-bit side of such a block then too). Optional GEAR on KIVI sides: per
//       quantized group a rank-k f16 correction plus ~2% f16 sparse outliers.
//       A prefill chunk's own queries see its rows before they are quantized
//       (append's hold, view_attend), as KIVI's prefill does.
// Exact sinks (kv_cache_params::sinks > 0): the tokens at positions < sinks are
// also kept as f32 rows of sink_dim channels (the full head dim), whatever the
// rank and precision; attention uses those rows for them (kernels/attention.h).
// A fixed cost per block, not per token.
// Eviction removes slots with compact(); a KIVI group that loses tokens keeps
// its codes and scales (exact), and two neighbouring groups that fit in one are
// merged by re-quantizing their tokens, so groups never exceed 2 x capacity /
// group + 1 and memory stays bounded.
// Positions: a cache without eviction (kv_cache_params::evicting false) holds
// consecutive positions from each block's first slot, one shared ramp for all
// blocks; an evicting one keeps each block's own (kv_block::pos).
// Memory is accounted per side by its layout (kv_layout::bytes), summed over
// the blocks, plus the shared ramp once: bytes_for_capacity equals what is
// allocated, exactly.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/kv_layout.h"
#include "engine/kv_select.h"
#include "ggml-like/dtype.h"
#include "kernels/attention.h"

namespace zk {

struct kv_cache_params {
    dtype type = dtype::F16;      // full-precision rows (16-bit sides, residual windows)
    int bits = 16;                // 16, 8, 4 or 2: every side whose bits_k / bits_v leave it open
    // Per (layer, KV head) precision of the keys and of the values, [n_layer x
    // n_head_kv] row-major, each 16, 8, 4 or 2; empty = `bits` everywhere.
    std::vector<int> bits_k;
    std::vector<int> bits_v;
    // Vector-coded values (bits_v 1 or 0; never keys, never `bits`): the model's
    // codebooks (engine/kv_vq.h) for each code, vq[1] (4 x 64) and vq[0] (8 x 256),
    // owned by the model; null where it has none.
    const kv_vq_books* vq[KV_VQ_CODES] = {nullptr, nullptr};
    int group = 32;               // KIVI: tokens per key quantization group
    int residual = 0;             // KIVI: full-precision window in tokens, a multiple of group
                                  // (0 = 128 rounded up to a multiple of group, at most half the capacity: kv_cache_residual)
    bool gear = false;            // KIVI sides: GEAR low-rank + sparse error correction
    int gear_rank = 2;
    float gear_outliers = 0.02f;  // fraction of a group's elements kept exactly
    bool scores = false;          // keep a per-slot eviction score
    bool evicting = false;        // slots will be removed (KIVI: room for partial groups)
    // 1-bit key tails (kernels/attention.h): the last channels of a KIVI key
    // side coded in one bit each, key_tail on every such side or per (layer,
    // KV head) in tails_k [n_layer x n_head_kv]; at most KV_KEY_TAIL_MAX, and
    // at most the side's rank (a head of a smaller rank is 1-bit throughout).
    // Sides that are not KIVI ignore them.
    int key_tail = 0;
    std::vector<int> tails_k;
    // 0-bit key channels (kernels/attention.h): the last channels of a KIVI key
    // side kept as their group's mean, key_zero on every such side or per head
    // in zeros_k; the 1-bit tail then comes before them. At most the side's rank.
    int key_zero = 0;
    std::vector<int> zeros_k;
    // 2-bit key channels (kernels/attention.h): on a 4-bit KIVI key side, the
    // channels before the 1-bit tail coded in 2 bits, key_mid on every such
    // side or per head in mids_k. At most the side's rank less its tail and
    // 0-bit channels; 2-bit and other sides ignore them.
    int key_mid = 0;
    std::vector<int> mids_k;
    // A tier (0 = none): in the blocks whose codes are narrower than 4 bits (a
    // KV plan's 2-, 1- and 0-bit key channels, 2-bit or vector-coded values),
    // the `tier` tokens before the residual window are kept as 4-bit KIVI
    // codes, and a group is coded at the block's own widths only when it leaves
    // the tier (from its 4-bit codes). Why: the tokens just past the window
    // draw much of the attention; on Qwen2.5-Coder-1.5B's 9.9% plan a tier of
    // 896 tokens cuts the KL at 8K by 3x (bench/RESULTS.md, 2026-12-07
    // "eleventh session"), for a fixed cost, not a per-token one. A multiple of
    // the group; not with eviction, GEAR or sliding-window layers.
    int tier = 0;
    int sinks = 0;                // first positions also kept exact (f32, full head dim)
    // Decode-time selection (engine/kv_select.h): a one-token decode step
    // attends to this many tokens' worth of each head's slots, plus the sinks
    // (KIVI keys: the groups with the highest estimates, and the residual
    // window; other keys: the pages with the most softmax mass); 0 = every slot.
    int64_t select = 0;
    // Steps one choice serves (kv_select_due): a step chooses afresh for the
    // layers it is due on, the others attend to their last choice plus the
    // tokens since. 1 = every step.
    int select_every = k_select_every;
    int sink_dim = 0;             // channels of an exact sink row; rows passed to append() have them
};

// Throws zk::error for unsupported combinations (bits 3, group <= 0, ...),
// naming the parameter. With n_layer and n_head_kv the per-head tables' sizes
// are checked too (the cache's constructor does).
void kv_cache_validate_params(const kv_cache_params& p, int n_layer = -1, int n_head_kv = -1);
// The precision of side `role` of block i (= layer * n_head_kv + head).
int kv_cache_bits(const kv_cache_params& p, kv_role role, size_t i);
// The 1-bit key tail asked for block i (before clamping to its rank).
int kv_cache_key_tail(const kv_cache_params& p, size_t i);
// The 0-bit key channels asked for block i (before clamping to its rank).
int kv_cache_key_zero(const kv_cache_params& p, size_t i);
// The 2-bit key channels asked for block i (before clamping).
int kv_cache_key_mid(const kv_cache_params& p, size_t i);
// Whether some side of the cache is quantized (below 16 bits).
bool kv_cache_quantized(const kv_cache_params& p);
// Whether some side is KIVI (4 or 2 bits) or vector-coded (1): blocks with one keep a residual window.
bool kv_cache_windowed(const kv_cache_params& p);
// Whether some value side is vector-coded (bits_v 1 or 0), and with value code `code`.
bool kv_cache_vq(const kv_cache_params& p);
bool kv_cache_vq(const kv_cache_params& p, int code);
// The KIVI residual window in tokens that p gives a cache of `capacity`
// slots (a multiple of the group).
int kv_cache_residual(const kv_cache_params& p, int64_t capacity);

// What kv_cache::append of n tokens does to one block, worked out without doing
// it (the CUDA backend replays it on its device copy of the block): runs of
// rows stored, and the groups quantized between them, in order.
struct kv_append_step {
    bool flush = false;
    // store: the call's rows [t0, t0 + n) go to slots [s0, s0 + n), which are
    //   window rows [rs0, rs0 + n) of a windowed block's quantizing sides
    //   (a non-windowed quantizing side quantizes each token at its slot)
    int64_t t0 = 0, n = 0, s0 = 0, rs0 = 0;
    // flush: window rows [0, group size) become group `group` at slots
    //   [s0, s0 + group size); the window's next `rest` rows move to its front
    int64_t group = 0, rest = 0;
};
struct kv_append_plan {
    std::vector<kv_append_step> steps;
    int64_t n_used = 0, n_quant = 0, n_groups = 0;  // the block's counts after the append
};

struct kv_block {
    int r_k = 0;
    int r_v = 0;
    int64_t capacity = 0; // slots this block holds (a sliding-window layer's may be fewer than the cache's)
    int64_t n_used = 0;   // slots in use
    int64_t n_quant = 0;  // slots [0, n_quant) are in the codes of the quantized sides
    int64_t n_groups = 0; // KIVI groups in use (windowed blocks)
    bool windowed = false;             // a side is KIVI: residual window and groups
    std::unique_ptr<kv_side> k, v;     // the two sides, each in its layout
    std::vector<int32_t> group_start;  // windowed: [max_groups + 1]
    // A tiered block (kv_cache_params::tier): slots [n_quant, n_quant + t_quant)
    // are 4-bit codes in tk, tv, which also hold the residual window (the rest);
    // k and v keep only their codes (their windows stage a group as it leaves
    // the tier). t_group_start: [tier groups + 2], tier-relative slots.
    bool tiered = false;
    std::unique_ptr<kv_side> tk, tv;
    int64_t t_quant = 0, t_groups = 0;
    std::vector<int32_t> t_group_start;
    attn_kv_view tier_view{};  // what view() points to past n_quant, kept current by every change
    // Slot s holds position pos[s] (ascending). An evicting cache's blocks own
    // theirs (pos_own, [capacity]); in a cache without eviction slot s holds
    // position pos_base + s in every block (slots leave only from the front, as
    // a sliding-window layer drops them), so pos points into the cache's one
    // ramp 0, 1, 2, ... at pos_base: 4 bytes a token per block saved (0.8% of
    // an f16 cache of Qwen2.5-1.5B's 128-dim heads, 1.6% of SmolLM2's 64-dim).
    const int32_t* pos = nullptr;
    std::vector<int32_t> pos_own;
    int64_t pos_base = 0;
    std::vector<float> score;          // [capacity] when params.scores
    std::vector<float> sink_k, sink_v; // [sinks x sink_dim] exact rows, row p = position p
    // Bumped by every change other than an append (compact, clear): a copy of
    // the block elsewhere (the CUDA backend's device mirror) copies it whole
    // again when this moves, and follows appends alone otherwise.
    uint64_t edits = 0;
    // The last decode-time choice of this head's runs (engine/kv_select.h),
    // for the steps it serves; stale once `edits` moves.
    kv_select_memo select_memo;
};

class kv_cache {
public:
    // ranks_k/ranks_v: [n_layer x n_head_kv] (row-major). A KIVI side rounds
    // the capacity up to a multiple of the group.
    // layer_capacity (optional, [n_layer]): layers that hold fewer slots (0 =
    // `capacity`), as sliding-window layers do: only their window and the
    // next chunk (engine/session.cpp drops the slots the window has left).
    kv_cache(int n_layer, int n_head_kv, int64_t capacity, const kv_cache_params& p,
             const std::vector<int>& ranks_k, const std::vector<int>& ranks_v,
             const std::vector<int64_t>& layer_capacity = {});
    // A plain 16-bit cache of `type`.
    kv_cache(int n_layer, int n_head_kv, int64_t capacity, dtype type, const std::vector<int>& ranks_k,
             const std::vector<int>& ranks_v);

    // Unique within the process (a copy elsewhere, the CUDA backend's device
    // mirror, tells caches apart by it, not by address).
    uint64_t id() const { return id_; }
    int n_layer() const { return n_layer_; }
    int n_head_kv() const { return n_head_kv_; }
    int64_t capacity() const { return capacity_; }  // of the largest block
    dtype type() const { return p_.type; }
    const kv_cache_params& params() const { return p_; }
    // Without eviction: the positions every block reads, [capacity()] 0, 1, 2,
    // ... (kv_block::pos points into it); nullptr in an evicting cache.
    const int32_t* ramp() const { return ramp_.empty() ? nullptr : ramp_.data(); }
    kv_block& block(int layer, int head) { return blocks_[(size_t)layer * n_head_kv_ + head]; }
    const kv_block& block(int layer, int head) const { return blocks_[(size_t)layer * n_head_kv_ + head]; }
    // Slots in use in the fullest block.
    int64_t n_used_max() const;
    // The layout of block (layer, head)'s keys and values.
    kv_layout_id layout_k(int layer, int head) const { return block(layer, head).k->layout(); }
    kv_layout_id layout_v(int layer, int head) const { return block(layer, head).v->layout(); }

    // Appends n_tok rows: k_rows[t * k_stride + c] for c < r_k, likewise v; pos[t]
    // (ascending, above the block's last position; without eviction the next
    // position, else it throws). New slots get score 0. With exact sinks, rows
    // of positions < sinks must have sink_dim channels. Appends (and compacts)
    // on different KV heads may run at once: each head re-packs in its own
    // scratch.
    // hold: the rows are a prefill chunk whose own queries attend to the block
    // next (view_attend): a windowed block then keeps aside, for them, its
    // residual window as it was before this call followed by the chunk's rows,
    // all at full precision, while the append quantizes groups as it always
    // does. Why: KIVI's prefill attends before it quantizes; quantizing first
    // gave a chunk's early queries fewer exact neighbours than a decode step
    // has: on Qwen2.5-Coder-1.5B at 4K, a quarter to a third of a 10% plan's
    // KL (bench/RESULTS.md, 2026-12-03 "prefill chunks"). A tiered block keeps its
    // tier as it was too (a copy when the append may move a group out of it).
    void append(int layer, int head, int64_t n_tok, const float* k_rows, int64_t k_stride,
                const float* v_rows, int64_t v_stride, const int32_t* pos, bool hold = false);
    // Whether append(layer, head, n_tok, ...) quantizes a group (a KIVI or
    // vector-coded side's residual window fills): the appends worth spreading
    // over threads.
    bool append_flushes(int layer, int head, int64_t n_tok) const;
    attn_kv_view view(int layer, int head) const;
    // What the queries of the chunk last appended to block (layer, head) with
    // hold attend to: view() with the groups that chunk quantized read from
    // the rows kept aside instead (slots [0, n_quant before the append) in
    // their codes, every later slot a full-precision row: the window then,
    // then the chunk). Equals view() when the block's last change was not
    // such an append (or the block has no window).
    attn_kv_view view_attend(int layer, int head) const;
    // Whether view_attend(layer, head) reads rows kept aside, and whether p is
    // one of those arrays (the CUDA backend copies them to the device).
    bool held(int layer, int head) const;
    bool held_rows(int head, const void* p) const {
        return p && (p == held_[(size_t)head].k.data() || p == held_[(size_t)head].v.data());
    }
    // What append(layer, head, n_tok, ...) will do (kv_append_plan), by the
    // same rules; throws as append does when the block is full.
    kv_append_plan append_plan(int layer, int head, int64_t n_tok) const;
    // The view append(layer, head, ...) will leave, over the same arrays, for
    // the counts of plan (positions of the new slots not yet written).
    attn_kv_view view_after(int layer, int head, const kv_append_plan& plan) const;
    // Keeps the slots s < n_used with keep[s] != 0, in order; the rest are freed.
    // Without eviction only the oldest slots may go (a sliding window), else it throws.
    void compact(int layer, int head, const uint8_t* keep);
    // Keys and values of slot s as the attention kernel sees them (tests, re-packing).
    void read_slot(int layer, int head, int64_t s, float* k, float* v) const;
    // Slots [s0, s1) of one side (key: keys, else values) of block (layer, head)
    // dequantized, X [(s1 - s0) x r] f32 (GEAR's correction included). Every slot
    // must be below the block's n_quant: the codes of view() and of view_attend(),
    // whose first n_quant slots are the block's. Reads whole KIVI groups (a
    // group's codes share its grids); a group the range cuts goes through the
    // stack.
    void read_quant(int layer, int head, bool key, int64_t s0, int64_t s1, float* X) const;
    // The same for a tiered block's tier: its slots [s0, s1) (the block's
    // n_quant + s0 ...), below its t_quant.
    // attend: the tier as view_attend shows it (before a held append).
    void read_tier_quant(int layer, int head, bool key, int64_t s0, int64_t s1, float* X, bool attend = false) const;

    void clear();
    // Bytes held by every block's arrays (what is allocated).
    size_t bytes_allocated() const;
    // The same total computed from the layout for a given capacity (accounting;
    // layers with a smaller capacity of their own stay at it).
    size_t bytes_for_capacity(int64_t capacity) const;
    // Bytes one more token held in every block costs, summed over every (layer,
    // head), scales, positions and scores included (rounded up; exact: the
    // double). Sliding-window layers count too: they hold fewer tokens, not
    // cheaper ones (eval's tokens-kept meter counts what each block holds).
    size_t bytes_per_token() const;
    double bytes_per_token_exact() const;
    // An f16 cache of K and V at full head dim, per token over all heads.
    size_t bytes_per_token_f16(int head_dim) const { return (size_t)n_layer_ * n_head_kv_ * 4 * head_dim; }
    // One line: precision (per head when the sides differ), layout, bytes per
    // token and vs f16 full rank.
    std::string describe(int head_dim) const;

private:
    uint64_t id_;
    void flush_group(kv_block& b, int head);
    void flush_tier(kv_block& b, int head);
    void demote_group(kv_block& b, int head);
    void tier_refresh(kv_block& b) const;
    attn_kv_view tier_view_of(const kv_block& b, int64_t n_quant, const kv_side& tk, const kv_side& tv,
                              int64_t t_quant, int64_t t_groups, const int32_t* starts) const;
    bool block_tiered(size_t i) const;
    // Block i's key channels at 0 bits (last), 1 bit and 2 bits (before them)
    // in `layout`, clamped to its rank: what its key side is built with.
    struct key_parts {
        int zero = 0, tail = 0, mid = 0;
    };
    key_parts block_key_parts(size_t i, const kv_layout& layout) const;
    int64_t plan_capacity(int64_t capacity) const;  // the codes' slots of a tiered block of `capacity`
    kv_side_shape tier_shape(kv_role role, size_t i, int64_t capacity) const;
    void merge_groups(kv_block& b, int head, int64_t g);
    // What side `role` of block i in `layout` is built for, at a capacity.
    kv_side_shape side_shape(kv_role role, size_t i, const kv_layout& layout, int64_t capacity) const;
    size_t block_bytes(size_t i, int64_t capacity) const;
    int64_t max_groups(int64_t capacity) const;
    int64_t round_capacity(int64_t capacity) const;
    // The capacity block i has in a cache of `capacity` slots.
    int64_t block_capacity(size_t i, int64_t capacity) const;
    // Every block's bytes at `capacity` slots, layers with a capacity of their
    // own held at it (own_capacities) or not (the per-token cost).
    size_t bytes_at(int64_t capacity, bool own_capacities) const;

    int n_layer_;
    int n_head_kv_;
    int64_t capacity_;
    kv_cache_params p_;
    bool windowed_ = false;  // some block has a KIVI side
    int residual_ = 0;
    std::vector<int64_t> layer_cap_;  // [n_layer] a layer's own capacity, 0 = the cache's
    std::vector<kv_block> blocks_;
    std::vector<int32_t> ramp_;   // [capacity_] 0, 1, 2, ...: the positions of a cache without eviction
    // The rows an append with hold keeps aside, per KV head (appends to a
    // layer's heads may run at once): the block (layer, head) they serve while
    // its n_used and edits are still these, its counts before that append, and
    // each quantizing side's window rows then plus the chunk's, [rows x r] of
    // the cache's type. Scratch: not counted in bytes_allocated; it grows to
    // the longest chunk once.
    struct kv_held {
        int layer = -1;
        int64_t n_used = 0, n_quant = 0, n_groups = 0;
        uint64_t edits = 0;
        std::vector<uint8_t> k, v;
        // A tiered block: its tier before the append (a group leaving the tier
        // moves the tier's codes down, so an append that may overflow it keeps
        // a copy, t_copy) and what the chunk's queries read past the block's codes.
        bool t_copy = false;
        std::unique_ptr<kv_side> tk, tv;
        std::vector<int32_t> t_group_start;
        int64_t t_quant = 0, t_groups = 0;
        attn_kv_view tier_view{};
    };
    std::vector<kv_held> held_;
    void hold_tier(const kv_block& b, kv_held& h, int64_t n_leave) const;
    void hold_tier_view(const kv_block& b, kv_held& h) const;
    std::vector<float> scratch_;  // re-packing: [n_head_kv x scratch_head_]
    size_t scratch_head_ = 0;     // a head's: [2 x group x r] floats + GEAR work
};

}  // namespace zk
