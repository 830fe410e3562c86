#include "engine/kv_layout_vq.h"

#include <cstdio>
#include <vector>

#include "ggml-like/error.h"

namespace zk {

namespace {

class vq_side final : public kv_side {
public:
    explicit vq_side(const kv_side_shape& s)
        : r_(s.r),
          type_(s.type),
          books_(*s.vq),
          book_(*s.vq_head),
          rb_(kv_vq_row_bytes(s.r / s.vq->c, s.vq->bits())),
          row_((int64_t)s.r * kv_elem_size(s.type)),
          window_((size_t)s.residual * row_),
          codes_((size_t)s.capacity * rb_ + KV_VQ_PAD),
          scale_((size_t)s.capacity) {
        ZK_ASSERT(s.role == KV_ROLE_VALUES && s.residual > 0 && !s.gear);
    }

    kv_layout_id layout() const override { return KV_LAYOUT_VQ; }
    void append(int64_t, int64_t rs, const float* x) override { kv_store_row(type_, x, window_.data() + rs * row_, r_); }
    void flush(const kv_group_ref& gr, int64_t rest, float* X, float*) override {
        for (int t = 0; t < gr.n; t++) {
            kv_load_row(type_, window_.data() + t * row_, X, r_);
            kvq_vq_encode_row(books_, book_, X, r_, codes_.data() + (gr.s0 + t) * rb_, scale_.data() + gr.s0 + t);
        }
        std::memmove(window_.data(), window_.data() + gr.n * row_, (size_t)(rest * row_));
    }
    void read(int64_t s, int64_t n_quant, const kv_group_ref&, float* x) const override {
        if (s >= n_quant)
            kv_load_row(type_, window_.data() + (s - n_quant) * row_, x, r_);
        else
            kvq_vq_decode_row(books_, book_, codes_.data() + s * rb_, scale_[s], r_, x);
    }
    void move_quant(int64_t s, int64_t w, int64_t, int, int64_t, int) override {
        kv_move_rows(codes_.data(), rb_, s, w);
        kv_move_rows(scale_.data(), 1, s, w);
    }
    void move_tail(int64_t, int64_t, int64_t rs, int64_t rw) override { kv_move_rows(window_.data(), row_, rs, rw); }
    attn_side_view view(int64_t n_quant) const override {
        attn_side_view v;
        v.layout = KV_LAYOUT_VQ;
        v.n_quant = n_quant;
        v.rows = window_.data();
        v.codes = codes_.data();
        v.scale = scale_.data();
        v.vq.c = books_.c;
        v.vq.K = books_.K;
        v.vq.bits = books_.bits();
        v.vq.book = book_.dec;
        v.vq.book8 = book_.dec8;
        v.vq.book8_scale = book_.dec8_scale;
        return v;
    }
    size_t bytes_allocated() const override { return window_.size() + codes_.size() + 2 * scale_.size(); }

private:
    int r_;
    dtype type_;
    const kv_vq_books& books_;
    kv_vq_book book_;
    int rb_;                        // bytes per code row
    int64_t row_;                   // bytes per window row
    std::vector<uint8_t> window_;   // [residual x r] of type_
    std::vector<uint8_t> codes_;    // [capacity x rb] + KV_VQ_PAD
    std::vector<uint16_t> scale_;   // f16 [capacity]
};

size_t vq_bytes(const kv_side_shape& s) {
    ZK_ASSERT(s.vq);
    return (size_t)s.residual * s.r * kv_elem_size(s.type) +
           (size_t)s.capacity * kv_vq_row_bytes(s.r / s.vq->c, s.vq->bits()) + KV_VQ_PAD + (size_t)s.capacity * 2;
}

std::unique_ptr<kv_side> vq_create(const kv_side_shape& s) { return std::make_unique<vq_side>(s); }

std::string vq_describe(const kv_side_shape& s) {
    char buf[200];
    const int c = s.vq ? s.vq->c : 0, K = s.vq ? s.vq->K : 0;
    std::snprintf(buf, sizeof buf,
                  "vector-coded values (%d channels a code, %d centroids, f16 scale per token, %d-token %s residual "
                  "window)",
                  c, K, s.residual, dtype_name(s.type));
    return buf;
}

}  // namespace

const kv_layout& kv_layout_vq() {
    static const kv_layout l{KV_LAYOUT_VQ, 1, "vector-coded", true, false, vq_bytes, vq_create, vq_describe};
    return l;
}

}  // namespace zk
