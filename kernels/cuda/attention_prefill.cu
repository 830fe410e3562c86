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
static_assert(k_attn_chunk == k_kv_chunk, "the prefill chunk is kv_read.cuh's");

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

// Channels of a tile's query rows, key rows and value rows / accumulators:
// r_k and r_v, or sink_dim where the block has exact sinks (their rows are
// full head dim; the other slots use the first r_k / r_v channels).
__device__ __forceinline__ int tile_qdim(const cuda_kv_head& kv) {
    return kv.n_sink_slots > 0 ? cu_max(kv.r_k, kv.sink_dim) : kv.r_k;
}
__device__ __forceinline__ int tile_width(const cuda_kv_head& kv) {
    return kv.n_sink_slots > 0 ? cu_max(kv.r_v, kv.sink_dim) : kv.r_v;
}

// One tile. Shared memory (floats unless noted): qs [rows x qd] scaled
// queries, kt [32 x (qd + 1)] and vt [32 x width] the chunk's keys and values
// (dequantized; key rows an odd number of floats apart, so that the 32 lanes
// of a warp scoring one query row against the chunk's 32 slots read 32
// different banks: rows qd apart put them all in one bank, a 32-way
// conflict), sc [rows x 32], acc [rows x width], m_run, l_run, fsc [rows],
// sg, st [32] int32 (slot -> KIVI group, index in it). Two passes over the
// visible slots: the exact sink rows (sink_dim channels), then the cache's
// (r_k / r_v channels, in their layouts).
// (4 blocks per SM: ptxas then takes 126 registers and spills nothing;
// left free it aimed at 64 on sm_80 and spilled 24 bytes)
__global__ void __launch_bounds__(k_pf_block, 4)
    attn_prefill_kernel(dptr<const cuda_attn_item> items, dptr<const cuda_prefill_task> tasks) {
    const cuda_prefill_task& task = tasks[blockIdx.x];
    const cuda_attn_item& it = items[task.item];
    const cuda_kv_head& kv = it.kv;
    const int G = it.n_group, rows = task.n_rows, row0 = task.row0;
    const int qd = tile_qdim(kv), W = tile_width(kv), tid = threadIdx.x;

    ZK_SHARED_DYNAMIC(smem);
    sptr<float> qs = smem_take<float>(smem, (int64_t)rows * qd, "qs");
    sptr<float> kt = smem_take<float>(smem, (int64_t)k_ch * (qd + 1), "kt");
    sptr<float> vt = smem_take<float>(smem, (int64_t)k_ch * W, "vt");
    sptr<float> sc = smem_take<float>(smem, (int64_t)rows * k_ch, "sc");
    sptr<float> acc = smem_take<float>(smem, (int64_t)rows * W, "acc");
    sptr<float> m_run = smem_take<float>(smem, rows, "m_run");
    sptr<float> l_run = smem_take<float>(smem, rows, "l_run");
    sptr<float> fsc = smem_take<float>(smem, rows, "fsc");
    sptr<int32_t> sg = smem_take<int32_t>(smem, k_ch, "sg");
    sptr<int32_t> st = smem_take<int32_t>(smem, k_ch, "st");

    for (int i = tid; i < rows * qd; i += k_pf_block) {
        const int r = row0 + i / qd, c = i % qd;
        qs[i] = it.q[(r / G) * it.q_stride + (r % G) * it.q_head_stride + c] * it.scale;
    }
    for (int i = tid; i < rows * W; i += k_pf_block) acc[i] = 0.0f;
    for (int i = tid; i < rows; i += k_pf_block) m_run[i] = -INFINITY, l_run[i] = 0.0f;
    // the slots the tile's last token sees (the others see a prefix of them)
    const int64_t e = visible_end(kv, it.q_pos[(row0 + rows - 1) / G]);

    for (int pass = 0; pass < 2; pass++) {
        const bool sink = pass == 0;
        const int64_t a = sink ? 0 : kv.n_sink_slots, b = sink ? cu_min(kv.n_sink_slots, e) : e;
        const int ck = sink ? kv.sink_dim : kv.r_k, cv = sink ? kv.sink_dim : kv.r_v;
        const int kld = ck | 1;  // the staged key rows' stride (odd: above)
        for (int64_t c0 = a; c0 < b; c0 += k_ch) {
            const int n = (int)cu_min<int64_t>(k_ch, b - c0);
            if (!sink) kv_chunk_groups(kv, c0, n, sg, st);
            __syncthreads();  // queries (first chunk) and the chunk's groups in
            kv_stage_chunk(kv, kv.k, true, sink, ck, c0, n, sg, st, kt, kld, k_pf_block);
            kv_stage_chunk(kv, kv.v, false, sink, cv, c0, n, sg, st, vt, cv, k_pf_block);
            __syncthreads();  // keys and values in

            for (int i = tid; i < rows * k_ch; i += k_pf_block) {
                const int r = i / k_ch, sl = i % k_ch;
                if (sl >= n) continue;
                float d = 0;
                for (int c = 0; c < ck; c++) d += qs[r * qd + c] * kt[sl * kld + c];
                sc[i] = kv.pos[c0 + sl] <= it.q_pos[(row0 + r) / G] ? d : -INFINITY;
            }
            __syncthreads();  // scores written

            attn_softmax_chunk(sc, n, rows, m_run, l_run, fsc, k_pf_nw);
            __syncthreads();  // probabilities written

            attn_accumulate(acc, sc, vt, fsc, n, rows, W, cv, k_pf_block);
            __syncthreads();  // kt, vt, sc, sg and st free again
        }
    }
    __syncthreads();  // (no chunk: the initial values)

    for (int i = tid; i < rows * W; i += k_pf_block) {
        const int r = i / W, c = i % W, R = row0 + r;
        const float l = l_run[r];
        it.out[(R / G) * it.out_stride + (R % G) * it.out_head_stride + c] = l > 0 ? (float)acc[i] * (1.0f / l) : 0.0f;
    }
}

// Shared memory of a tile of `rows` query rows.
size_t tile_smem(int rows, const cuda_kv_head& kv) {
    const int qd = kv.n_sink_slots > 0 ? std::max(kv.r_k, kv.sink_dim) : kv.r_k;
    const int W = kv.n_sink_slots > 0 ? std::max(kv.r_v, kv.sink_dim) : kv.r_v;
    return sizeof(float) * ((size_t)rows * (qd + k_ch + W + 3) + (size_t)k_ch * (qd + 1 + W)) +
           2 * sizeof(int32_t) * k_ch + 64;  // + alignment slack of the carving
}

}  // namespace

cuda_prefill_plan cuda_prefill_plan_make(const std::vector<cuda_attn_item>& items, int rows_base, size_t smem_max) {
    cuda_prefill_plan plan;
    int r_max = 1;
    for (size_t i = 0; i < items.size(); i++) {
        const cuda_kv_head& kv = items[i].kv;
        cuda_kv_head_check(kv, "CUDA prefill attention", (int)i);
        if (items[i].n_group < 1 || items[i].n_tok < 1)
            ZK_THROW("CUDA prefill attention: item %zu: %d tokens x %d heads", i, items[i].n_tok, items[i].n_group);
        r_max = std::max(r_max, kv.r_k + kv.r_v);
    }
    rows_base = std::max(1, rows_base);
    for (size_t i = 0; i < items.size(); i++) {
        const cuda_attn_item& it = items[i];
        const cuda_kv_head& kv = it.kv;
        const int r = kv.r_k + kv.r_v, M = it.n_tok * it.n_group;
        int br = std::min(k_prefill_max_rows, std::max(1, rows_base * r_max / r));
        while (br > 1 && tile_smem(br, kv) > smem_max) br--;
        if (tile_smem(br, kv) > smem_max)
            ZK_THROW("CUDA prefill attention: ranks %d + %d (sinks of %d channels) need %zu bytes of shared memory "
                     "(%zu available)", kv.r_k, kv.r_v, kv.n_sink_slots > 0 ? kv.sink_dim : 0, tile_smem(br, kv),
                     smem_max);
        for (int row0 = 0; row0 < M; row0 += br) {
            const int n = std::min(br, M - row0);
            const int64_t t_last = (row0 + n - 1) / it.n_group;
            const int64_t vis = std::max<int64_t>(1, kv.n_slots - it.n_tok + t_last + 1);
            plan.tasks.push_back({(int32_t)i, row0, n, (int64_t)n * vis * r});
            plan.smem_bytes = std::max(plan.smem_bytes, tile_smem(n, kv));
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
