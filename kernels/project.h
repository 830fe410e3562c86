// Projection of one head vector onto the first r directions of a compressed
// head: x[0:r] <- P x, P = R[:, :r]^T stored row-major [r x d]. Used for
// q~ = q R[:, :r_k] and k~ = k R[:, :r_k] (compressed attention). In place; the
// channels past r are left as they were (callers ignore them).
#pragma once

namespace zk {

void kernel_project_head(const float* P, int r, int d, float* x);

}  // namespace zk
