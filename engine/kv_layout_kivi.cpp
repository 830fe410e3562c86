#include "engine/kv_layout_kivi.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "engine/kv_quant.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

// Sparse outliers a group of n tokens of r channels keeps (0 without GEAR).
int n_out_for(const kv_side_shape& s, int n) { return s.gear ? kvq_gear_n_outliers(n, s.r, s.gear_outliers) : 0; }

class kivi_side final : public kv_side {
public:
    kivi_side(const kv_side_shape& s, int bits)
        : s_(s),
          bits_(bits),
          keys_(s.role == KV_ROLE_KEYS),
          rb_(s.role == KV_ROLE_KEYS ? kv_key_row_bytes(bits, s.r, s.tail, s.zero, s.mid) : kv_kivi_row_bytes(bits, s.r)),
          gw_(kv_key_grid_words(s.r, s.zero)),
          vb_(kv_n_blocks(s.r, KV_Q4_VBLOCK)),
          k_(s.gear ? s.gear_rank : 0),
          nout_(n_out_for(s, s.group)),
          row_((int64_t)s.r * kv_elem_size(s.type)) {
        ZK_ASSERT(s.residual > 0 && s.group > 0);
        // kv_cache_validate_params refuses bad tails and GEAR with tails; side_shape clamps to r
        ZK_ASSERT(s.tail >= 0 && s.tail <= std::min(s.r, KV_KEY_TAIL_MAX) && (s.tail == 0 || (keys_ && !s.gear)));
        ZK_ASSERT(s.zero >= 0 && s.zero + s.tail <= s.r && (s.zero == 0 || (keys_ && !s.gear)));
        ZK_ASSERT(s.mid >= 0 && s.mid + s.zero + s.tail <= s.r && (s.mid == 0 || (keys_ && !s.gear && bits == 4)));
        if ((int64_t)s.group * s.r >= KV_GEAR_NONE)
            ZK_THROW("%d-bit KV group of %d tokens x %d channels is too large (max 65534 elements)", bits, s.group,
                     s.r);
        const size_t C = (size_t)s.capacity, MG = (size_t)s.max_groups;
        window_.resize((size_t)s.residual * row_);
        codes_.resize(C * rb_ + KV_Q4_PAD);
        // packed grid codes per (group, channel) or (token, block), two f16 steps per group
        scale_.resize(keys_ ? MG * gw_ : C * vb_);
        min_.resize(MG * KV_GRID_STEPS);
        if (s.gear) {
            ga_.resize(MG * s.group * k_);
            gb_.resize(MG * s.r * k_);
            goi_.resize(MG * nout_);
            gov_.resize(goi_.size());
        }
    }

    kv_layout_id layout() const override { return bits_ == 4 ? KV_LAYOUT_Q4 : KV_LAYOUT_Q2; }
    void append(int64_t, int64_t rs, const float* x) override {
        kv_store_row(s_.type, x, window_.data() + rs * row_, s_.r);
    }
    void flush(const kv_group_ref& gr, int64_t rest, float* X, float* work) override {
        for (int t = 0; t < gr.n; t++) kv_load_row(s_.type, window_.data() + t * row_, X + (size_t)t * s_.r, s_.r);
        requantize(gr, X, work);
        std::memmove(window_.data(), window_.data() + gr.n * row_, (size_t)(rest * row_));
    }
    void read(int64_t s, int64_t n_quant, const kv_group_ref& gr, float* x) const override {
        if (s >= n_quant) {
            kv_load_row(s_.type, window_.data() + (s - n_quant) * row_, x, s_.r);
            return;
        }
        std::vector<float> X((size_t)gr.n * s_.r);  // tests and re-packing only
        read_group(gr, X.data());
        std::memcpy(x, X.data() + (s - gr.s0) * s_.r, sizeof(float) * s_.r);
    }
    bool regroups() const override { return true; }
    void read_group(const kv_group_ref& gr, float* X) const override;
    void requantize(const kv_group_ref& gr, const float* X, float* work) override;
    void move_quant(int64_t s, int64_t w, int64_t g, int t, int64_t ng, int tn) override {
        kv_move_rows(codes_.data(), rb_, s, w);
        if (!keys_) kv_move_rows(scale_.data(), vb_, s, w);
        if (k_ > 0) kv_move_rows(ga_.data(), k_, g * s_.group + t, ng * s_.group + tn);
    }
    void move_group(int64_t g, int64_t ng, const int16_t* newt, int) override;
    void drop_front(int64_t n_slots, int64_t n_groups, int64_t slots, int64_t groups) override {
        ZK_ASSERT(!s_.gear && 0 <= n_slots && n_slots <= slots && 0 <= n_groups && n_groups <= groups);
        // one move an array: codes and value grids by slot, key grids and steps by group
        const auto drop = [](auto& a, int64_t row, int64_t n, int64_t total) {
            std::memmove(a.data(), a.data() + n * row, sizeof(a[0]) * (size_t)((total - n) * row));
        };
        drop(codes_, rb_, n_slots, slots);
        if (keys_)
            drop(scale_, gw_, n_groups, groups);
        else
            drop(scale_, vb_, n_slots, slots);
        drop(min_, KV_GRID_STEPS, n_groups, groups);
    }
    void move_tail(int64_t, int64_t, int64_t rs, int64_t rw) override {
        kv_move_rows(window_.data(), row_, rs, rw);
    }
    void copy_into(std::unique_ptr<kv_side>& dst) const override {
        if (auto* d = dynamic_cast<kivi_side*>(dst.get()))
            *d = *this;  // vectors of the same sizes: no allocation
        else
            dst = std::make_unique<kivi_side>(*this);
    }
    attn_side_view view(int64_t n_quant) const override {
        attn_side_view v;
        v.layout = layout();
        v.n_quant = n_quant;
        v.rows = window_.data();
        v.codes = codes_.data();
        v.scale = scale_.data();
        v.min = min_.data();
        v.tail = s_.tail;
        v.zero = s_.zero;
        v.mid = s_.mid;
        if (s_.gear) v.gear = attn_gear_view{k_, nout_, ga_.data(), gb_.data(), goi_.data(), gov_.data()};
        return v;
    }
    size_t bytes_allocated() const override {
        return window_.size() + codes_.size() + 2 * (scale_.size() + min_.size()) +
               2 * (ga_.size() + gb_.size() + goi_.size() + gov_.size());
    }

private:
    const uint16_t* scale_of(const kv_group_ref& gr) const {
        return keys_ ? scale_.data() + gr.g * gw_ : scale_.data() + gr.s0 * vb_;
    }
    const uint16_t* min_of(const kv_group_ref& gr) const {
        return min_.data() + gr.g * KV_GRID_STEPS;
    }

    kv_side_shape s_;
    int bits_;
    bool keys_;
    int rb_, gw_, vb_;  // bytes per code row, key grid words per group, value blocks per row
    int k_;        // GEAR rank (0 without)
    int nout_;     // GEAR outlier slots per group
    int64_t row_;  // bytes per window row
    std::vector<uint8_t> window_;         // [residual x r] of the cache's type
    std::vector<uint8_t> codes_;          // [capacity x rb] + KV_Q4_PAD
    std::vector<uint16_t> scale_;         // grid codes: keys [max_groups x gw], values [capacity x vb]
    std::vector<uint16_t> min_;           // steps [max_groups x 2]
    std::vector<uint16_t> ga_, gb_;       // GEAR [max_groups x group x k], [max_groups x r x k]
    std::vector<uint16_t> goi_, gov_;     // GEAR [max_groups x nout]
};

void kivi_side::read_group(const kv_group_ref& gr, float* X) const {
    const uint8_t* c = codes_.data() + gr.s0 * rb_;
    if (!s_.gear) {
        if (keys_)
            kvq_dequantize_keys(bits_, c, scale_of(gr), min_of(gr), gr.n, s_.r, X, s_.tail, s_.zero, s_.mid);
        else
            kvq_dequantize_values(bits_, c, scale_of(gr), min_of(gr), gr.n, s_.r, X);
        return;
    }
    const uint16_t* oi = goi_.data() + gr.g * nout_;
    const int no = (int)(std::find(oi, oi + nout_, KV_GEAR_NONE) - oi);
    kvq_dequantize_gear(c, scale_of(gr), min_of(gr), gr.n, s_.r, keys_, k_, no, ga_.data() + gr.g * s_.group * k_,
                        gb_.data() + gr.g * s_.r * k_, oi, gov_.data() + gr.g * nout_, X, bits_);
}

void kivi_side::requantize(const kv_group_ref& gr, const float* X, float* work) {
    uint8_t* c = codes_.data() + gr.s0 * rb_;
    uint16_t* sc = (uint16_t*)scale_of(gr);
    uint16_t* mn = (uint16_t*)min_of(gr);
    if (!s_.gear) {
        if (keys_)
            kvq_quantize_keys(bits_, X, gr.n, s_.r, c, sc, mn, nullptr, s_.tail, s_.zero, s_.mid);
        else
            kvq_quantize_values(bits_, X, gr.n, s_.r, c, sc, mn);
        return;
    }
    const int no = n_out_for(s_, gr.n);
    const kvq_gear_out go{ga_.data() + gr.g * s_.group * k_, gb_.data() + gr.g * s_.r * k_,
                          goi_.data() + gr.g * nout_, gov_.data() + gr.g * nout_};
    kvq_quantize_gear(X, gr.n, s_.r, keys_, k_, no, c, sc, mn, go, work, bits_);
    std::fill(go.out_idx + no, go.out_idx + nout_, KV_GEAR_NONE);
}

void kivi_side::move_group(int64_t g, int64_t ng, const int16_t* newt, int) {
    if (g != ng) {
        if (keys_) kv_move_rows(scale_.data(), gw_, g, ng);
        kv_move_rows(min_.data(), KV_GRID_STEPS, g, ng);
        if (k_ > 0) kv_move_rows(gb_.data(), (int64_t)s_.r * k_, g, ng);
    }
    if (!s_.gear) return;
    // sparse corrections of the kept tokens, re-indexed to their new place
    const int r = s_.r;
    int o2 = 0;
    for (int o = 0; o < nout_; o++) {
        const uint16_t idx = goi_[g * nout_ + o];
        if (idx == KV_GEAR_NONE) break;
        const int t = idx / r, c = idx % r;
        if (newt[t] < 0) continue;
        goi_[ng * nout_ + o2] = (uint16_t)(newt[t] * r + c);
        gov_[ng * nout_ + o2] = gov_[g * nout_ + o];
        o2++;
    }
    for (; o2 < nout_; o2++) goi_[ng * nout_ + o2] = KV_GEAR_NONE;
}

size_t kivi_bytes(int bits, const kv_side_shape& s) {
    const size_t C = (size_t)s.capacity, MG = (size_t)s.max_groups;
    size_t b = (size_t)s.residual * s.r * kv_elem_size(s.type);  // residual window
    b += C * (s.role == KV_ROLE_KEYS ? kv_key_row_bytes(bits, s.r, s.tail, s.zero, s.mid) : kv_kivi_row_bytes(bits, s.r)) +
         KV_Q4_PAD;  // codes
    b += s.role == KV_ROLE_KEYS ? MG * 2 * (size_t)kv_key_grid_words(s.r, s.zero)  // grid codes per (group, channel)
                                : C * 2 * (size_t)kv_n_blocks(s.r, KV_Q4_VBLOCK);  // per (token, block)
    b += MG * 2 * KV_GRID_STEPS;                                        // steps per group
    if (s.gear) {
        const size_t k = s.gear_rank;
        b += MG * ((size_t)s.group * k * 2 + (size_t)s.r * k * 2 + 4 * (size_t)n_out_for(s, s.group));
    }
    return b;
}

std::string kivi_describe(int bits, const kv_side_shape& s) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%d-bit (keys per channel over %d tokens, values per token in blocks of %d, 8-bit scales+mins "
                  "against f16 steps per group, "
                  "%d-token %s residual window)%s",
                  bits, s.group, KV_Q4_VBLOCK, s.residual, dtype_name(s.type), s.gear ? " + GEAR" : "");
    std::string d = buf;
    if (s.gear) {
        std::snprintf(buf, sizeof buf, " (rank %d, %.1f%% outliers)", s.gear_rank, 100.0 * s.gear_outliers);
        d += buf;
    }
    return d;
}

}  // namespace

const kv_layout& kv_layout_q4() {
    static const kv_layout l{
        KV_LAYOUT_Q4, 4, "4-bit", true, true, [](const kv_side_shape& s) { return kivi_bytes(4, s); },
        [](const kv_side_shape& s) -> std::unique_ptr<kv_side> { return std::make_unique<kivi_side>(s, 4); },
        [](const kv_side_shape& s) { return kivi_describe(4, s); }};
    return l;
}

const kv_layout& kv_layout_q2() {
    static const kv_layout l{
        KV_LAYOUT_Q2, 2, "2-bit", true, true, [](const kv_side_shape& s) { return kivi_bytes(2, s); },
        [](const kv_side_shape& s) -> std::unique_ptr<kv_side> { return std::make_unique<kivi_side>(s, 2); },
        [](const kv_side_shape& s) { return kivi_describe(2, s); }};
    return l;
}

}  // namespace zk
