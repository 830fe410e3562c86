// The q/k projection onto R_qk on the GPU: for every token t and head h of
// x [n_tok x n_heads x d], x[t, h, 0:r] <- P_h x[t, h, :], P_h = R[:, :r]^T
// row-major [r_h x d], in place (channels past r left as they were). A head's
// matrix holds d rows (the full R^T); it uses the first ranks[h] of them, or
// all d for tokens at positions below full_below (exact sinks keep their keys
// and queries at full head dim). With shift ([n_heads x d], or null), row j <
// ranks[h] less shift[h, j], sink rows too (the mean key a session leaves out
// of its cache: engine/session.h). CPU twin: kernel_project_head per (t, h),
// then the subtraction (backend_cpu::project_qk).
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

// mats: [n_heads] device pointers to [d x d] matrices (heads may share one);
// ranks: [n_heads]; pos: [n_tok] (may be null when full_below is 0). d <= 256.
void cuda_project_heads(dptr<float> x, int64_t n_tok, int n_heads, int d, dptr<const dptr<const float>> mats,
                        dptr<const int32_t> ranks, dptr<const int32_t> pos, int32_t full_below,
                        dptr<const float> shift, cuda_stream stream);

}  // namespace cuda
}  // namespace zk
