#include "engine/kv_layout_rows.h"

#include <vector>

namespace zk {

namespace {

class rows_side final : public kv_side {
public:
    explicit rows_side(const kv_side_shape& s)
        : r_(s.r), type_(s.type), row_((int64_t)s.r * kv_elem_size(s.type)), rows_((size_t)s.capacity * row_) {}

    kv_layout_id layout() const override { return KV_LAYOUT_ROWS; }
    void append(int64_t s, int64_t, const float* x) override { kv_store_row(type_, x, rows_.data() + s * row_, r_); }
    void flush(const kv_group_ref&, int64_t, float*, float*) override {}  // every slot is a row already
    void read(int64_t s, int64_t, const kv_group_ref&, float* x) const override {
        kv_load_row(type_, rows_.data() + s * row_, x, r_);
    }
    void move_quant(int64_t s, int64_t w, int64_t, int, int64_t, int) override {
        kv_move_rows(rows_.data(), row_, s, w);
    }
    void move_tail(int64_t s, int64_t w, int64_t, int64_t) override { kv_move_rows(rows_.data(), row_, s, w); }
    attn_side_view view(int64_t) const override {
        attn_side_view v;
        v.layout = KV_LAYOUT_ROWS;
        v.rows = rows_.data();
        return v;
    }
    size_t bytes_allocated() const override { return rows_.size(); }

private:
    int r_;
    dtype type_;
    int64_t row_;                // bytes per row
    std::vector<uint8_t> rows_;  // [capacity x r] of type_
};

size_t rows_bytes(const kv_side_shape& s) { return (size_t)s.capacity * s.r * kv_elem_size(s.type); }

std::unique_ptr<kv_side> rows_create(const kv_side_shape& s) { return std::make_unique<rows_side>(s); }

std::string rows_describe(const kv_side_shape& s) { return dtype_name(s.type); }

}  // namespace

const kv_layout& kv_layout_rows() {
    static const kv_layout l{KV_LAYOUT_ROWS, 16, "16-bit", false, false, rows_bytes, rows_create, rows_describe};
    return l;
}

}  // namespace zk
