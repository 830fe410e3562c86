// Prefill attention (attention_prefill.h): the tile plan (host) and the tile
// kernel.
#include "kernels/cuda/attention_prefill.h"

#include <algorithm>

#include "ggml-like/error.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_pf_block = 128;
constexpr int k_pf_nw = k_pf_block / 32;
constexpr int k_ch = k_attn_chunk;

// Element c of slot s's key (value) row of a full-precision block.
__device__ __forceinline__ float row_elem(const cuda_kv_head& kv, bool value, int64_t s, int r, int c) {
    const int64_t o = s * r + c;
    if (kv.type == CUDA_KV_F32) return value ? (float)kv.v32[o] : (float)kv.k32[o];
    return h2f(value ? kv.v16[o] : kv.k16[o]);
}

// First slot past the last position <= p (positions ascend).
__device__ inline int64_t visible_end(const cuda_kv_head& kv, int32_t p) {
    int64_t lo = 0, hi = kv.n_slots;
    while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (kv.pos[mid] <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

// One tile. Shared memory (floats): qs [rows x rk] scaled queries, kt [32 x rk]
// and vt [32 x rv] the chunk's keys and values, sc [rows x 32], acc
// [rows x rv], m_run, l_run, fsc [rows].
// (4 blocks per SM: ptxas then takes ~100 registers and spills nothing;
// left free it aimed at 64 on sm_80 and spilled 24 bytes)
__global__ void __launch_bounds__(k_pf_block, 4)
    attn_prefill_kernel(dptr<const cuda_attn_item> items, dptr<const cuda_prefill_task> tasks) {
    const cuda_prefill_task& task = tasks[blockIdx.x];
    const cuda_attn_item& it = items[task.item];
    const cuda_kv_head& kv = it.kv;
    const int G = it.n_group, rows = task.n_rows, row0 = task.row0;
    const int rk = kv.r_k, rv = kv.r_v, tid = threadIdx.x;

    ZK_SHARED_DYNAMIC(smem);
    sptr<float> qs = smem_take<float>(smem, (int64_t)rows * rk, "qs");
    sptr<float> kt = smem_take<float>(smem, (int64_t)k_ch * rk, "kt");
    sptr<float> vt = smem_take<float>(smem, (int64_t)k_ch * rv, "vt");
    sptr<float> sc = smem_take<float>(smem, (int64_t)rows * k_ch, "sc");
    sptr<float> acc = smem_take<float>(smem, (int64_t)rows * rv, "acc");
    sptr<float> m_run = smem_take<float>(smem, rows, "m_run");
    sptr<float> l_run = smem_take<float>(smem, rows, "l_run");
    sptr<float> fsc = smem_take<float>(smem, rows, "fsc");

    for (int i = tid; i < rows * rk; i += k_pf_block) {
        const int r = row0 + i / rk, c = i % rk;
        qs[i] = it.q[(r / G) * it.q_stride + (r % G) * it.q_head_stride + c] * it.scale;
    }
    for (int i = tid; i < rows * rv; i += k_pf_block) acc[i] = 0.0f;
    for (int i = tid; i < rows; i += k_pf_block) m_run[i] = -INFINITY, l_run[i] = 0.0f;
    // the slots the tile's last token sees (the others see a prefix of them)
    const int64_t e = visible_end(kv, it.q_pos[(row0 + rows - 1) / G]);

    for (int64_t c0 = 0; c0 < e; c0 += k_ch) {
        const int n = (int)cu_min<int64_t>(k_ch, e - c0);
        for (int i = tid; i < n * rk; i += k_pf_block) kt[i] = row_elem(kv, false, c0 + i / rk, rk, i % rk);
        for (int i = tid; i < n * rv; i += k_pf_block) vt[i] = row_elem(kv, true, c0 + i / rv, rv, i % rv);
        __syncthreads();  // queries (first chunk), keys and values in

        for (int i = tid; i < rows * k_ch; i += k_pf_block) {
            const int r = i / k_ch, sl = i % k_ch;
            if (sl >= n) continue;
            float d = 0;
            for (int c = 0; c < rk; c++) d += qs[r * rk + c] * kt[sl * rk + c];
            sc[i] = kv.pos[c0 + sl] <= it.q_pos[(row0 + r) / G] ? d : -INFINITY;
        }
        __syncthreads();  // scores written

        attn_softmax_chunk(sc, n, rows, m_run, l_run, fsc, k_pf_nw);
        __syncthreads();  // probabilities written

        attn_accumulate(acc, sc, vt, fsc, n, rows, rv, k_pf_block);
        __syncthreads();  // kt, vt and sc free again
    }
    __syncthreads();  // (no chunk: the initial values)

    for (int i = tid; i < rows * rv; i += k_pf_block) {
        const int r = i / rv, c = i % rv, R = row0 + r;
        const float l = l_run[r];
        it.out[(R / G) * it.out_stride + (R % G) * it.out_head_stride + c] = l > 0 ? (float)acc[i] * (1.0f / l) : 0.0f;
    }
}

size_t tile_smem(int rows, int rk, int rv) {
    return sizeof(float) * ((size_t)rows * (rk + k_ch + rv + 3) + (size_t)k_ch * (rk + rv)) + 64;
}

}  // namespace

cuda_prefill_plan cuda_prefill_plan_make(const std::vector<cuda_attn_item>& items, int rows_base, size_t smem_max) {
    cuda_prefill_plan plan;
    int r_max = 1;
    for (size_t i = 0; i < items.size(); i++) {
        const cuda_kv_head& kv = items[i].kv;
        if (kv.quant != 0 || kv.n_quant != 0 || kv.n_sink_slots != 0)
            ZK_THROW("CUDA prefill attention: item %zu holds quantized slots or exact sinks (cuda_attention_decode "
                     "takes those)", i);
        if (kv.r_k < 1 || kv.r_v < 1 || kv.r_k > k_attn_max_rank || kv.r_v > k_attn_max_rank)
            ZK_THROW("CUDA prefill attention: item %zu has ranks r_k %d, r_v %d (1..%d)", i, kv.r_k, kv.r_v,
                     k_attn_max_rank);
        r_max = std::max(r_max, kv.r_k + kv.r_v);
    }
    rows_base = std::max(1, rows_base);
    for (size_t i = 0; i < items.size(); i++) {
        const cuda_attn_item& it = items[i];
        const cuda_kv_head& kv = it.kv;
        const int r = kv.r_k + kv.r_v, M = it.n_tok * it.n_group;
        int br = std::min(k_prefill_max_rows, std::max(1, rows_base * r_max / r));
        while (br > 1 && tile_smem(br, kv.r_k, kv.r_v) > smem_max) br--;
        if (tile_smem(br, kv.r_k, kv.r_v) > smem_max)
            ZK_THROW("CUDA prefill attention: ranks %d + %d need %zu bytes of shared memory (%zu available)", kv.r_k,
                     kv.r_v, tile_smem(br, kv.r_k, kv.r_v), smem_max);
        for (int row0 = 0; row0 < M; row0 += br) {
            const int n = std::min(br, M - row0);
            const int64_t t_last = (row0 + n - 1) / it.n_group;
            const int64_t vis = std::max<int64_t>(1, kv.n_slots - it.n_tok + t_last + 1);
            plan.tasks.push_back({(int32_t)i, row0, n, (int64_t)n * vis * r});
            plan.smem_bytes = std::max(plan.smem_bytes, tile_smem(n, kv.r_k, kv.r_v));
        }
    }
    std::stable_sort(plan.tasks.begin(), plan.tasks.end(),
                     [](const cuda_prefill_task& a, const cuda_prefill_task& b) { return a.cost > b.cost; });
    return plan;
}

void cuda_attention_prefill(dptr<const cuda_attn_item> items, const cuda_prefill_plan& plan,
                            dptr<const cuda_prefill_task> tasks, cuda_stream stream) {
    if (plan.tasks.empty()) return;
    if (plan.smem_bytes > 48 * 1024) ZK_SET_MAX_DYNAMIC_SMEM(attn_prefill_kernel, plan.smem_bytes);
    ZK_LAUNCH(attn_prefill_kernel, dim3((unsigned)plan.tasks.size()), dim3(k_pf_block), plan.smem_bytes, stream, items,
              tasks);
}

}  // namespace cuda
}  // namespace zk
