// Steps the decode and prefill attention kernels share: the online softmax over
// a chunk of scores and the value accumulation. Shared memory, per block:
//   sc [rows x k_attn_chunk]  scores of the chunk, replaced by probabilities
//   m_run, l_run [rows]       running max and sum of e^(s - max)
//   fsc [rows]                the factor the accumulators are rescaled by
//   vt [n x cv]               the chunk's value rows (f32, cv channels)
//   acc [rows x width]        unnormalised output (width >= cv: a prefill tile
//                             with exact sinks holds sink_dim channels, the
//                             other slots' rows r_v)
#pragma once

#include "kernels/cuda/attention_decode.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kv_read.cuh"

namespace zk {
namespace cuda {

// A warp per row (the block's nw warps take rows in turn), a lane per slot
// (n <= 32): the chunk's probabilities e^(s - m_new) replace its scores; the
// row's max, sum and rescale factor are updated. -inf scores (masked) give 0;
// a row with nothing visible yet keeps m = -inf, l = 0, f = 0.
__device__ inline void attn_softmax_chunk(sptr<float> sc, int n, int rows, sptr<float> m_run, sptr<float> l_run,
                                          sptr<float> fsc, int nw) {
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    for (int r = wid; r < rows; r += nw) {
        const float x = lane < n ? (float)sc[r * k_attn_chunk + lane] : -INFINITY;
        const float m_old = m_run[r];
        const float m_new = fmaxf(m_old, warp_max(x));
        const float p = x == -INFINITY ? 0.0f : expf(x - m_new);
        const float f = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        const float psum = warp_sum(p);
        if (lane < n) sc[r * k_attn_chunk + lane] = p;
        // every lane has read m_run[r] before lane 0 rewrites it (the shuffles
        // above order that too, but compute-sanitizer's racecheck counts only
        // barriers: it reported this read/write pair on an H100)
        __syncwarp();
        if (lane == 0) {
            m_run[r] = m_new;
            l_run[r] = l_run[r] * f + psum;
            fsc[r] = f;
        }
    }
}

// acc = acc * f + P V over the chunk's n slots of cv value channels (channels
// cv .. width of acc only rescaled); a thread per (row, channel).
__device__ inline void attn_accumulate(sptr<float> acc, sptr<float> sc, sptr<float> vt, sptr<float> fsc, int n,
                                       int rows, int width, int cv, int n_threads) {
    for (int i = threadIdx.x; i < rows * width; i += n_threads) {
        const int r = i / width, c = i % width;
        float a = acc[i] * fsc[r];
        if (c < cv)
            for (int sl = 0; sl < n; sl++) a += sc[r * k_attn_chunk + sl] * vt[sl * cv + c];
        acc[i] = a;
    }
}

}  // namespace cuda
}  // namespace zk
