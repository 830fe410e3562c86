#include "engine/kv_cache.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "engine/kv_quant.h"
#include "ggml-like/error.h"
#include "kernels/convert.h"

namespace zk {

namespace {

size_t elem_size(dtype t) { return t == dtype::F32 ? 4 : 2; }

void store_row(dtype t, const float* src, uint8_t* dst, int n) {
    if (t == dtype::F32)
        std::memcpy(dst, src, sizeof(float) * n);
    else
        kernel_f32_to_f16(src, (uint16_t*)dst, n);
}

void load_row(dtype t, const uint8_t* src, float* dst, int n) {
    if (t == dtype::F32)
        std::memcpy(dst, src, sizeof(float) * n);
    else
        for (int i = 0; i < n; i++) dst[i] = fp16_to_fp32(((const uint16_t*)src)[i]);
}

template <class T>
void move_rows(std::vector<T>& a, int64_t row, int64_t from, int64_t to) {
    if (from != to) std::memmove(a.data() + to * row, a.data() + from * row, sizeof(T) * row);
}

int n_out_for(const kv_cache_params& p, int n, int r) {
    return p.gear ? kvq_gear_n_outliers(n, r, p.gear_outliers) : 0;
}

}  // namespace

int kv_cache_residual(const kv_cache_params& p, int64_t capacity) {
    if (p.residual > 0) return p.residual;
    // KIVI's window: 128 tokens (the newest tokens draw much of the attention,
    // and the window is a fixed cost, not a per-token one), but never more than
    // half of a small cache
    const int64_t g = p.group, w = (std::max<int64_t>(128, g) + g - 1) / g * g;
    return (int)std::max(g, std::min(w, capacity / 2 / g * g));
}

void kv_cache_validate_params(const kv_cache_params& p) {
    if (p.type != dtype::F32 && p.type != dtype::F16)
        ZK_THROW("KV cache type %s is not supported (f32, f16)", dtype_name(p.type));
    if (p.bits != 16 && p.bits != 8 && p.bits != 4)
        ZK_THROW("--kv-bits must be 16, 8 or 4, got %d", p.bits);
    if (p.bits == 4) {
        if (p.group <= 0 || p.group > 256)
            ZK_THROW("--kv-group must be between 1 and 256 tokens, got %d", p.group);
        if (p.residual < 0 || (p.residual > 0 && p.residual % p.group != 0))
            ZK_THROW("--kv-residual must be a positive multiple of the group (%d), got %d", p.group, p.residual);
    }
    if (p.sinks < 0 || p.sinks > 64) ZK_THROW("--kv-sinks must be between 0 and 64 tokens, got %d", p.sinks);
    if (p.gear) {
        if (p.bits != 4) ZK_THROW("--kv-gear corrects 4-bit quantization; it needs --kv-bits 4 (got %d)", p.bits);
        if (p.gear_rank < 0 || p.gear_rank > 16)
            ZK_THROW("GEAR rank must be between 0 and 16, got %d", p.gear_rank);
        if (!(p.gear_outliers >= 0 && p.gear_outliers < 0.5f))
            ZK_THROW("GEAR outlier fraction must be in [0, 0.5), got %g", p.gear_outliers);
    }
}

// ---- construction and accounting ----

int64_t kv_cache::max_groups(int64_t capacity) const {
    if (p_.bits != 4) return 0;
    // With eviction two neighbouring groups always hold more than `group` tokens
    // after compaction (else they are merged), hence at most 2 C / G + 1 groups.
    return p_.evicting ? 2 * capacity / p_.group + 1 : capacity / p_.group;
}

size_t kv_cache::block_bytes(int r_k, int r_v, int64_t C) const {
    const size_t es = elem_size(p_.type);
    size_t s = (size_t)C * sizeof(int32_t) + (p_.scores ? (size_t)C * sizeof(float) : 0);
    s += (size_t)p_.sinks * 2 * p_.sink_dim * sizeof(float);  // exact sinks (fixed)
    if (p_.bits == 16) return s + (size_t)C * (r_k + r_v) * es;
    if (p_.bits == 8)
        return s + (size_t)C * (r_k + r_v) +
               (size_t)C * 2 * (kv_n_blocks(r_k, KV_Q8_BLOCK) + kv_n_blocks(r_v, KV_Q8_BLOCK));
    const int64_t MG = max_groups(C);
    const int G = p_.group, k = p_.gear ? p_.gear_rank : 0;
    s += (size_t)residual_ * (r_k + r_v) * es;                           // residual window
    s += (size_t)C * (kv_q4_row_bytes(r_k) + kv_q4_row_bytes(r_v)) + 2 * KV_Q4_PAD;  // codes
    s += (size_t)C * 2 * 2 * kv_n_blocks(r_v, KV_Q4_VBLOCK);             // value scales + mins
    s += (size_t)MG * 2 * 2 * r_k + (size_t)(MG + 1) * sizeof(int32_t);  // key scales + mins, group starts
    if (p_.gear)
        s += (size_t)MG * 2 * ((size_t)G * k * 2 + (size_t)(r_k + r_v) * k + 2 * n_out_for(p_, G, r_k) +
                               2 * n_out_for(p_, G, r_v));
    return s;
}

kv_cache::kv_cache(int n_layer, int n_head_kv, int64_t capacity, dtype type, const std::vector<int>& ranks_k,
                   const std::vector<int>& ranks_v)
    : kv_cache(n_layer, n_head_kv, capacity, [&] {
          kv_cache_params p;
          p.type = type;
          return p;
      }(), ranks_k, ranks_v) {}

kv_cache::kv_cache(int n_layer, int n_head_kv, int64_t capacity, const kv_cache_params& p,
                   const std::vector<int>& ranks_k, const std::vector<int>& ranks_v)
    : n_layer_(n_layer), n_head_kv_(n_head_kv), p_(p) {
    kv_cache_validate_params(p);
    if (p.sinks > 0 && (p.sink_dim <= 0 || p.sink_dim > 256))
        ZK_THROW("exact sinks need a row width between 1 and 256 channels, got %d", p.sink_dim);
    if (capacity <= 0) ZK_THROW("KV cache capacity must be positive, got %lld", (long long)capacity);
    const size_t n = (size_t)n_layer * n_head_kv;
    ZK_ASSERT(ranks_k.size() == n && ranks_v.size() == n);
    if (p.bits == 4) {
        capacity = (capacity + p.group - 1) / p.group * p.group;
        residual_ = kv_cache_residual(p, capacity);
    }
    capacity_ = capacity;
    const size_t C = (size_t)capacity, es = elem_size(p.type);
    const int64_t MG = max_groups(capacity);
    const int G = p.group, k = p.gear ? p.gear_rank : 0;
    int r_max = 1;
    blocks_.resize(n);
    for (size_t i = 0; i < n; i++) {
        kv_block& b = blocks_[i];
        b.r_k = ranks_k[i];
        b.r_v = ranks_v[i];
        ZK_ASSERT(b.r_k >= 1 && b.r_v >= 1);
        r_max = std::max(r_max, std::max(b.r_k, b.r_v));
        b.pos.resize(C);
        if (p.scores) b.score.assign(C, 0.0f);
        if (p.sinks > 0) {
            b.sink_k.assign((size_t)p.sinks * p.sink_dim, 0.0f);
            b.sink_v.assign((size_t)p.sinks * p.sink_dim, 0.0f);
        }
        if (p.bits == 16) {
            b.k.resize(C * b.r_k * es);
            b.v.resize(C * b.r_v * es);
        } else if (p.bits == 8) {
            b.kq.resize(C * b.r_k);
            b.vq.resize(C * b.r_v);
            b.ks.resize(C * kv_n_blocks(b.r_k, KV_Q8_BLOCK));
            b.vs.resize(C * kv_n_blocks(b.r_v, KV_Q8_BLOCK));
        } else {
            if ((int64_t)G * std::max(b.r_k, b.r_v) >= KV_GEAR_NONE)
                ZK_THROW("4-bit KV group of %d tokens x %d channels is too large (max 65534 elements)", G,
                         std::max(b.r_k, b.r_v));
            b.k.resize((size_t)residual_ * b.r_k * es);
            b.v.resize((size_t)residual_ * b.r_v * es);
            b.kq.resize(C * kv_q4_row_bytes(b.r_k) + KV_Q4_PAD);
            b.vq.resize(C * kv_q4_row_bytes(b.r_v) + KV_Q4_PAD);
            b.vs.resize(C * kv_n_blocks(b.r_v, KV_Q4_VBLOCK));
            b.vm.resize(C * kv_n_blocks(b.r_v, KV_Q4_VBLOCK));
            b.ks.resize((size_t)MG * b.r_k);
            b.km.resize((size_t)MG * b.r_k);
            b.group_start.assign((size_t)MG + 1, 0);
            if (p.gear) {
                b.ka.resize((size_t)MG * G * k);
                b.kb.resize((size_t)MG * b.r_k * k);
                b.koi.resize((size_t)MG * n_out_for(p, G, b.r_k));
                b.kov.resize(b.koi.size());
                b.va.resize((size_t)MG * G * k);
                b.vb.resize((size_t)MG * b.r_v * k);
                b.voi.resize((size_t)MG * n_out_for(p, G, b.r_v));
                b.vov.resize(b.voi.size());
            }
        }
    }
    if (p.bits == 4) scratch_.resize(2 * (size_t)G * r_max + (p.gear ? kvq_gear_work(G, r_max) : 0));
}

size_t kv_cache::bytes_allocated() const {
    size_t s = 0;
    for (const auto& b : blocks_) {
        s += b.k.size() + b.v.size() + b.kq.size() + b.vq.size();
        s += 2 * (b.ks.size() + b.km.size() + b.vs.size() + b.vm.size());
        s += 2 * (b.ka.size() + b.kb.size() + b.koi.size() + b.kov.size());
        s += 2 * (b.va.size() + b.vb.size() + b.voi.size() + b.vov.size());
        s += 4 * (b.group_start.size() + b.pos.size() + b.score.size() + b.sink_k.size() + b.sink_v.size());
    }
    return s;
}

size_t kv_cache::bytes_for_capacity(int64_t capacity) const {
    if (p_.bits == 4) capacity = (capacity + p_.group - 1) / p_.group * p_.group;
    size_t s = 0;
    for (const auto& b : blocks_) s += block_bytes(b.r_k, b.r_v, capacity);
    return s;
}

double kv_cache::bytes_per_token_exact() const {
    // Over a whole number of groups, so the per-group arrays divide evenly.
    const int64_t span = p_.bits == 4 ? 2 * p_.group : 1;
    return (double)(bytes_for_capacity(capacity_ + span) - bytes_for_capacity(capacity_)) / (double)span;
}

size_t kv_cache::bytes_per_token() const { return (size_t)(bytes_per_token_exact() + 0.999999); }

std::string kv_cache::describe(int head_dim) const {
    char buf[512];
    std::string prec;
    if (p_.bits == 16) {
        prec = dtype_name(p_.type);
    } else if (p_.bits == 8) {
        prec = "8-bit (per token, blocks of 32 channels, f16 scales)";
    } else {
        std::snprintf(buf, sizeof buf,
                      "4-bit (keys per channel over %d tokens, values per token in blocks of 32, f16 scales+mins, "
                      "%d-token %s residual window)%s",
                      p_.group, residual_, dtype_name(p_.type), p_.gear ? " + GEAR" : "");
        prec = buf;
        if (p_.gear) {
            std::snprintf(buf, sizeof buf, " (rank %d, %.1f%% outliers)", p_.gear_rank, 100.0 * p_.gear_outliers);
            prec += buf;
        }
    }
    if (p_.sinks > 0) {
        std::snprintf(buf, sizeof buf, "; first %d tokens also exact (f32, %d channels)", p_.sinks, p_.sink_dim);
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
        if (!b.score.empty()) std::fill(b.score.begin(), b.score.end(), 0.0f);
    }
}

// ---- writing ----

void kv_cache::quantize_group(kv_block& b, int64_t g, const float* K, const float* V, int n) {
    const int64_t s0 = b.group_start[g];
    const int G = p_.group, vb = kv_n_blocks(b.r_v, KV_Q4_VBLOCK);
    uint8_t* kc = b.kq.data() + s0 * kv_q4_row_bytes(b.r_k);
    uint8_t* vc = b.vq.data() + s0 * kv_q4_row_bytes(b.r_v);
    uint16_t* vs = b.vs.data() + s0 * vb;
    uint16_t* vm = b.vm.data() + s0 * vb;
    if (!p_.gear) {
        kvq_quantize_q4_keys(K, n, b.r_k, kc, b.ks.data() + g * b.r_k, b.km.data() + g * b.r_k);
        for (int t = 0; t < n; t++)
            kvq_quantize_q4_vrow(V + (size_t)t * b.r_v, b.r_v, vc + (size_t)t * kv_q4_row_bytes(b.r_v), vs + t * vb,
                                 vm + t * vb);
        return;
    }
    const int k = p_.gear_rank;
    float* work = scratch_.data() + 2 * (size_t)G * std::max(b.r_k, b.r_v);
    const int nok = n_out_for(p_, G, b.r_k), nov = n_out_for(p_, G, b.r_v);
    const int nk = n_out_for(p_, n, b.r_k), nv = n_out_for(p_, n, b.r_v);
    kvq_gear_out gk{b.ka.data() + g * G * k, b.kb.data() + g * b.r_k * k, b.koi.data() + g * nok,
                    b.kov.data() + g * nok};
    kvq_gear_out gv{b.va.data() + g * G * k, b.vb.data() + g * b.r_v * k, b.voi.data() + g * nov,
                    b.vov.data() + g * nov};
    kvq_quantize_gear(K, n, b.r_k, true, k, nk, kc, b.ks.data() + g * b.r_k, b.km.data() + g * b.r_k, gk, work);
    kvq_quantize_gear(V, n, b.r_v, false, k, nv, vc, vs, vm, gv, work);
    std::fill(gk.out_idx + nk, gk.out_idx + nok, KV_GEAR_NONE);
    std::fill(gv.out_idx + nv, gv.out_idx + nov, KV_GEAR_NONE);
}

// Quantizes the oldest `group` tokens of the residual window as a new group.
void kv_cache::flush_group(kv_block& b) {
    const int G = p_.group;
    const size_t es = elem_size(p_.type);
    float* K = scratch_.data();
    float* V = K + (size_t)G * std::max(b.r_k, b.r_v);
    for (int t = 0; t < G; t++) {
        load_row(p_.type, b.k.data() + (size_t)t * b.r_k * es, K + (size_t)t * b.r_k, b.r_k);
        load_row(p_.type, b.v.data() + (size_t)t * b.r_v * es, V + (size_t)t * b.r_v, b.r_v);
    }
    const int64_t g = b.n_groups;
    ZK_ASSERT(g < max_groups(capacity_));
    b.group_start[g] = (int32_t)b.n_quant;
    quantize_group(b, g, K, V, G);
    b.n_groups++;
    b.n_quant += G;
    b.group_start[b.n_groups] = (int32_t)b.n_quant;
    const int64_t rest = b.n_used - b.n_quant;
    std::memmove(b.k.data(), b.k.data() + (size_t)G * b.r_k * es, (size_t)rest * b.r_k * es);
    std::memmove(b.v.data(), b.v.data() + (size_t)G * b.r_v * es, (size_t)rest * b.r_v * es);
}

void kv_cache::append(int layer, int head, int64_t n_tok, const float* k_rows, int64_t k_stride,
                      const float* v_rows, int64_t v_stride, const int32_t* pos) {
    kv_block& b = block(layer, head);
    if (b.n_used + n_tok > capacity_)
        ZK_THROW("KV cache is full (%lld of %lld slots used, %lld more needed)", (long long)b.n_used,
                 (long long)capacity_, (long long)n_tok);
    const size_t es = elem_size(p_.type);
    for (int64_t t = 0; t < n_tok; t++) {
        const int64_t s = b.n_used;
        const float* kr = k_rows + t * k_stride;
        const float* vr = v_rows + t * v_stride;
        if (p_.bits == 16) {
            store_row(p_.type, kr, b.k.data() + (size_t)s * b.r_k * es, b.r_k);
            store_row(p_.type, vr, b.v.data() + (size_t)s * b.r_v * es, b.r_v);
        } else if (p_.bits == 8) {
            kvq_quantize_q8_row(kr, b.r_k, (int8_t*)b.kq.data() + (size_t)s * b.r_k,
                                b.ks.data() + (size_t)s * kv_n_blocks(b.r_k, KV_Q8_BLOCK));
            kvq_quantize_q8_row(vr, b.r_v, (int8_t*)b.vq.data() + (size_t)s * b.r_v,
                                b.vs.data() + (size_t)s * kv_n_blocks(b.r_v, KV_Q8_BLOCK));
        } else {
            const int64_t rs = s - b.n_quant;
            store_row(p_.type, kr, b.k.data() + (size_t)rs * b.r_k * es, b.r_k);
            store_row(p_.type, vr, b.v.data() + (size_t)rs * b.r_v * es, b.r_v);
        }
        if (pos[t] < p_.sinks) {
            std::memcpy(b.sink_k.data() + (size_t)pos[t] * p_.sink_dim, kr, sizeof(float) * p_.sink_dim);
            std::memcpy(b.sink_v.data() + (size_t)pos[t] * p_.sink_dim, vr, sizeof(float) * p_.sink_dim);
        }
        b.pos[s] = pos[t];
        if (!b.score.empty()) b.score[s] = 0;
        b.n_used++;
        if (p_.bits == 8) b.n_quant = b.n_used;
        if (p_.bits == 4 && b.n_used - b.n_quant == residual_) flush_group(b);
    }
}

attn_kv_view kv_cache::view(int layer, int head) const {
    const kv_block& b = block(layer, head);
    attn_kv_view v{};
    v.type = p_.type;
    v.k = b.k.data();
    v.v = b.v.data();
    v.pos = b.pos.data();
    v.n_slots = b.n_used;
    v.r_k = b.r_k;
    v.r_v = b.r_v;
    if (p_.sinks > 0) {
        while (v.n_sink_slots < b.n_used && b.pos[v.n_sink_slots] < p_.sinks) v.n_sink_slots++;
        v.sink_dim = p_.sink_dim;
        v.sink_k = b.sink_k.data();
        v.sink_v = b.sink_v.data();
    }
    if (p_.bits == 16) return v;
    v.quant = p_.bits == 8 ? KV_QUANT_Q8 : KV_QUANT_Q4;
    v.n_quant = b.n_quant;
    v.kq = b.kq.data();
    v.ks = b.ks.data();
    v.vq = b.vq.data();
    v.vs = b.vs.data();
    if (p_.bits == 8) return v;
    v.km = b.km.data();
    v.vm = b.vm.data();
    v.group = p_.group;
    v.n_groups = b.n_groups;
    v.group_start = b.group_start.data();
    if (p_.gear) {
        v.gear_k = attn_gear_view{p_.gear_rank, n_out_for(p_, p_.group, b.r_k), b.ka.data(), b.kb.data(),
                                  b.koi.data(), b.kov.data()};
        v.gear_v = attn_gear_view{p_.gear_rank, n_out_for(p_, p_.group, b.r_v), b.va.data(), b.vb.data(),
                                  b.voi.data(), b.vov.data()};
    }
    return v;
}

// ---- reading back (tests, merging) ----

namespace {

// Group g of a 4-bit block, n tokens, dequantized with its GEAR correction:
// K [n x r_k], V [n x r_v].
void q4_group_read(const kv_block& b, const kv_cache_params& p, int64_t g, float* K, float* V) {
    const int64_t s0 = b.group_start[g];
    const int n = b.group_start[g + 1] - b.group_start[g];
    const int vb = kv_n_blocks(b.r_v, KV_Q4_VBLOCK);
    const uint8_t* kc = b.kq.data() + s0 * kv_q4_row_bytes(b.r_k);
    const uint8_t* vc = b.vq.data() + s0 * kv_q4_row_bytes(b.r_v);
    if (!p.gear) {
        kvq_dequantize_q4_keys(kc, b.ks.data() + g * b.r_k, b.km.data() + g * b.r_k, n, b.r_k, K);
        for (int t = 0; t < n; t++)
            kvq_dequantize_q4_vrow(vc + (size_t)t * kv_q4_row_bytes(b.r_v), b.vs.data() + (s0 + t) * vb,
                                   b.vm.data() + (s0 + t) * vb, b.r_v, V + (size_t)t * b.r_v);
        return;
    }
    const int k = p.gear_rank, G = p.group;
    const int nok = n_out_for(p, G, b.r_k), nov = n_out_for(p, G, b.r_v);
    const uint16_t* koi = b.koi.data() + g * nok;
    const uint16_t* voi = b.voi.data() + g * nov;
    const int nk = (int)(std::find(koi, koi + nok, KV_GEAR_NONE) - koi);
    const int nv = (int)(std::find(voi, voi + nov, KV_GEAR_NONE) - voi);
    kvq_dequantize_gear(kc, b.ks.data() + g * b.r_k, b.km.data() + g * b.r_k, n, b.r_k, true, k, nk,
                        b.ka.data() + g * G * k, b.kb.data() + g * b.r_k * k, koi, b.kov.data() + g * nok, K);
    kvq_dequantize_gear(vc, b.vs.data() + s0 * vb, b.vm.data() + s0 * vb, n, b.r_v, false, k, nv,
                        b.va.data() + g * G * k, b.vb.data() + g * b.r_v * k, voi, b.vov.data() + g * nov, V);
}

}  // namespace

void kv_cache::read_slot(int layer, int head, int64_t s, float* k, float* v) const {
    const kv_block& b = block(layer, head);
    ZK_ASSERT(s >= 0 && s < b.n_used);
    const size_t es = elem_size(p_.type);
    if (s >= b.n_quant) {
        const int64_t rs = s - b.n_quant;
        load_row(p_.type, b.k.data() + (size_t)rs * b.r_k * es, k, b.r_k);
        load_row(p_.type, b.v.data() + (size_t)rs * b.r_v * es, v, b.r_v);
        return;
    }
    if (p_.bits == 8) {
        kvq_dequantize_q8_row((const int8_t*)b.kq.data() + s * b.r_k, b.ks.data() + s * kv_n_blocks(b.r_k, KV_Q8_BLOCK),
                              b.r_k, k);
        kvq_dequantize_q8_row((const int8_t*)b.vq.data() + s * b.r_v, b.vs.data() + s * kv_n_blocks(b.r_v, KV_Q8_BLOCK),
                              b.r_v, v);
        return;
    }
    const int64_t g =
        std::upper_bound(b.group_start.begin(), b.group_start.begin() + b.n_groups + 1, (int32_t)s) -
        b.group_start.begin() - 1;
    const int n = b.group_start[g + 1] - b.group_start[g];
    std::vector<float> K((size_t)n * b.r_k), V((size_t)n * b.r_v);
    q4_group_read(b, p_, g, K.data(), V.data());
    const int64_t t = s - b.group_start[g];
    std::memcpy(k, K.data() + t * b.r_k, sizeof(float) * b.r_k);
    std::memcpy(v, V.data() + t * b.r_v, sizeof(float) * b.r_v);
}

// ---- eviction ----

// Merges groups g and g + 1 (adjacent slots, together at most `group` tokens)
// into group g by re-quantizing their tokens; later groups move down by one.
void kv_cache::merge_groups(kv_block& b, int64_t g) {
    const int n0 = b.group_start[g + 1] - b.group_start[g];
    const int n1 = b.group_start[g + 2] - b.group_start[g + 1];
    ZK_ASSERT(n0 + n1 <= p_.group && g + 1 == b.n_groups - 1);
    float* K = scratch_.data();
    float* V = K + (size_t)p_.group * std::max(b.r_k, b.r_v);
    q4_group_read(b, p_, g, K, V);
    q4_group_read(b, p_, g + 1, K + (size_t)n0 * b.r_k, V + (size_t)n0 * b.r_v);
    b.group_start[g + 1] = b.group_start[g + 2];
    b.n_groups--;
    // The scratch holds K and V; the GEAR work area lies after both.
    quantize_group(b, g, K, V, n0 + n1);
}

void kv_cache::compact(int layer, int head, const uint8_t* keep) {
    kv_block& b = block(layer, head);
    const size_t es = elem_size(p_.type);
    int64_t w = 0;
    auto move_common = [&](int64_t s, int64_t d) {
        b.pos[d] = b.pos[s];
        if (!b.score.empty()) b.score[d] = b.score[s];
    };
    if (p_.bits == 16 || p_.bits == 8) {
        const int64_t rk = p_.bits == 16 ? b.r_k * (int64_t)es : b.r_k;
        const int64_t rv = p_.bits == 16 ? b.r_v * (int64_t)es : b.r_v;
        const int64_t bk = kv_n_blocks(b.r_k, KV_Q8_BLOCK), bv = kv_n_blocks(b.r_v, KV_Q8_BLOCK);
        for (int64_t s = 0; s < b.n_used; s++) {
            if (!keep[s]) continue;
            if (s != w) {
                if (p_.bits == 16) {
                    move_rows(b.k, rk, s, w);
                    move_rows(b.v, rv, s, w);
                } else {
                    move_rows(b.kq, rk, s, w);
                    move_rows(b.vq, rv, s, w);
                    move_rows(b.ks, bk, s, w);
                    move_rows(b.vs, bv, s, w);
                }
                move_common(s, w);
            }
            w++;
        }
        b.n_used = w;
        if (p_.bits == 8) b.n_quant = w;
        return;
    }

    // 4-bit: quantized groups keep their codes, scales and GEAR factors; the
    // rows of evicted slots are removed and sparse corrections re-indexed.
    const int G = p_.group, k = p_.gear ? p_.gear_rank : 0;
    const int rbk = kv_q4_row_bytes(b.r_k), rbv = kv_q4_row_bytes(b.r_v), vb = kv_n_blocks(b.r_v, KV_Q4_VBLOCK);
    const int nok = n_out_for(p_, G, b.r_k), nov = n_out_for(p_, G, b.r_v);
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
            if (s != w || g != ng) {
                move_rows(b.kq, rbk, s, w);
                move_rows(b.vq, rbv, s, w);
                move_rows(b.vs, vb, s, w);
                move_rows(b.vm, vb, s, w);
                move_common(s, w);
                if (k > 0) {
                    move_rows(b.ka, k, g * G + (s - a), ng * G + (w - start));
                    move_rows(b.va, k, g * G + (s - a), ng * G + (w - start));
                }
            }
            w++;
        }
        if (w == start) continue;  // the whole group was evicted
        if (g != ng) {
            move_rows(b.ks, b.r_k, g, ng);
            move_rows(b.km, b.r_k, g, ng);
            if (k > 0) {
                move_rows(b.kb, (int64_t)b.r_k * k, g, ng);
                move_rows(b.vb, (int64_t)b.r_v * k, g, ng);
            }
        }
        if (k > 0) {
            auto reindex = [&](std::vector<uint16_t>& oi, std::vector<uint16_t>& ov, int no, int r) {
                int o2 = 0;
                for (int o = 0; o < no; o++) {
                    const uint16_t idx = oi[g * no + o];
                    if (idx == KV_GEAR_NONE) break;
                    const int t = idx / r, c = idx % r;
                    if (newt[t] < 0) continue;
                    oi[ng * no + o2] = (uint16_t)(newt[t] * r + c);
                    ov[ng * no + o2] = ov[g * no + o];
                    o2++;
                }
                for (; o2 < no; o2++) oi[ng * no + o2] = KV_GEAR_NONE;
            };
            reindex(b.koi, b.kov, nok, b.r_k);
            reindex(b.voi, b.vov, nov, b.r_v);
        }
        b.group_start[ng] = (int32_t)start;
        b.group_start[ng + 1] = (int32_t)w;
        ng++;
        b.n_groups = ng;
        if (ng >= 2 && b.group_start[ng] - b.group_start[ng - 2] <= G) {
            merge_groups(b, ng - 2);
            ng--;
        }
    }
    b.n_groups = ng;
    b.group_start[ng] = (int32_t)w;
    b.n_quant = w;
    // residual window: plain rows
    for (int64_t s = n_quant; s < b.n_used; s++) {
        if (!keep[s]) continue;
        move_rows(b.k, b.r_k * (int64_t)es, s - n_quant, w - b.n_quant);
        move_rows(b.v, b.r_v * (int64_t)es, s - n_quant, w - b.n_quant);
        move_common(s, w);
        w++;
    }
    b.n_used = w;
}

}  // namespace zk
