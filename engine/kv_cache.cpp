#include "engine/kv_cache.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "engine/kv_layout_kivi.h"
#include "engine/kv_quant.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

const kv_layout& layout_of(const kv_cache_params& p, kv_role role, size_t i) {
    return *kv_layout_for_bits(kv_cache_bits(p, role, i));
}

// Every precision the parameters name: `bits` where a table is empty, and the tables' entries.
template <class F>
bool any_bits(const kv_cache_params& p, F&& pred) {
    if ((p.bits_k.empty() || p.bits_v.empty()) && pred(p.bits)) return true;
    for (int b : p.bits_k)
        if (pred(b)) return true;
    for (int b : p.bits_v)
        if (pred(b)) return true;
    return false;
}

bool is_kivi(int bits) {
    const kv_layout* l = kv_layout_for_bits(bits);
    return l && l->windowed;
}

void validate_table(const std::vector<int>& t, const char* name, const char* what, int n_layer, int n_head_kv,
                    bool values = false) {
    if (t.empty()) return;
    if (n_layer > 0 && n_head_kv > 0 && t.size() != (size_t)n_layer * n_head_kv)
        ZK_THROW("%s (the %s precision per head) has %zu entries; it needs %d (%d layers x %d KV heads) or none", name,
                 what, t.size(), n_layer * n_head_kv, n_layer, n_head_kv);
    const char* list = values ? "16, 8, 4, 2, or 1 or 0 (vector codes)" : kv_layout_bits_list();
    for (size_t i = 0; i < t.size(); i++) {
        if (kv_layout_for_bits(t[i]) && (values || !kv_bits_vq(t[i]))) continue;
        if (n_head_kv > 0)
            ZK_THROW("%s[%zu] (layer %zu, KV head %zu) is %d; a %s precision is %s bits", name, i, i / n_head_kv,
                     i % n_head_kv, t[i], what, list);
        ZK_THROW("%s[%zu] is %d; a %s precision is %s bits", name, i, t[i], what, list);
    }
}

// Key channels below the side's bits (1-bit tails, 0-bit channels): one count
// for every side (param, e.g. kv.key_tail) or one per head (table), each 0 to
// `max`; GEAR corrects neither.
void check_key_channels(const char* param, const char* table_name, const char* what, const char* plural, int all,
                        const std::vector<int>& table, int max, bool gear, int n_layer, int n_head_kv) {
    if (all < 0 || all > max)
        ZK_THROW_PARAM(param, "%s (%s) must be between 0 and %d, got %d", param, what, max, all);
    if (!table.empty() && n_layer > 0 && n_head_kv > 0 && table.size() != (size_t)n_layer * n_head_kv)
        ZK_THROW("%s (%s per head) has %zu entries; it needs %d (%d layers x %d KV heads) or none", table_name, what,
                 table.size(), n_layer * n_head_kv, n_layer, n_head_kv);
    for (size_t i = 0; i < table.size(); i++)
        if (table[i] < 0 || table[i] > max)
            ZK_THROW("%s[%zu] is %d; %s are 0 to %d", table_name, i, table[i], what, max);
    const bool any = all > 0 || std::any_of(table.begin(), table.end(), [](int t) { return t > 0; });
    if (any && gear) ZK_THROW_PARAM("kv.gear", "kv.gear does not correct %s; drop one of them", plural);
}

}  // namespace

int kv_cache_bits(const kv_cache_params& p, kv_role role, size_t i) {
    const std::vector<int>& t = role == KV_ROLE_KEYS ? p.bits_k : p.bits_v;
    return t.empty() ? p.bits : t[i];
}

int kv_cache_key_tail(const kv_cache_params& p, size_t i) { return p.tails_k.empty() ? p.key_tail : p.tails_k[i]; }
int kv_cache_key_zero(const kv_cache_params& p, size_t i) { return p.zeros_k.empty() ? p.key_zero : p.zeros_k[i]; }
int kv_cache_key_mid(const kv_cache_params& p, size_t i) { return p.mids_k.empty() ? p.key_mid : p.mids_k[i]; }

bool kv_cache_quantized(const kv_cache_params& p) {
    return any_bits(p, [](int b) { return b < 16; });
}

bool kv_cache_windowed(const kv_cache_params& p) { return any_bits(p, is_kivi); }

bool kv_cache_vq(const kv_cache_params& p) {
    for (int b : p.bits_v)
        if (kv_bits_vq(b)) return true;
    return false;
}

bool kv_cache_vq(const kv_cache_params& p, int code) {
    for (int b : p.bits_v)
        if (b == code) return true;
    return false;
}

int kv_cache_residual(const kv_cache_params& p, int64_t capacity) {
    if (p.residual > 0) return p.residual;
    // KIVI's window: 128 tokens (the newest tokens draw much of the attention,
    // and the window is a fixed cost, not a per-token one), but never more than
    // half of a small cache
    const int64_t g = p.group, w = (std::max<int64_t>(128, g) + g - 1) / g * g;
    return (int)std::max(g, std::min(w, capacity / 2 / g * g));
}

void kv_cache_validate_params(const kv_cache_params& p, int n_layer, int n_head_kv) {
    if (p.type != dtype::F32 && p.type != dtype::F16)
        ZK_THROW_PARAM("kv.type", "kv.type %s is not supported (f32, f16)", dtype_name(p.type));
    if (!kv_layout_for_bits(p.bits) || kv_bits_vq(p.bits))
        ZK_THROW_PARAM("kv.bits", "kv.bits must be %s, got %d", kv_layout_bits_list(), p.bits);
    validate_table(p.bits_k, "kv_bits_k", "key", n_layer, n_head_kv);
    validate_table(p.bits_v, "kv_bits_v", "value", n_layer, n_head_kv, true);
    // the codebooks themselves: the cache's constructor (a session supplies the model's)
    if (kv_cache_vq(p) && p.gear)
        ZK_THROW_PARAM("kv.gear", "kv.gear corrects 4- and 2-bit codes, not vector-coded values");
    if (kv_cache_windowed(p)) {
        if (p.group <= 0 || p.group > 256)
            ZK_THROW_PARAM("kv.group", "kv.group must be between 1 and 256 tokens, got %d", p.group);
        if (p.residual < 0 || (p.residual > 0 && p.residual % p.group != 0))
            ZK_THROW_PARAM("kv.residual", "kv.residual must be a positive multiple of the group (%d), got %d", p.group,
                           p.residual);
    }
    check_key_channels("kv.key_tail", "kv_tails_k", "1-bit key channels", "1-bit key tails", p.key_tail, p.tails_k,
                       KV_KEY_TAIL_MAX, p.gear, n_layer, n_head_kv);
    check_key_channels("kv.key_zero", "kv_zeros_k", "0-bit key channels", "0-bit key channels", p.key_zero, p.zeros_k,
                       KV_KEY_MAX_R, p.gear, n_layer, n_head_kv);
    check_key_channels("kv.key_mid", "kv_mids_k", "2-bit key channels", "2-bit key channels", p.key_mid, p.mids_k,
                       KV_KEY_MAX_R, p.gear, n_layer, n_head_kv);
    if (p.tier < 0 || (p.tier > 0 && (p.group <= 0 || p.tier % p.group != 0)))
        ZK_THROW_PARAM("kv.tier", "kv.tier must be 0 or a positive multiple of the group (%d tokens), got %d", p.group,
                       p.tier);
    if (p.tier > 0) {  // (whether any block has narrow codes: the cache, once a plan has set them)
        if (p.evicting) ZK_THROW_PARAM("kv.tier", "kv.tier does not combine with eviction; drop one of them");
        if (p.gear) ZK_THROW_PARAM("kv.tier", "kv.tier does not combine with kv.gear; drop one of them");
    }
    if (p.select < 0) ZK_THROW_PARAM("kv.select", "kv.select must be a number of tokens, got %lld", (long long)p.select);
    if (p.select_every < 1 || p.select_every > 1024)
        ZK_THROW_PARAM("kv.select_every", "kv.select_every must be between 1 and 1024 steps, got %d", p.select_every);
    if (p.sinks < 0 || p.sinks > 64)
        ZK_THROW_PARAM("kv.sinks", "kv.sinks must be between 0 and 64 tokens, got %d", p.sinks);
    if (p.gear) {
        if (!kv_cache_windowed(p))
            ZK_THROW_PARAM("kv.gear", "kv.gear corrects 4- and 2-bit quantization; it needs kv.bits 4 or 2 (got %d)",
                           p.bits);
        if (p.gear_rank < 0 || p.gear_rank > 16)
            ZK_THROW_PARAM("kv.gear_rank", "kv.gear_rank must be between 0 and 16, got %d", p.gear_rank);
        if (!(p.gear_outliers >= 0 && p.gear_outliers < 0.5f))
            ZK_THROW_PARAM("kv.gear_outliers", "kv.gear_outliers (GEAR's outlier fraction) must be in [0, 0.5), got %g",
                           p.gear_outliers);
    }
}

// ---- construction and accounting ----

int64_t kv_cache::max_groups(int64_t capacity) const {
    // With eviction two neighbouring groups always hold more than `group` tokens
    // after compaction (else they are merged), hence at most 2 C / G + 1 groups.
    return p_.evicting ? 2 * capacity / p_.group + 1 : capacity / p_.group;
}

int64_t kv_cache::round_capacity(int64_t capacity) const {
    return windowed_ ? (capacity + p_.group - 1) / p_.group * p_.group : capacity;
}

kv_side_shape kv_cache::side_shape(kv_role role, size_t i, const kv_layout& layout, int64_t capacity) const {
    kv_side_shape s;
    s.role = role;
    s.r = role == KV_ROLE_KEYS ? blocks_[i].r_k : blocks_[i].r_v;
    s.type = p_.type;
    // a tiered block's codes end where its tier begins: never in the last `tier` slots
    const bool tiered = block_tiered(i);
    if (tiered) capacity = plan_capacity(capacity);
    s.capacity = capacity;
    if (layout_of(p_, KV_ROLE_KEYS, i).windowed || layout_of(p_, KV_ROLE_VALUES, i).windowed) {
        // a tiered block's window is its tier's; its own sides stage one group
        s.residual = tiered ? p_.group : residual_;
        s.group = p_.group;
        s.max_groups = max_groups(capacity);
    }
    if (role == KV_ROLE_KEYS) {
        const key_parts kp = block_key_parts(i, layout);
        s.zero = kp.zero, s.tail = kp.tail, s.mid = kp.mid;
    }
    if (layout.id == KV_LAYOUT_VQ) {
        s.vq = p_.vq[kv_cache_bits(p_, role, i)];
        s.vq_head = &s.vq->heads[i];
    }
    if (p_.gear && layout.gear) {
        s.gear = true;
        s.gear_rank = p_.gear_rank;
        s.gear_outliers = p_.gear_outliers;
    }
    return s;
}

bool kv_cache::block_tiered(size_t i) const {
    if (p_.tier <= 0) return false;
    const kv_layout &lk = layout_of(p_, KV_ROLE_KEYS, i), &lv = layout_of(p_, KV_ROLE_VALUES, i);
    // both sides coded at group boundaries (KIVI or vector codes), one narrower than 4 bits
    const bool coded = (lk.windowed || lk.id == KV_LAYOUT_VQ) && (lv.windowed || lv.id == KV_LAYOUT_VQ);
    if (!coded) return false;
    const key_parts kp = block_key_parts(i, lk);
    return lk.id == KV_LAYOUT_Q2 || kp.zero + kp.tail + kp.mid > 0 || lv.id != KV_LAYOUT_Q4;
}

kv_cache::key_parts kv_cache::block_key_parts(size_t i, const kv_layout& layout) const {
    key_parts kp;
    if (!layout.windowed) return kp;  // only KIVI keys have parts
    const int r = blocks_[i].r_k;
    kp.zero = std::min(kv_cache_key_zero(p_, i), r);
    kp.tail = std::min(kv_cache_key_tail(p_, i), r - kp.zero);
    if (layout.id == KV_LAYOUT_Q4) kp.mid = std::min(kv_cache_key_mid(p_, i), r - kp.zero - kp.tail);
    return kp;
}

int64_t kv_cache::block_capacity(size_t i, int64_t capacity) const {
    const int64_t own = layer_cap_.empty() ? 0 : layer_cap_[i / n_head_kv_];
    return own > 0 ? std::min(own, capacity) : capacity;
}

size_t kv_cache::block_bytes(size_t i, int64_t C) const {
    size_t s = (p_.evicting ? (size_t)C * sizeof(int32_t) : 0) + (p_.scores ? (size_t)C * sizeof(float) : 0);
    s += (size_t)p_.sinks * 2 * p_.sink_dim * sizeof(float);  // exact sinks (fixed)
    const kv_layout &lk = layout_of(p_, KV_ROLE_KEYS, i), &lv = layout_of(p_, KV_ROLE_VALUES, i);
    if (lk.windowed || lv.windowed) s += (size_t)(max_groups(C) + 1) * sizeof(int32_t);  // group starts
    if (block_tiered(i)) {  // the tier: a fixed cost
        const kv_layout& l4 = kv_layout_q4();
        s += l4.bytes(tier_shape(KV_ROLE_KEYS, i, C)) + l4.bytes(tier_shape(KV_ROLE_VALUES, i, C)) +
             (size_t)(p_.tier / p_.group + 2) * sizeof(int32_t);
    }
    return s + lk.bytes(side_shape(KV_ROLE_KEYS, i, lk, C)) + lv.bytes(side_shape(KV_ROLE_VALUES, i, lv, C));
}

namespace {
uint64_t next_cache_id() {
    static std::atomic<uint64_t> n{0};
    return ++n;
}
}  // namespace

kv_cache::kv_cache(int n_layer, int n_head_kv, int64_t capacity, dtype type, const std::vector<int>& ranks_k,
                   const std::vector<int>& ranks_v)
    : kv_cache(n_layer, n_head_kv, capacity, [&] {
          kv_cache_params p;
          p.type = type;
          return p;
      }(), ranks_k, ranks_v) {}

kv_cache::kv_cache(int n_layer, int n_head_kv, int64_t capacity, const kv_cache_params& p,
                   const std::vector<int>& ranks_k, const std::vector<int>& ranks_v,
                   const std::vector<int64_t>& layer_capacity)
    : id_(next_cache_id()), n_layer_(n_layer), n_head_kv_(n_head_kv), p_(p) {
    kv_cache_validate_params(p, n_layer, n_head_kv);
    if (p.sinks > 0 && (p.sink_dim <= 0 || p.sink_dim > 256))
        ZK_THROW("exact sinks need a row width between 1 and 256 channels, got %d", p.sink_dim);
    if (capacity <= 0) ZK_THROW("KV cache capacity must be positive, got %lld", (long long)capacity);
    const size_t n = (size_t)n_layer * n_head_kv;
    for (int code = 0; code < KV_VQ_CODES; code++) {
        if (!kv_cache_vq(p, code)) continue;
        if (!p.vq[code])
            ZK_THROW("vector-coded values at value precision %d need the codebooks of a .zack made by this version's "
                     "zack calibrate; this model has none",
                     code);
        if (p.vq[code]->heads.size() != n)
            ZK_THROW("the value codebooks of precision %d cover %zu heads; the cache has %zu", code,
                     p.vq[code]->heads.size(), n);
    }
    ZK_ASSERT(ranks_k.size() == n && ranks_v.size() == n);
    windowed_ = kv_cache_windowed(p);
    capacity = round_capacity(capacity);
    capacity_ = capacity;
    if (!layer_capacity.empty()) {
        ZK_ASSERT(layer_capacity.size() == (size_t)n_layer);
        layer_cap_.resize(n_layer);
        for (int il = 0; il < n_layer; il++) {
            ZK_ASSERT(layer_capacity[il] >= 0);
            layer_cap_[il] = layer_capacity[il] > 0 ? round_capacity(layer_capacity[il]) : 0;
        }
    }
    auto no_tier = [&](const char* why) {
        ZK_THROW_PARAM("kv.tier", "kv.tier keeps 4-bit codes before a plan's or a 2-bit cache's narrower ones; this "
                                  "cache has none (kv.bits %d%s)",
                       p.bits, why);
    };
    if (p.tier > 0 && !kv_cache_windowed(p)) no_tier("");
    if (p.tier > 0)
        for (int64_t c : layer_cap_)
            if (c > 0 && c < capacity)
                ZK_THROW_PARAM("kv.tier", "kv.tier does not combine with sliding-window layers (this model has them)");
    if (windowed_) {
        residual_ = kv_cache_residual(p, capacity);
        for (int64_t c : layer_cap_)  // a smaller layer still holds its residual window and a group
            if (c > 0 && c < capacity && c < residual_ + p.group)
                ZK_THROW("a layer capacity of %lld slots cannot hold the %d-token residual window and a group",
                         (long long)c, residual_);
    }
    int r_max = 1;  // of the windowed blocks: the re-packing scratch
    blocks_.resize(n);
    for (size_t i = 0; i < n; i++) {
        kv_block& b = blocks_[i];
        b.r_k = ranks_k[i];
        b.r_v = ranks_v[i];
        ZK_ASSERT(b.r_k >= 1 && b.r_v >= 1);
        b.capacity = block_capacity(i, capacity);
        const kv_layout &lk = layout_of(p, KV_ROLE_KEYS, i), &lv = layout_of(p, KV_ROLE_VALUES, i);
        if (lv.id == KV_LAYOUT_VQ) {
            char where[64];
            std::snprintf(where, sizeof where, "layer %zu, KV head %zu", i / n_head_kv, i % n_head_kv);
            kvq_vq_check_rank(*p.vq[kv_cache_bits(p, KV_ROLE_VALUES, i)], b.r_v, where);
        }
        b.windowed = lk.windowed || lv.windowed;
        b.tiered = block_tiered(i);
        b.k = lk.create(side_shape(KV_ROLE_KEYS, i, lk, b.capacity));
        b.v = lv.create(side_shape(KV_ROLE_VALUES, i, lv, b.capacity));
        if (b.tiered) {
            b.tk = kv_layout_q4().create(tier_shape(KV_ROLE_KEYS, i, b.capacity));
            b.tv = kv_layout_q4().create(tier_shape(KV_ROLE_VALUES, i, b.capacity));
            b.t_group_start.assign((size_t)(p.tier / p.group + 2), 0);
        }
        if (b.windowed) {
            b.group_start.assign((size_t)max_groups(b.capacity) + 1, 0);
            r_max = std::max(r_max, std::max(b.r_k, b.r_v));
        }
        if (p.evicting) {
            b.pos_own.resize((size_t)b.capacity);
            b.pos = b.pos_own.data();
        }
        if (p.scores) b.score.assign((size_t)b.capacity, 0.0f);
        if (p.sinks > 0) {
            b.sink_k.assign((size_t)p.sinks * p.sink_dim, 0.0f);
            b.sink_v.assign((size_t)p.sinks * p.sink_dim, 0.0f);
        }
    }
    // A cache without per-head codes is one kind in every block: none tiered, the tier
    // would hold nothing (a plain 4-bit cache). A plan may leave every head at 4 bits or
    // more, which a sweep sharing one kv.tier over plans of every size meets: it runs.
    if (p.tier > 0 && p.bits_k.empty() && p.bits_v.empty() &&
        std::none_of(blocks_.begin(), blocks_.end(), [](const kv_block& b) { return b.tiered; }))
        no_tier(", no 2-, 1- or 0-bit key channels");
    if (!p.evicting) {
        ramp_.resize((size_t)capacity_);
        std::iota(ramp_.begin(), ramp_.end(), 0);
        for (auto& b : blocks_) b.pos = ramp_.data();
    }
    for (auto& b : blocks_)
        if (b.tiered) tier_refresh(b);
    held_.resize((size_t)n_head_kv_);
    if (windowed_) {  // one slice per KV head: appends to the heads of a layer may run at once
        // (a tier's group on its way to the block's codes takes a third [group x r])
        scratch_head_ = (p.tier > 0 ? 3 : 2) * (size_t)p.group * r_max + (p.gear ? kvq_gear_work(p.group, r_max) : 0);
        scratch_.resize((size_t)n_head_kv_ * scratch_head_);
    }
    if (p.select > 0)  // room for every choice's runs (kv_select_remember), so that decode allocates nothing
        for (int il = 0; il < n_layer_; il++)
            for (int g = 0; g < n_head_kv_; g++)
                block(il, g).select_memo.runs.reserve(2 * (size_t)kv_select_max_runs(view(il, g), p.select));
}

size_t kv_cache::bytes_allocated() const {
    size_t s = 0;
    for (const auto& b : blocks_) {
        s += b.k->bytes_allocated() + b.v->bytes_allocated();
        if (b.tiered) s += b.tk->bytes_allocated() + b.tv->bytes_allocated() + 4 * b.t_group_start.size();
        s += 4 * (b.group_start.size() + b.pos_own.size() + b.score.size() + b.sink_k.size() + b.sink_v.size());
    }
    return s + 4 * ramp_.size();
}

size_t kv_cache::bytes_at(int64_t capacity, bool own_capacities) const {
    capacity = round_capacity(capacity);
    size_t s = 0;
    for (size_t i = 0; i < blocks_.size(); i++)
        s += block_bytes(i, own_capacities ? block_capacity(i, capacity) : capacity);
    if (!p_.evicting) s += (size_t)capacity * sizeof(int32_t);  // the ramp, once
    return s;
}

size_t kv_cache::bytes_for_capacity(int64_t capacity) const { return bytes_at(capacity, true); }

double kv_cache::bytes_per_token_exact() const {
    // Over a whole number of groups, so the per-group arrays divide evenly;
    // every block counted, a sliding-window layer's too: what one token held
    // in every block costs (how many a block holds is its n_used).
    // (past a tier's fixed size: below it the tier grows with the capacity and the codes do not)
    const int64_t span = windowed_ ? 2 * p_.group : 1;
    const int64_t c0 = p_.tier > 0 ? std::max<int64_t>(capacity_, p_.tier + 2 * (int64_t)p_.group) : capacity_;
    return (double)(bytes_at(c0 + span, false) - bytes_at(c0, false)) / (double)span;
}

size_t kv_cache::bytes_per_token() const { return (size_t)(bytes_per_token_exact() + 0.999999); }

std::string kv_cache::describe(int head_dim) const {
    char buf[512];
    // one layout everywhere: its own words; else the count of sides per layout
    int count[2][KV_LAYOUT_COUNT] = {};
    for (const auto& b : blocks_) count[0][b.k->layout()]++, count[1][b.v->layout()]++;
    kv_side_shape shape;
    shape.type = p_.type;
    shape.residual = residual_;
    shape.group = p_.group;
    shape.gear = p_.gear;
    shape.gear_rank = p_.gear_rank;
    shape.gear_outliers = p_.gear_outliers;
    std::string prec;
    for (int id = 0; id < KV_LAYOUT_COUNT; id++)
        if (count[0][id] == (int)blocks_.size() && count[1][id] == (int)blocks_.size())
            prec = kv_layout_get((kv_layout_id)id).describe(shape);
    if (prec.empty()) {
        prec = "per head:";
        for (int side = 0; side < 2; side++) {
            prec += side ? "; values" : " keys";
            const char* sep = " ";
            for (int id = 0; id < KV_LAYOUT_COUNT; id++)
                if (count[side][id] > 0) {
                    const kv_layout& l = kv_layout_get((kv_layout_id)id);
                    std::snprintf(buf, sizeof buf, "%s%s x%d", sep, id == KV_LAYOUT_ROWS ? dtype_name(p_.type) : l.name,
                                  count[side][id]);
                    prec += buf;
                    sep = ", ";
                }
        }
        if (windowed_) {
            std::snprintf(buf, sizeof buf, " (KIVI: keys per channel over %d tokens, %d-token %s residual window%s)",
                          p_.group, residual_, dtype_name(p_.type), p_.gear ? ", GEAR" : "");
            prec += buf;
        }
    }
    if (windowed_) {  // key channels below the side's width: how many heads have them, and how many on average
        auto narrow = [&](int attn_side_view::*part, const char* what, const char* unit) {
            int n = 0;
            long sum = 0;
            for (const auto& b : blocks_) {
                const int c = b.k->view(0).*part;
                if (c > 0) n++, sum += c;
            }
            if (n == 0) return;
            std::snprintf(buf, sizeof buf, "; %s in %d of %zu heads (%.0f%s on average)", what, n, blocks_.size(),
                          (double)sum / n, unit);
            prec += buf;
        };
        narrow(&attn_side_view::tail, "1-bit key tails", " channels");
        narrow(&attn_side_view::mid, "2-bit key channels", "");
        narrow(&attn_side_view::zero, "0-bit key channels (group means)", "");
    }
    if (p_.tier > 0) {
        int n = 0;
        for (const auto& b : blocks_) n += b.tiered;
        std::snprintf(buf, sizeof buf, "; a %d-token 4-bit tier before the window in %d of %zu heads", p_.tier, n,
                      blocks_.size());
        prec += buf;
    }
    if (p_.sinks > 0) {
        std::snprintf(buf, sizeof buf, "; first %d tokens also exact (f32, %d channels)", p_.sinks, p_.sink_dim);
        prec += buf;
    }
    int n_small = 0;
    int64_t small = 0;
    for (int64_t c : layer_cap_)
        if (c > 0 && c < capacity_) n_small++, small = std::max(small, c);
    if (n_small > 0) {
        std::snprintf(buf, sizeof buf, "; %d sliding-window layers hold at most %lld tokens",
                      n_small, (long long)small);
        prec += buf;
    }
    const double per_tok = bytes_per_token_exact();
    const double f16 = (double)bytes_per_token_f16(head_dim);
    std::snprintf(buf, sizeof buf,
                  "%s; %.1f bytes/token (%.2f per head) = %.1f%% of an f16 full-rank cache (%.0f); "
                  "capacity %lld tokens, %zu bytes allocated",
                  prec.c_str(), per_tok, per_tok / blocks_.size(), 100.0 * per_tok / f16, f16,
                  (long long)capacity_, bytes_allocated());
    return buf;
}

int64_t kv_cache::n_used_max() const {
    int64_t m = 0;
    for (const auto& b : blocks_) m = std::max(m, b.n_used);
    return m;
}

void kv_cache::clear() {
    for (auto& b : blocks_) {
        b.n_used = b.n_quant = b.n_groups = 0;
        b.t_quant = b.t_groups = 0;
        if (b.tiered) tier_refresh(b);
        if (b.pos_own.empty()) b.pos_base = 0, b.pos = ramp_.data();
        b.edits++;
        if (!b.score.empty()) std::fill(b.score.begin(), b.score.end(), 0.0f);
    }
}

// ---- writing ----

// Quantizes the oldest `group` tokens of the residual window as a new group.
void kv_cache::flush_group(kv_block& b, int head) {
    const int G = p_.group;
    if (b.tiered) {  // into the tier; its oldest group then leaves it if it is full
        flush_tier(b, head);
        return;
    }
    const int64_t g = b.n_groups;
    ZK_ASSERT(g < max_groups(b.capacity));
    b.group_start[g] = (int32_t)b.n_quant;
    const kv_group_ref gr{g, b.n_quant, G};
    const int64_t rest = b.n_used - b.n_quant - G;
    float* X = scratch_.data() + (size_t)head * scratch_head_;
    float* work = X + 2 * (size_t)G * std::max(b.r_k, b.r_v);
    b.k->flush(gr, rest, X, work);
    b.v->flush(gr, rest, X, work);
    b.n_groups++;
    b.n_quant += G;
    b.group_start[b.n_groups] = (int32_t)b.n_quant;
}

namespace {

// A quantizing side's window rows [0, nw) then the n new rows x[t * stride],
// in the cache's type, into out (view_attend's rows); a rows side keeps none.
void hold_side(const kv_side& side, int64_t n_quant, int64_t nw, dtype type, int r, const float* x,
               int64_t stride, int64_t n, std::vector<uint8_t>& out) {
    if (side.layout() == KV_LAYOUT_ROWS) {
        out.clear();
        return;
    }
    const size_t row = (size_t)r * kv_elem_size(type);
    // 64 bytes on: the kernels' vector loads of a row's last channels stay inside
    if (out.size() < (size_t)(nw + n) * row + 64) out.resize((size_t)(nw + n) * row + 64);
    if (nw > 0) std::memcpy(out.data(), side.view(n_quant).rows, (size_t)nw * row);
    for (int64_t t = 0; t < n; t++) kv_store_row(type, x + t * stride, out.data() + (size_t)(nw + t) * row, r);
}

}  // namespace

void kv_cache::append(int layer, int head, int64_t n_tok, const float* k_rows, int64_t k_stride,
                      const float* v_rows, int64_t v_stride, const int32_t* pos, bool hold) {
    kv_block& b = block(layer, head);
    if (b.n_used + n_tok > b.capacity)
        ZK_THROW("KV cache is full (%lld of %lld slots used, %lld more needed)", (long long)b.n_used,
                 (long long)b.capacity, (long long)n_tok);
    if (b.pos_own.empty())  // the ramp's: checked before anything is stored
        for (int64_t t = 0, s = b.n_used; t < n_tok; t++, s++)
            if (pos[t] != b.pos_base + s || pos[t] >= (int64_t)ramp_.size())
                ZK_THROW("KV cache block (%d, %d): slot %lld would hold position %d; a cache without eviction "
                         "holds consecutive positions from %lld, below its capacity of %zu",
                         layer, head, (long long)s, pos[t], (long long)b.pos_base, ramp_.size());
    kv_held& h = held_[(size_t)head];
    h.layer = -1;
    if (hold && b.windowed) {
        // the window rows before the append (a tiered block's are its tier's), then the chunk's
        const int64_t nw = b.n_used - b.n_quant - b.t_quant;
        const int64_t wq = b.tiered ? b.t_quant : b.n_quant;
        hold_side(b.tiered ? *b.tk : *b.k, wq, nw, p_.type, b.r_k, k_rows, k_stride, n_tok, h.k);
        hold_side(b.tiered ? *b.tv : *b.v, wq, nw, p_.type, b.r_v, v_rows, v_stride, n_tok, h.v);
        h.n_quant = b.n_quant;
        h.n_groups = b.n_groups;
        if (b.tiered) hold_tier(b, h, nw + n_tok);
    }
    // a quantizing side of a block without a window quantizes every token at once
    const bool at_once = !b.windowed && (b.k->layout() != KV_LAYOUT_ROWS || b.v->layout() != KV_LAYOUT_ROWS);
    kv_side& ks = b.tiered ? *b.tk : *b.k;  // where the window is
    kv_side& vs = b.tiered ? *b.tv : *b.v;
    for (int64_t t = 0; t < n_tok; t++) {
        const int64_t s = b.n_used;
        const float* kr = k_rows + t * k_stride;
        const float* vr = v_rows + t * v_stride;
        ks.append(s, s - b.n_quant - b.t_quant, kr);
        vs.append(s, s - b.n_quant - b.t_quant, vr);
        if (pos[t] < p_.sinks) {
            std::memcpy(b.sink_k.data() + (size_t)pos[t] * p_.sink_dim, kr, sizeof(float) * p_.sink_dim);
            std::memcpy(b.sink_v.data() + (size_t)pos[t] * p_.sink_dim, vr, sizeof(float) * p_.sink_dim);
        }
        if (!b.pos_own.empty()) b.pos_own[s] = pos[t];
        if (!b.score.empty()) b.score[s] = 0;
        b.n_used++;
        if (at_once) b.n_quant = b.n_used;
        if (b.windowed && b.n_used - b.n_quant - b.t_quant == residual_) flush_group(b, head);
    }
    if (b.tiered) tier_refresh(b);
    if (hold && b.windowed) {
        h.layer = layer;
        h.n_used = b.n_used;
        h.edits = b.edits;
        if (b.tiered) hold_tier_view(b, h);
    }
}

bool kv_cache::held(int layer, int head) const {
    const kv_held& h = held_[(size_t)head];
    const kv_block& b = block(layer, head);
    return h.layer == layer && h.n_used == b.n_used && h.edits == b.edits;
}

attn_kv_view kv_cache::view_attend(int layer, int head) const {
    attn_kv_view v = view(layer, head);
    if (!held(layer, head)) return v;
    const kv_block& b = block(layer, head);
    const kv_held& h = held_[(size_t)head];
    if (b.tiered) {  // the block's codes before the append, then the tier's view as it was
        v.k = b.k->view(h.n_quant);
        v.v = b.v->view(h.n_quant);
        v.n_groups = h.n_groups;
        v.tier = &h.tier_view;
        return v;
    }
    if (b.k->layout() != KV_LAYOUT_ROWS) {
        v.k = b.k->view(h.n_quant);
        v.k.rows = h.k.data();
    }
    if (b.v->layout() != KV_LAYOUT_ROWS) {
        v.v = b.v->view(h.n_quant);
        v.v.rows = h.v.data();
    }
    v.n_groups = h.n_groups;  // group_start[n_groups] is the n_quant before the append: flushes only add groups
    return v;
}

bool kv_cache::append_flushes(int layer, int head, int64_t n_tok) const {
    const kv_block& b = block(layer, head);
    return b.windowed && b.n_used - b.n_quant - b.t_quant + n_tok >= residual_;
}

kv_append_plan kv_cache::append_plan(int layer, int head, int64_t n_tok) const {
    const kv_block& b = block(layer, head);
    if (b.tiered) ZK_THROW_PARAM("kv.tier", "kv.tier is not on the GPU yet; run with --device cpu or without it");
    if (b.n_used + n_tok > b.capacity)
        ZK_THROW("KV cache is full (%lld of %lld slots used, %lld more needed)", (long long)b.n_used,
                 (long long)b.capacity, (long long)n_tok);
    // append()'s loop over tokens, counting instead of copying
    const bool at_once = !b.windowed && (b.k->layout() != KV_LAYOUT_ROWS || b.v->layout() != KV_LAYOUT_ROWS);
    kv_append_plan p;
    p.n_used = b.n_used;
    p.n_quant = b.n_quant;
    p.n_groups = b.n_groups;
    for (int64_t t = 0; t < n_tok; t++) {
        kv_append_step* last = p.steps.empty() ? nullptr : &p.steps.back();
        if (last && !last->flush && last->s0 + last->n == p.n_used) {
            last->n++;
        } else {
            kv_append_step st;
            st.t0 = t;
            st.n = 1;
            st.s0 = p.n_used;
            st.rs0 = p.n_used - p.n_quant;
            p.steps.push_back(st);
        }
        p.n_used++;
        if (at_once) p.n_quant = p.n_used;
        if (b.windowed && p.n_used - p.n_quant == residual_) {
            kv_append_step f;
            f.flush = true;
            f.group = p.n_groups;
            f.s0 = p.n_quant;
            f.rest = p.n_used - p.n_quant - p_.group;
            p.steps.push_back(f);
            p.n_groups++;
            p.n_quant += p_.group;
        }
    }
    return p;
}

attn_kv_view kv_cache::view_after(int layer, int head, const kv_append_plan& plan) const {
    const kv_block& b = block(layer, head);
    attn_kv_view v = view(layer, head);
    v.n_slots = plan.n_used;
    v.k = b.k->view(plan.n_quant);
    v.v = b.v->view(plan.n_quant);
    if (b.windowed) v.n_groups = plan.n_groups;
    return v;
}

attn_kv_view kv_cache::view(int layer, int head) const {
    const kv_block& b = block(layer, head);
    attn_kv_view v{};
    v.type = p_.type;
    v.pos = b.pos;
    v.n_slots = b.n_used;
    v.r_k = b.r_k;
    v.r_v = b.r_v;
    v.k = b.k->view(b.n_quant);
    v.v = b.v->view(b.n_quant);
    if (b.tiered) v.tier = &b.tier_view;
    if (b.windowed) {
        v.group = p_.group;
        v.n_groups = b.n_groups;
        v.group_start = b.group_start.data();
    }
    if (p_.sinks > 0) {
        while (v.n_sink_slots < b.n_used && b.pos[v.n_sink_slots] < p_.sinks) v.n_sink_slots++;
        v.sink_dim = p_.sink_dim;
        v.sink_k = b.sink_k.data();
        v.sink_v = b.sink_v.data();
    }
    return v;
}

// ---- reading back (tests, merging) ----

void kv_cache::read_slot(int layer, int head, int64_t s, float* k, float* v) const {
    const kv_block& b = block(layer, head);
    ZK_ASSERT(s >= 0 && s < b.n_used);
    kv_group_ref gr{-1, 0, 0};
    if (b.tiered && s >= b.n_quant) {  // the tier's codes or the window, in the tier's numbering
        const int64_t st = s - b.n_quant;
        if (st < b.t_quant) {
            const int64_t g = st / p_.group;
            gr = kv_group_ref{g, b.t_group_start[g], b.t_group_start[g + 1] - b.t_group_start[g]};
        }
        b.tk->read(st, b.t_quant, gr, k);
        b.tv->read(st, b.t_quant, gr, v);
        return;
    }
    if (b.windowed && s < b.n_quant) {
        const int64_t g =
            std::upper_bound(b.group_start.begin(), b.group_start.begin() + b.n_groups + 1, (int32_t)s) -
            b.group_start.begin() - 1;
        gr = kv_group_ref{g, b.group_start[g], b.group_start[g + 1] - b.group_start[g]};
    }
    b.k->read(s, b.n_quant, gr, k);
    b.v->read(s, b.n_quant, gr, v);
}

namespace {

// Slots [s0, s1) of a windowed side whose groups start at starts[0..n_groups]
// (a block's or its tier's), dequantized into X [(s1 - s0) x r]; a group the
// range cuts goes through a group's worth of stack (groups of up to 64 tokens
// of 256 channels; larger ones, not a default, allocate).
void read_groups(const kv_side& side, const int32_t* starts, int64_t n_groups, int r, int group, int64_t s0,
                 int64_t s1, float* X) {
    float G_stack[64 * 256];
    std::vector<float> G_heap;
    float* G = G_stack;
    if ((size_t)group * r > sizeof(G_stack) / sizeof(float)) {
        G_heap.resize((size_t)group * r);
        G = G_heap.data();
    }
    int64_t g = std::upper_bound(starts, starts + n_groups + 1, (int32_t)s0) - starts - 1;
    for (int64_t s = s0; s < s1; g++) {
        const kv_group_ref gr{g, starts[g], starts[g + 1] - starts[g]};
        const int64_t e = std::min<int64_t>(s1, gr.s0 + gr.n);
        if (s == gr.s0 && e == gr.s0 + gr.n) {
            side.read_group(gr, X + (s - s0) * r);
        } else {
            side.read_group(gr, G);
            std::memcpy(X + (s - s0) * r, G + (s - gr.s0) * r, sizeof(float) * (size_t)((e - s) * r));
        }
        s = e;
    }
}

}  // namespace

void kv_cache::read_quant(int layer, int head, bool key, int64_t s0, int64_t s1, float* X) const {
    const kv_block& b = block(layer, head);
    ZK_ASSERT(0 <= s0 && s0 <= s1 && s1 <= b.n_quant);
    const kv_side& side = key ? *b.k : *b.v;
    const int r = key ? b.r_k : b.r_v;
    if (!side.regroups()) {  // codes of their own a slot (rows, Q8, vector codes)
        for (int64_t s = s0; s < s1; s++) side.read(s, b.n_quant, kv_group_ref{-1, 0, 0}, X + (s - s0) * r);
        return;
    }
    ZK_ASSERT(b.windowed);
    read_groups(side, b.group_start.data(), b.n_groups, r, p_.group, s0, s1, X);
}

void kv_cache::read_tier_quant(int layer, int head, bool key, int64_t s0, int64_t s1, float* X, bool attend) const {
    const kv_block& b = block(layer, head);
    const int r = key ? b.r_k : b.r_v;
    if (attend && held(layer, head)) {
        const kv_held& h = held_[(size_t)head];
        ZK_ASSERT(b.tiered && 0 <= s0 && s0 <= s1 && s1 <= h.t_quant);
        const kv_side& side = h.t_copy ? (key ? *h.tk : *h.tv) : (key ? *b.tk : *b.tv);
        read_groups(side, h.t_group_start.data(), h.t_groups, r, p_.group, s0, s1, X);
        return;
    }
    ZK_ASSERT(b.tiered && 0 <= s0 && s0 <= s1 && s1 <= b.t_quant);
    read_groups(key ? *b.tk : *b.tv, b.t_group_start.data(), b.t_groups, r, p_.group, s0, s1, X);
}

// ---- eviction ----

// Merges groups g and g + 1 (adjacent slots, together at most `group` tokens)
// into group g by re-quantizing their tokens on the sides whose codes depend
// on the group; later groups move down by one.
void kv_cache::merge_groups(kv_block& b, int head, int64_t g) {
    const int n0 = b.group_start[g + 1] - b.group_start[g];
    const int n1 = b.group_start[g + 2] - b.group_start[g + 1];
    ZK_ASSERT(n0 + n1 <= p_.group && g + 1 == b.n_groups - 1);
    const size_t rm = std::max(b.r_k, b.r_v);
    float* K = scratch_.data() + (size_t)head * scratch_head_;
    float* V = K + (size_t)p_.group * rm;
    float* work = K + 2 * (size_t)p_.group * rm;  // GEAR's, after both
    const kv_group_ref g0{g, b.group_start[g], n0}, g1{g + 1, b.group_start[g + 1], n1};
    if (b.k->regroups()) {
        b.k->read_group(g0, K);
        b.k->read_group(g1, K + (size_t)n0 * b.r_k);
    }
    if (b.v->regroups()) {
        b.v->read_group(g0, V);
        b.v->read_group(g1, V + (size_t)n0 * b.r_v);
    }
    b.group_start[g + 1] = b.group_start[g + 2];
    b.n_groups--;
    const kv_group_ref merged{g, b.group_start[g], n0 + n1};
    if (b.k->regroups()) b.k->requantize(merged, K, work);
    if (b.v->regroups()) b.v->requantize(merged, V, work);
}

void kv_cache::compact(int layer, int head, const uint8_t* keep) {
    kv_block& b = block(layer, head);
    if (b.tiered) ZK_THROW_PARAM("kv.tier", "kv.tier does not combine with removing slots (eviction, sliding windows)");
    if (b.pos_own.empty()) {
        // positions from the ramp: only a prefix may go, the rest then starts further on
        int64_t k0 = 0;
        while (k0 < b.n_used && !keep[k0]) k0++;
        for (int64_t s = k0; s < b.n_used; s++)
            if (!keep[s])
                ZK_THROW("KV cache block (%d, %d): slot %lld removed after kept ones; a cache without eviction "
                         "drops only its oldest slots",
                         layer, head, (long long)s);
        b.pos_base += k0;
        b.pos = ramp_.data() + b.pos_base;
    }
    b.edits++;
    int64_t w = 0;
    auto move_common = [&](int64_t s, int64_t d) {
        if (!b.pos_own.empty()) b.pos_own[d] = b.pos_own[s];
        if (!b.score.empty()) b.score[d] = b.score[s];
    };
    if (!b.windowed) {
        for (int64_t s = 0; s < b.n_used; s++) {
            if (!keep[s]) continue;
            if (s < b.n_quant) {
                b.k->move_quant(s, w, -1, 0, -1, 0);
                b.v->move_quant(s, w, -1, 0, -1, 0);
            } else {
                b.k->move_tail(s, w, s, w);
                b.v->move_tail(s, w, s, w);
            }
            move_common(s, w);
            w++;
        }
        if (b.n_quant > 0) b.n_quant = w;  // a quantizing block: every slot
        b.n_used = w;
        return;
    }

    // Windowed: quantized groups keep their codes, scales and GEAR factors; the
    // rows of evicted slots are removed and sparse corrections re-indexed;
    // neighbouring groups that fit in one are merged.
    const int G = p_.group;
    const int64_t n_groups = b.n_groups, n_quant = b.n_quant;
    int64_t ng = 0;  // groups written
    int16_t newt[256];
    // group_start is rewritten as groups are written: read the old bounds first
    const std::vector<int32_t> starts(b.group_start.begin(), b.group_start.begin() + n_groups + 1);
    for (int64_t g = 0; g < n_groups; g++) {
        const int64_t a = starts[g], e = starts[g + 1];
        const int64_t start = w;
        for (int64_t s = a; s < e; s++) {
            newt[s - a] = keep[s] ? (int16_t)(w - start) : (int16_t)-1;
            if (!keep[s]) continue;
            b.k->move_quant(s, w, g, (int)(s - a), ng, (int)(w - start));
            b.v->move_quant(s, w, g, (int)(s - a), ng, (int)(w - start));
            move_common(s, w);
            w++;
        }
        if (w == start) continue;  // the whole group was evicted
        b.k->move_group(g, ng, newt, (int)(e - a));
        b.v->move_group(g, ng, newt, (int)(e - a));
        b.group_start[ng] = (int32_t)start;
        b.group_start[ng + 1] = (int32_t)w;
        ng++;
        b.n_groups = ng;
        if (ng >= 2 && b.group_start[ng] - b.group_start[ng - 2] <= G) {
            merge_groups(b, head, ng - 2);
            ng--;
        }
    }
    b.n_groups = ng;
    b.group_start[ng] = (int32_t)w;
    b.n_quant = w;
    // residual window: plain rows
    for (int64_t s = n_quant; s < b.n_used; s++) {
        if (!keep[s]) continue;
        b.k->move_tail(s, w, s - n_quant, w - b.n_quant);
        b.v->move_tail(s, w, s - n_quant, w - b.n_quant);
        move_common(s, w);
        w++;
    }
    b.n_used = w;
}

}  // namespace zk
