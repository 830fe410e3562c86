// Writing new tokens into a device copy of the KV cache, in the layouts of
// kernels/attention.h and engine/kv_cache.h (the CPU twins are
// engine/kv_quant.h's quantizers; results are bit for bit theirs: f16 scales
// rounded up and mins down with the same stepping, codes rounded half away
// from zero as lround does). The bookkeeping (n_used, n_quant, group starts,
// when a 4-bit group is flushed) stays on the host, as in kv_cache::append:
//   16-bit: cuda_kv_store_rows at slot n_used;
//   8-bit:  cuda_kv_quantize_q8 at slot n_used (keys and values alike);
//   4-bit:  rows into the residual window (cuda_kv_store_rows); when it holds
//           `residual` tokens, its oldest `group` rows are quantized as group
//           g at slot n_quant (cuda_kv_quantize_q4_keys, _values) and the
//           window's rest moves down (two cuda_copy_on_device through a scratch
//           buffer: the ranges overlap).
// GEAR's correction (power iterations, outlier selection) is not on the GPU:
// a GEAR cache quantizes its groups on the host.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

// Source rows: n rows of r channels, row t at t * stride, f32 or f16.
struct cuda_rows {
    dptr<const float> f32;     // one of f32 / f16
    dptr<const uint16_t> f16;
    int64_t stride = 0;
    int64_t n = 0;
    int r = 0;
};

// dst rows (f32 or f16, dense [slots x r]) from slot0 on.
void cuda_kv_store_rows(const cuda_rows& src, dptr<float> dst32, dptr<uint16_t> dst16, int64_t slot0,
                        cuda_stream stream);
// 8-bit per token: codes [slots x r], scales [slots x blocks32(r)] from slot0 on.
void cuda_kv_quantize_q8(const cuda_rows& src, dptr<int8_t> codes, dptr<uint16_t> scales, int64_t slot0,
                         cuda_stream stream);
// 4-bit values per token: codes [slots x (r + 1) / 2], scales and mins
// [slots x blocks32(r)] from slot0 on.
void cuda_kv_quantize_q4_values(const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> scales,
                                dptr<uint16_t> mins, int64_t slot0, cuda_stream stream);
// 4-bit keys of one group (src.n tokens) per channel: codes rows from slot0 on,
// the group's scales and mins [r] at gscales / gmins.
void cuda_kv_quantize_q4_keys(const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> gscales,
                              dptr<uint16_t> gmins, int64_t slot0, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
