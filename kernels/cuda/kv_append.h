// Writing new tokens into a device copy of the KV cache, in the layouts of
// kernels/attention.h and engine/kv_layout*.h (the CPU twins are
// engine/kv_quant.h's quantizers; results are bit for bit theirs: f16 scales
// rounded up and mins down with the same stepping, codes rounded half away
// from zero as lround does, unused bits of a row's last KIVI byte zero).
//
// Per side (keys or values; each in its own layout) the calls mirror
// kv_side::append / flush (engine/kv_layout.h), with the bookkeeping (n_used,
// n_quant, group starts, when a group is flushed) on the host as
// kv_cache::append does it:
//   cuda_kv_side_append  rows side: rows at their slots; 8-bit side of a block
//                        without KIVI: quantized per token at their slots; a
//                        quantizing side of a windowed block (one side KIVI):
//                        rows into the residual window;
//   cuda_kv_side_flush   windowed block, when the window holds `residual`
//                        tokens: its oldest `group` rows become group g at
//                        slot n_quant (KIVI: keys per channel over the group,
//                        values per token; 8-bit: per token), and the window's
//                        rest moves down (two copies through a scratch buffer:
//                        the ranges overlap); a rows side: nothing.
// The single-layout launchers below them are usable alone. GEAR's correction
// (power iterations, outlier selection) is not on the GPU: a GEAR cache
// quantizes its groups on the host.
#pragma once
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

// Source rows: n rows of r channels, row t at t * stride, f32 or f16.
struct cuda_rows {
    dptr<const float> f32{};     // one of f32 / f16
    dptr<const uint16_t> f16{};
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
// KIVI values at `bits` (4 or 2) per token: codes [slots x kv_kivi_row_bytes(bits, r)],
// packed grid codes [slots x blocks32(r)] and f16 steps [slots x KV_GRID_STEPS]
// from slot0 on (kvq_quantize_vrow's bytes).
void cuda_kv_quantize_kivi_values(int bits, const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> grid,
                                  dptr<uint16_t> step, int64_t slot0, cuda_stream stream);
// KIVI keys at `bits` of one group (src.n tokens) per channel: codes rows from
// slot0 on, the group's packed grid codes [r] at grid and its f16 steps
// [KV_GRID_STEPS] at step (kernels/attention.h), bit for bit as
// engine/kv_quant.cpp's kvq_quantize_keys (clipped grids included).
void cuda_kv_quantize_kivi_keys(int bits, const cuda_rows& src, dptr<uint8_t> codes, dptr<uint16_t> grid,
                                dptr<uint16_t> step, int64_t slot0, cuda_stream stream);

// One side of a device cache block as the appends write it: the arrays its
// CPU layout allocates (engine/kv_layout_{rows,q8,kivi}.cpp), at capacity.
struct cuda_kv_side_store {
    int layout = KV_LAYOUT_ROWS;  // kv_layout_id
    bool keys = true;             // KIVI keys: per channel over a group; values per token
    bool windowed = false;        // the block has a KIVI side: quantizing sides keep a residual window
    int r = 0;
    // rows of the cache's type (one of the two): a rows side's [capacity x r];
    // a quantizing side's residual window [residual x r] when windowed
    dptr<float> rows32{};
    dptr<uint16_t> rows16{};
    // Q8: int8 codes (as bytes) [capacity x r], scales [capacity x blocks32(r)];
    // KIVI: codes [capacity x row_bytes(r)]; keys: grid codes [max_groups x r]
    // and steps [max_groups x KV_GRID_STEPS]; values: [capacity x blocks32(r)] both
    dptr<uint8_t> codes{};
    dptr<uint16_t> scale{}, min{};
};

// src's n tokens arrive at slots [s0, s0 + n), window rows [rs0, rs0 + n) of a
// windowed block (rs0 = s0 - n_quant); a windowed block takes at most the
// window's free rows per call (the caller flushes in between).
void cuda_kv_side_append(const cuda_kv_side_store& d, const cuda_rows& src, int64_t s0, int64_t rs0,
                         cuda_stream stream);
// Windowed block: window rows [0, n) become group g at slots [s0, s0 + n), rows
// [n, n + rest) move to the front through scratch (rest x r elements of the
// row type, device memory).
void cuda_kv_side_flush(const cuda_kv_side_store& d, int64_t g, int64_t s0, int n, int64_t rest, void* scratch,
                        cuda_stream stream);

}  // namespace cuda
}  // namespace zk
