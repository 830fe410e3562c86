#include "engine/kv_layout.h"

#include "engine/kv_layout_kivi.h"
#include "engine/kv_layout_q8.h"
#include "engine/kv_layout_rows.h"
#include "engine/kv_layout_vq.h"
#include "ggml-like/error.h"
#include "kernels/convert.h"

namespace zk {

const kv_layout& kv_layout_get(kv_layout_id id) {
    // indexed by kv_layout_id
    static const kv_layout* const table[KV_LAYOUT_COUNT] = {&kv_layout_rows(), &kv_layout_q8(), &kv_layout_q4(),
                                                            &kv_layout_q2(), &kv_layout_vq()};
    ZK_ASSERT(id >= 0 && id < KV_LAYOUT_COUNT && table[id]->id == id);
    return *table[id];
}

const kv_layout* kv_layout_for_bits(int bits) {
    if (kv_bits_vq(bits)) bits = 1;  // both value-code precisions: one layout, the books differ
    for (int i = 0; i < KV_LAYOUT_COUNT; i++)
        if (kv_layout_get((kv_layout_id)i).bits == bits) return &kv_layout_get((kv_layout_id)i);
    return nullptr;
}

void kv_side::drop_front(int64_t, int64_t, int64_t, int64_t) {
    ZK_THROW("the %s KV layout cannot drop its oldest groups (only a tier's KIVI sides do)", kv_layout_get(layout()).name);
}

void kv_side::copy_into(std::unique_ptr<kv_side>&) const {
    ZK_THROW("the %s KV layout cannot be copied (only a tier's KIVI sides are)", kv_layout_get(layout()).name);
}

const char* kv_layout_bits_list() { return "16, 8, 4 or 2"; }

size_t kv_elem_size(dtype t) { return t == dtype::F32 ? 4 : 2; }

void kv_store_row(dtype t, const float* src, uint8_t* dst, int r) {
    if (t == dtype::F32)
        std::memcpy(dst, src, sizeof(float) * r);
    else
        kernel_f32_to_f16(src, (uint16_t*)dst, r);
}

void kv_load_row(dtype t, const uint8_t* src, float* dst, int r) {
    if (t == dtype::F32)
        std::memcpy(dst, src, sizeof(float) * r);
    else
        for (int i = 0; i < r; i++) dst[i] = fp16_to_fp32(((const uint16_t*)src)[i]);
}

}  // namespace zk
