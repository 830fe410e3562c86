// KV cache layouts: how one side (the keys or the values) of one (layer, KV
// head) block of the cache is stored. Each layout is a type (a kv_side
// subclass in its own file pair) and a row of one table (kv_layout_get), so the
// cache (engine/kv_cache.cpp) never switches on a precision: keys and values of
// a block each get a layout, and blocks differ freely (4-bit keys and 2-bit
// values in one head, 16-bit both in the next).
//   KV_LAYOUT_ROWS  engine/kv_layout_rows.h   16-bit: rows of the cache's type (F16, or F32)
//   KV_LAYOUT_Q8    engine/kv_layout_q8.h     8-bit per token
//   KV_LAYOUT_Q4    engine/kv_layout_kivi.h   4-bit KIVI (keys per channel over groups, values per token)
//   KV_LAYOUT_Q2    engine/kv_layout_kivi.h   2-bit KIVI
//   KV_LAYOUT_VQ    engine/kv_layout_vq.h     vector codes (values only; kv_bits 1 and 0, engine/kv_vq.h)
// Block structure shared by its two sides (engine/kv_cache.h): when either side
// is KIVI the block is "windowed": the newest tokens wait in a residual window
// of full-precision rows and leave it `group` at a time as a quantized group;
// slots [0, n_quant) are quantized, the rest in the window. A quantizing side of
// a block that is not windowed (8-bit) quantizes each token as it arrives.
// The kernels read a side through attn_side_view (kernels/attention.h).
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "engine/kv_vq.h"
#include "ggml-like/dtype.h"
#include "kernels/attention.h"

namespace zk {

enum kv_role : int { KV_ROLE_KEYS = 0, KV_ROLE_VALUES = 1 };

// What one side's storage is built for.
struct kv_side_shape {
    kv_role role = KV_ROLE_KEYS;
    int r = 0;                  // channels: r_k or r_v
    dtype type = dtype::F16;    // full-precision rows (a rows side, a residual window)
    int64_t capacity = 0;       // slots
    // windowed blocks (residual > 0): the window's rows, tokens per group, groups at most
    int residual = 0;
    int group = 0;
    int64_t max_groups = 0;
    // GEAR on a KIVI side (gear_rank 0 and no outliers: off)
    bool gear = false;
    int gear_rank = 0;
    float gear_outliers = 0;
    // KIVI keys: `tail` channels in 1-bit codes before the last `zero` channels,
    // which have none (kernels/attention.h; 0: none)
    int tail = 0;
    int zero = 0;
    // 4-bit KIVI keys: `mid` channels in 2-bit codes before the tail (0: none)
    int mid = 0;
    // vector-coded values: the model's books and this block's
    const kv_vq_books* vq = nullptr;
    const kv_vq_book* vq_head = nullptr;
};

// A group of quantized slots as a side sees it: group g holds the n slots from s0.
struct kv_group_ref {
    int64_t g;
    int64_t s0;
    int n;
};

// The storage of one side of one block. Slot indices are the block's; rows x
// have shape.r floats.
class kv_side {
public:
    virtual ~kv_side() = default;
    virtual kv_layout_id layout() const = 0;
    // Slot s gets row x. In a windowed block rs = s - n_quant is the slot's row
    // in the residual window.
    virtual void append(int64_t s, int64_t rs, const float* x) = 0;
    // Windowed block: the window's oldest gr.n rows become group gr at slots
    // [gr.s0, gr.s0 + gr.n), its next `rest` rows move to the front. X: room for
    // group x r floats; work: GEAR's (kvq_gear_work).
    virtual void flush(const kv_group_ref& gr, int64_t rest, float* X, float* work) = 0;
    // Slot s as the kernel sees it, x [r]: n_quant is the block's; gr the group
    // holding s when s < n_quant in a windowed block.
    virtual void read(int64_t s, int64_t n_quant, const kv_group_ref& gr, float* x) const = 0;
    // Whether the codes depend on the group (KIVI): merged groups are then
    // re-quantized (read_group, requantize); other layouts keep theirs.
    virtual bool regroups() const { return false; }
    // Group gr dequantized (with its GEAR correction), X [gr.n x r].
    virtual void read_group(const kv_group_ref& gr, float* X) const { (void)gr, (void)X; }
    // X [gr.n x r] quantized as group gr (a merge: gr.n tokens from slot gr.s0).
    virtual void requantize(const kv_group_ref& gr, const float* X, float* work) { (void)gr, (void)X, (void)work; }
    // Compaction (slots only move down, in order): quantized slot s of group g
    // (index t in it) moves to slot w of group ng (index tn); g = ng = -1 when
    // the block is not windowed.
    virtual void move_quant(int64_t s, int64_t w, int64_t g, int t, int64_t ng, int tn) = 0;
    // Group g becomes group ng; newt[t] = the new index in the group of its old
    // slot t, -1 when evicted (old size n).
    virtual void move_group(int64_t g, int64_t ng, const int16_t* newt, int n) {
        (void)g, (void)ng, (void)newt, (void)n;
    }
    // The oldest n_groups groups (their n_slots slots) leave a windowed side of
    // `groups` groups over `slots` slots without GEAR: the rest move down, in
    // order (a tier's oldest group leaving it; a tier's sides are KIVI, and
    // other layouts throw).
    virtual void drop_front(int64_t n_slots, int64_t n_groups, int64_t slots, int64_t groups);
    // A full-precision slot s (window row rs in a windowed block) moves to slot w (window row rw).
    virtual void move_tail(int64_t s, int64_t w, int64_t rs, int64_t rw) = 0;
    virtual attn_side_view view(int64_t n_quant) const = 0;
    virtual size_t bytes_allocated() const = 0;
    // dst <- a copy of this side (its storage reused when dst is one of the same
    // layout and shape): what a held append keeps of a tier it changes. Layouts
    // without it throw.
    virtual void copy_into(std::unique_ptr<kv_side>& dst) const;
};

// A layout: a row of the table.
struct kv_layout {
    kv_layout_id id;
    int bits;            // precision as --kv-bits spells it: 16 (rows of the cache's type), 8, 4, 2;
                         // 1: vector codes (values only, about 1.6 bits an element at 4 x 64;
                         // kv_layout_for_bits(0) too, 8 x 256 books)
    const char* name;    // "16-bit", "8-bit", "4-bit", "2-bit", "vector-coded"
    bool windowed;       // the block keeps a residual window and groups (KIVI)
    bool gear;           // takes GEAR's correction
    // Bytes create(s) allocates.
    size_t (*bytes)(const kv_side_shape& s);
    std::unique_ptr<kv_side> (*create)(const kv_side_shape& s);
    // A cache of this layout alone, in words (s: the group, window, type, GEAR).
    std::string (*describe)(const kv_side_shape& s);
};

const kv_layout& kv_layout_get(kv_layout_id id);
// The layout of a precision in bits, nullptr when there is none.
const kv_layout* kv_layout_for_bits(int bits);
// The precisions there are, for messages: "16, 8, 4 or 2".
const char* kv_layout_bits_list();

// ---- helpers the layouts share ----

size_t kv_elem_size(dtype t);
// One row of r floats to `t` (F16 or F32) and back.
void kv_store_row(dtype t, const float* src, uint8_t* dst, int r);
void kv_load_row(dtype t, const uint8_t* src, float* dst, int r);

// Moves row `from` of a [.. x row] array to row `to` (nothing when equal).
template <class T>
void kv_move_rows(T* a, int64_t row, int64_t from, int64_t to) {
    if (from != to) std::memmove(a + to * row, a + from * row, sizeof(T) * row);
}

}  // namespace zk
