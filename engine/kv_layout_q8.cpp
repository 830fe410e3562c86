#include "engine/kv_layout_q8.h"

#include <vector>

#include "engine/kv_quant.h"

namespace zk {

namespace {

class q8_side final : public kv_side {
public:
    explicit q8_side(const kv_side_shape& s)
        : r_(s.r),
          nb_(kv_n_blocks(s.r, KV_Q8_BLOCK)),
          type_(s.type),
          row_((int64_t)s.r * kv_elem_size(s.type)),
          window_((size_t)s.residual * row_),
          codes_((size_t)s.capacity * s.r),
          scale_((size_t)s.capacity * nb_) {}

    kv_layout_id layout() const override { return KV_LAYOUT_Q8; }
    void append(int64_t s, int64_t rs, const float* x) override {
        if (!window_.empty())
            kv_store_row(type_, x, window_.data() + rs * row_, r_);
        else
            quantize(s, x);
    }
    void flush(const kv_group_ref& gr, int64_t rest, float* X, float*) override {
        for (int t = 0; t < gr.n; t++) {
            kv_load_row(type_, window_.data() + t * row_, X, r_);
            quantize(gr.s0 + t, X);
        }
        std::memmove(window_.data(), window_.data() + gr.n * row_, (size_t)(rest * row_));
    }
    void read(int64_t s, int64_t n_quant, const kv_group_ref&, float* x) const override {
        if (s >= n_quant)
            kv_load_row(type_, window_.data() + (s - n_quant) * row_, x, r_);
        else
            kvq_dequantize_q8_row((const int8_t*)codes_.data() + s * r_, scale_.data() + s * nb_, r_, x);
    }
    void move_quant(int64_t s, int64_t w, int64_t, int, int64_t, int) override {
        kv_move_rows(codes_.data(), r_, s, w);
        kv_move_rows(scale_.data(), nb_, s, w);
    }
    void move_tail(int64_t, int64_t, int64_t rs, int64_t rw) override {
        kv_move_rows(window_.data(), row_, rs, rw);
    }
    attn_side_view view(int64_t n_quant) const override {
        attn_side_view v;
        v.layout = KV_LAYOUT_Q8;
        v.n_quant = n_quant;
        v.rows = window_.data();
        v.codes = codes_.data();
        v.scale = scale_.data();
        return v;
    }
    size_t bytes_allocated() const override { return window_.size() + codes_.size() + 2 * scale_.size(); }

private:
    void quantize(int64_t s, const float* x) {
        kvq_quantize_q8_row(x, r_, (int8_t*)codes_.data() + s * r_, scale_.data() + s * nb_);
    }

    int r_, nb_;
    dtype type_;
    int64_t row_;                   // bytes per window row
    std::vector<uint8_t> window_;   // windowed blocks: [residual x r] of type_
    std::vector<uint8_t> codes_;    // int8 [capacity x r]
    std::vector<uint16_t> scale_;   // f16 [capacity x blocks(r)]
};

size_t q8_bytes(const kv_side_shape& s) {
    return (size_t)s.residual * s.r * kv_elem_size(s.type) + (size_t)s.capacity * s.r +
           (size_t)s.capacity * 2 * kv_n_blocks(s.r, KV_Q8_BLOCK);
}

std::unique_ptr<kv_side> q8_create(const kv_side_shape& s) { return std::make_unique<q8_side>(s); }

std::string q8_describe(const kv_side_shape&) { return "8-bit (per token, blocks of 32 channels, f16 scales)"; }

}  // namespace

const kv_layout& kv_layout_q8() {
    static const kv_layout l{KV_LAYOUT_Q8, 8, "8-bit", false, false, q8_bytes, q8_create, q8_describe};
    return l;
}

}  // namespace zk
