// The scores eviction policies keep (engine/evict), on the GPU, from the
// attention logits the decode kernel writes (cuda_attn_item::logits):
//   cuda_evict_accumulate  score[s] += softmax(logits row)[s] over an item's
//                          query rows, in row order: H2O (every row: t_from 0)
//                          and SnapKV's observation window (rows of tokens
//                          t >= t_from = n_query - window);
//   cuda_evict_pool_max    SnapKV's ranking: the max of the scores over
//                          [s - h, s + h].
// CPU twins: the policies' observe() (evict_softmax: float exps, a double sum)
// and SnapKV's rank(). Keyformer's noisy, annealed softmax stays on the host.
#pragma once
#include <cstdint>

#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

struct cuda_evict_item {
    dptr<const float> logits{};  // row (t * n_group + j) at that times logits_stride; -inf: not visible
    int64_t logits_stride = 0;
    int n_tok = 1, n_group = 1;
    int t_from = 0;            // rows of tokens t >= t_from count
    int64_t n = 0;             // slots
    dptr<float> score{};         // [n], added to
};

void cuda_evict_accumulate(dptr<const cuda_evict_item> items, int n_items, cuda_stream stream);
void cuda_evict_pool_max(dptr<const float> score, int64_t n, int half_width, dptr<float> importance,
                         cuda_stream stream);

}  // namespace cuda
}  // namespace zk
