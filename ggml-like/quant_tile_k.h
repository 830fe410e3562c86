// Internal to quant_pack.cpp: the SIMD kernels for the packed layouts
// (quant_pack.h). Each returns false, doing nothing, where the build has no
// SIMD version, and the caller falls back to the scalar references.
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml-like/dtype.h"

namespace zk {

bool quant_tile_k_has_simd(dtype t);
// quant_pack_tile over nb packed blocks (group: the row group's first block).
bool quant_tile_k_run(dtype t, int64_t nb, const void* group, int nr, const void* a, size_t a_stride, int nt,
                      float* y, size_t y_stride, const void* prefetch);
// quant_pack_quantize for the K-quants (n a multiple of 256).
bool quant_tile_k_quantize(const float* x, void* dst, int64_t n);

}  // namespace zk
