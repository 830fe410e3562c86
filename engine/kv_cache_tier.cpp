// A 4-bit tier before the residual window (kv_cache_params::tier): which
// blocks have one, its shape, how groups move through it, and what a held
// prefill chunk reads of it. The rest of the cache: kv_cache.cpp.
#include <algorithm>

#include "engine/kv_cache.h"
#include "engine/kv_layout_kivi.h"
#include "ggml-like/error.h"

namespace zk {

int64_t kv_cache::plan_capacity(int64_t capacity) const {
    // slots [0, n_quant) with n_quant <= n_used - tier whenever n_quant > 0
    return std::max<int64_t>(capacity - p_.tier, p_.group);
}

kv_side_shape kv_cache::tier_shape(kv_role role, size_t i, int64_t capacity) const {
    // 4-bit KIVI over the tier and a group more (a group joins before the oldest
    // leaves), no more than the block holds, with the residual window
    kv_side_shape s;
    s.role = role;
    s.r = role == KV_ROLE_KEYS ? blocks_[i].r_k : blocks_[i].r_v;
    s.type = p_.type;
    s.capacity = std::min<int64_t>(p_.tier + p_.group, capacity);
    s.residual = residual_;
    s.group = p_.group;
    s.max_groups = s.capacity / p_.group;
    return s;
}

// The window's oldest group joins a tiered block's tier; the tier's oldest
// group leaves it when it is full.
void kv_cache::flush_tier(kv_block& b, int head) {
    const int G = p_.group;
    float* X = scratch_.data() + (size_t)head * scratch_head_;
    float* work = X + 2 * (size_t)G * std::max(b.r_k, b.r_v);
    const kv_group_ref tg{b.t_groups, b.t_quant, G};
    b.t_group_start[b.t_groups] = (int32_t)b.t_quant;
    const int64_t rest = b.n_used - b.n_quant - b.t_quant - G;
    b.tk->flush(tg, rest, X, work);
    b.tv->flush(tg, rest, X, work);
    b.t_groups++;
    b.t_quant += G;
    b.t_group_start[b.t_groups] = (int32_t)b.t_quant;
    if (b.t_quant > p_.tier) demote_group(b, head);
}

// The tier's oldest group, decoded from its 4-bit codes, becomes the block's
// next group at its own widths (staged in the sides' one-group windows); the
// tier's codes and grids move down a group.
void kv_cache::demote_group(kv_block& b, int head) {
    const int G = p_.group;
    ZK_ASSERT(b.t_groups >= 2 && b.t_group_start[1] == G);
    const int64_t g = b.n_groups;
    ZK_ASSERT(b.n_quant + G <= plan_capacity(b.capacity));
    const size_t rm = std::max(b.r_k, b.r_v);
    float* X = scratch_.data() + (size_t)head * scratch_head_;
    float* work = X + 2 * (size_t)G * rm;  // (GEAR's; a tiered cache has none)
    float* Y = X + (size_t)G * rm;
    const kv_group_ref oldest{0, 0, G}, gr{g, b.n_quant, G};
    for (int side = 0; side < 2; side++) {
        kv_side& from = side == 0 ? *b.tk : *b.tv;
        kv_side& to = side == 0 ? *b.k : *b.v;
        const int r = side == 0 ? b.r_k : b.r_v;
        from.read_group(oldest, Y);
        for (int t = 0; t < G; t++) to.append(b.n_quant + t, t, Y + (size_t)t * r);
        to.flush(gr, 0, X, work);
        from.drop_front(G, 1, b.t_quant, b.t_groups);
    }
    b.group_start[g] = (int32_t)b.n_quant;
    b.n_groups++;
    b.n_quant += G;
    b.group_start[b.n_groups] = (int32_t)b.n_quant;
    for (int64_t tg = 0; tg < b.t_groups; tg++) b.t_group_start[tg] = b.t_group_start[tg + 1] - G;
    b.t_groups--;
    b.t_quant -= G;
}

// What attention reads past a block's n_quant codes: a tier's first t_quant
// slots coded in tk, tv (groups from starts[0..t_groups]), then window rows.
attn_kv_view kv_cache::tier_view_of(const kv_block& b, int64_t n_quant, const kv_side& tk, const kv_side& tv,
                                    int64_t t_quant, int64_t t_groups, const int32_t* starts) const {
    attn_kv_view t{};
    t.type = p_.type;
    t.pos = b.pos + n_quant;
    t.n_slots = b.n_used - n_quant;
    t.r_k = b.r_k;
    t.r_v = b.r_v;
    t.k = tk.view(t_quant);
    t.v = tv.view(t_quant);
    t.group = p_.group;
    t.n_groups = t_groups;
    t.group_start = starts;
    return t;
}

// The tier's view as it is now (after every change to the block).
void kv_cache::tier_refresh(kv_block& b) const {
    b.tier_view = tier_view_of(b, b.n_quant, *b.tk, *b.tv, b.t_quant, b.t_groups, b.t_group_start.data());
}

// Before a held append: the tier as the chunk's queries read it. Groups only
// join the block's codes and the tier's end unless the tier overflows (at most
// n_leave tokens leave the window), which moves its codes down: then a copy.
void kv_cache::hold_tier(const kv_block& b, kv_held& h, int64_t n_leave) const {
    h.t_copy = b.t_quant + n_leave > p_.tier;
    if (h.t_copy) {
        b.tk->copy_into(h.tk);
        b.tv->copy_into(h.tv);
    }
    h.t_group_start.assign(b.t_group_start.begin(), b.t_group_start.begin() + b.t_groups + 1);
    h.t_quant = b.t_quant;
    h.t_groups = b.t_groups;
}

// After it: what they read past the block's codes, the tier before the append,
// then its window rows and the chunk's (h.k, h.v).
void kv_cache::hold_tier_view(const kv_block& b, kv_held& h) const {
    h.tier_view = tier_view_of(b, h.n_quant, h.t_copy ? *h.tk : *b.tk, h.t_copy ? *h.tv : *b.tv, h.t_quant,
                               h.t_groups, h.t_group_start.data());
    h.tier_view.k.rows = h.k.data();
    h.tier_view.v.rows = h.v.data();
}

}  // namespace zk
