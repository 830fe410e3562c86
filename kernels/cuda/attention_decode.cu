// Decode attention over the compressed cache (attention_decode.h): the plan
// (host), the range kernel and the merge kernel.
#include "kernels/cuda/attention_decode.h"

#include <algorithm>
#include <cmath>

#include "ggml-like/error.h"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/attention_decode_fast.h"
#include "kernels/cuda/cuda_common.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_nw = k_attn_block / 32;  // warps per block
constexpr int k_ch = k_attn_chunk;
constexpr int k_lane_ch = k_attn_max_rank / 32;  // channels a lane holds of a key row (L = 32)
static_assert(k_attn_chunk == k_kv_chunk, "the decode chunk is kv_read.cuh's");

// The channels c = li + i L (i < 8) of slot s's key row, as the attention sees
// it (dequantized by the key side's layout, GEAR-corrected; zero past rk).
// sg/st: the chunk's slots' KIVI group and index in it, sl: s's index in the
// chunk.
__device__ inline void key_lane(const cuda_kv_head& kv, bool sink, int64_t s, int sl, int li, int L, int rk,
                                sptr<int32_t> sg, sptr<int32_t> st, float (&kr)[k_lane_ch]) {
    ZK_UNROLL
    for (int i = 0; i < k_lane_ch; i++) kr[i] = 0.0f;
    if (sink) {
        const int64_t o = (int64_t)kv.pos[s] * kv.sink_dim;
        ZK_UNROLL
        for (int i = 0; i < k_lane_ch; i++) {
            const int c = li + i * L;
            if (c < rk) kr[i] = kv.sink_k[o + c];
        }
        return;
    }
    const cuda_kv_side& d = kv.k;
    const bool grouped = kv_is_kivi(d.layout) && s < d.n_quant;
    const int32_t g = grouped ? (int32_t)sg[sl] : 0;
    const int t = grouped ? (int)st[sl] : 0;
    const kv_row_at w = kv_row(d, kv.type, true, rk, s, g, t);
    ZK_UNROLL
    for (int i = 0; i < k_lane_ch; i++) {
        const int c = li + i * L;
        if (c < rk) kr[i] = kv_row_elem(d, w, kv.group, rk, c);
    }
    if (grouped && d.gear_nout > 0)
        kv_gear_sparse(d, rk, g, t, [&](int c, float x) {
            ZK_UNROLL
            for (int i = 0; i < k_lane_ch; i++)
                if (li + i * L == c) kr[i] += x;
        });
}

// One task: the partial of an item's query rows over slots [s0, s1) (or its
// sink rows). Shared memory (floats unless noted):
//   qs [rows x rk] scaled queries     sc [rows x 32] scores, then probabilities
//   vt [32 x rv] the chunk's values   acc [rows x rv] unnormalised sums
//   m_run, l_run, fsc [rows]          sg, st [32] int32: slot -> group, index in group
// (3 blocks per SM: ptxas then keeps it at <= 168 registers on sm_80 and
// sm_90 with nothing spilled; left free, sm_90 chose 128 and spilled)
__global__ void __launch_bounds__(k_attn_block, 3)
    attn_decode_kernel(dptr<const cuda_attn_item> items, dptr<const cuda_attn_task> tasks, dptr<float> partials) {
    const cuda_attn_task& task = tasks[blockIdx.x];
    const cuda_attn_item& it = items[task.item];
    const cuda_kv_head& kv = it.kv;
    const bool sink = task.sink != 0;
    const int G = it.n_group, rows = it.n_tok * G;
    const int rk = sink ? kv.sink_dim : kv.r_k, rv = sink ? kv.sink_dim : kv.r_v;
    const int tid = threadIdx.x, lane = tid % 32, wid = tid / 32;

    ZK_SHARED_DYNAMIC(smem);
    sptr<float> qs = smem_take<float>(smem, (int64_t)rows * rk, "qs");
    sptr<float> sc = smem_take<float>(smem, (int64_t)rows * k_ch, "sc");
    sptr<float> vt = smem_take<float>(smem, (int64_t)k_ch * rv, "vt");
    sptr<float> acc = smem_take<float>(smem, (int64_t)rows * rv, "acc");
    sptr<float> m_run = smem_take<float>(smem, rows, "m_run");
    sptr<float> l_run = smem_take<float>(smem, rows, "l_run");
    sptr<float> fsc = smem_take<float>(smem, rows, "fsc");
    sptr<int32_t> sg = smem_take<int32_t>(smem, k_ch, "sg");
    sptr<int32_t> st = smem_take<int32_t>(smem, k_ch, "st");

    for (int i = tid; i < rows * rk; i += k_attn_block) {
        const int r = i / rk, c = i % rk, t = r / G, j = r % G;
        qs[i] = it.q[t * it.q_stride + j * it.q_head_stride + c] * it.scale;
    }
    for (int i = tid; i < rows * rv; i += k_attn_block) acc[i] = 0.0f;
    for (int i = tid; i < rows; i += k_attn_block) m_run[i] = -INFINITY, l_run[i] = 0.0f;

    // L lanes share a slot's key row: at most 8 channels each
    int L = 1;
    while (L < 32 && L * k_lane_ch < rk) L *= 2;
    const int spw = 32 / L, li = lane % L, grp = lane / L;

    for (int64_t c0 = task.s0; c0 < task.s1; c0 += k_ch) {
        const int n = (int)cu_min<int64_t>(k_ch, task.s1 - c0);
        if (!sink) kv_chunk_groups(kv, c0, n, sg, st);
        __syncthreads();

        // scores: every lane calls the shuffles, slot or not
        for (int base = 0; base < n; base += k_nw * spw) {
            const int sl = base + wid * spw + grp;
            const bool valid = sl < n;
            float kr[k_lane_ch];
            if (valid) {
                key_lane(kv, sink, c0 + sl, sl, li, L, rk, sg, st, kr);
            } else {
                ZK_UNROLL
                for (int i = 0; i < k_lane_ch; i++) kr[i] = 0.0f;
            }
            const int32_t ps = valid ? kv.pos[c0 + sl] : 0;
            for (int r = 0; r < rows; r++) {
                float d = 0;
                ZK_UNROLL
                for (int i = 0; i < k_lane_ch; i++) {
                    const int c = li + i * L;
                    if (c < rk) d += kr[i] * qs[r * rk + c];
                }
                d = warp_sum(d, L);
                if (valid && li == 0) {
                    const float v = ps <= it.q_pos[r / G] ? d : -INFINITY;
                    sc[r * k_ch + sl] = v;
                    if (it.logits) it.logits[r * it.logits_stride + c0 + sl] = v;
                }
            }
        }
        __syncthreads();  // scores written

        // online softmax: a warp per query row, a lane per slot
        attn_softmax_chunk(sc, n, rows, m_run, l_run, fsc, k_nw);

        // the chunk's values, dequantized once
        kv_stage_chunk(kv, kv.v, false, sink, rv, c0, n, sg, st, vt, rv, k_attn_block);
        __syncthreads();  // values staged

        // acc = acc * f + P V over the chunk
        attn_accumulate(acc, sc, vt, fsc, n, rows, rv, rv, k_attn_block);
        __syncthreads();
    }

    __syncthreads();  // (a task always has a slot; this keeps an empty one correct too)
    dptr<float> pm = partials + task.part;
    dptr<float> pl = pm + rows;
    dptr<float> pa = pl + rows;
    for (int i = tid; i < rows; i += k_attn_block) pm[i] = m_run[i], pl[i] = l_run[i];
    for (int i = tid; i < rows * rv; i += k_attn_block) pa[i] = acc[i];
}

// The normalised output of row blockIdx.y of item blockIdx.x from its
// partials; channels a part does not have (a range of r_v < a sink's
// sink_dim) count as zeros. The block's threads share the parts: the max and
// the weighted sum of the parts' l as block reductions, the parts' weights kept
// in shared memory (recomputed past k_merge_parts), then a thread per channel
// sums the parts' accumulators, its loads independent of each other (an item
// split into hundreds of ranges, as a batch of one is, merges in microseconds).
constexpr int k_merge_parts = 1024;
__global__ void __launch_bounds__(k_attn_block)
    attn_merge_kernel(dptr<const cuda_attn_item> items, dptr<const cuda_attn_part> parts,
                      dptr<const int32_t> item_parts, dptr<const float> partials) {
    const cuda_attn_item& it = items[blockIdx.x];
    const int G = it.n_group, rows = it.n_tok * G, r = blockIdx.y;
    if (r >= rows) return;  // the whole block: items of fewer rows than the grid's
    const int tid = threadIdx.x;
    const int p0 = item_parts[blockIdx.x], p1 = item_parts[blockIdx.x + 1];
    const int width = cu_max(it.kv.r_v, it.kv.n_sink_slots > 0 ? it.kv.sink_dim : 0);
    ZK_SHARED(float, red, 32);
    ZK_SHARED(float, wts, k_merge_parts);
    float mx = -INFINITY;
    for (int p = p0 + tid; p < p1; p += k_attn_block) mx = fmaxf(mx, partials[parts[p].off + r]);
    const float M = block_max(mx, red);
    dptr<float> out = it.out + (r / G) * it.out_stride + (r % G) * it.out_head_stride;
    if (M == -INFINITY) {  // nothing visible to this row
        for (int c = tid; c < width; c += k_attn_block) out[c] = 0.0f;
        return;
    }
    float ls = 0.0f;
    for (int p = p0 + tid; p < p1; p += k_attn_block) {
        const int64_t off = parts[p].off;
        const float lp = partials[off + rows + r];
        const float w = lp == 0.0f ? 0.0f : expf(partials[off + r] - M);
        if (p - p0 < k_merge_parts) wts[p - p0] = w;
        ls += w * lp;
    }
    const float L = block_sum(ls, red);  // (its barriers publish wts too)
    for (int c = tid; c < width; c += k_attn_block) {
        float o = 0.0f;
        for (int p = p0; p < p1; p++) {
            const int64_t off = parts[p].off;
            float w;
            if (p - p0 < k_merge_parts) {
                w = wts[p - p0];
            } else {
                const float lp = partials[off + rows + r];
                w = lp == 0.0f ? 0.0f : expf(partials[off + r] - M);
            }
            const int d = parts[p].acc_dim;
            if (w != 0.0f && c < d) o += w * partials[off + 2 * rows + (int64_t)r * d + c];
        }
        out[c] = o * (1.0f / L);
    }
}

size_t task_smem(int rows, int rk, int rv) {
    return sizeof(float) * ((size_t)rows * (rk + k_ch + rv + 3) + (size_t)k_ch * rv) + 2 * sizeof(int32_t) * k_ch +
           64;  // alignment slack of the carving
}

}  // namespace

cuda_attn_plan cuda_attn_plan_make(const std::vector<cuda_attn_item>& items, int blocks, int64_t min_range,
                                   bool allow_fast) {
    cuda_attn_plan plan;
    const int n_items = (int)items.size();
    int64_t total = 0;
    for (int i = 0; i < n_items; i++) {
        const cuda_attn_item& it = items[i];
        const cuda_kv_head& kv = it.kv;
        cuda_kv_head_check(kv, "CUDA decode attention", i);
        if (it.n_group < 1 || it.n_tok < 1)
            ZK_THROW("CUDA decode attention: item %d: %d tokens x %d heads", i, it.n_tok, it.n_group);
        total += (kv.n_slots - kv.n_sink_slots) * (kv.r_k + kv.r_v);
    }
    const int64_t W = std::max<int64_t>(1, total / std::max(1, blocks));
    min_range = std::max<int64_t>(1, min_range);
    std::vector<int64_t> fast_task_ids;
    plan.item_parts.push_back(0);
    for (int i = 0; i < n_items; i++) {
        const cuda_attn_item& it = items[i];
        const cuda_kv_head& kv = it.kv;
        const int rows = it.n_tok * it.n_group;
        plan.max_rows = std::max(plan.max_rows, rows);
        const int64_t a = kv.n_sink_slots, n = kv.n_slots - a;
        const bool fast = allow_fast && cuda_attn_fast_item(it);
        if (fast) plan.max_fast_rows = std::max(plan.max_fast_rows, rows);
        auto add = [&](int sink, int64_t s0, int64_t s1, int64_t cost, int acc_dim, int rk) {
            plan.tasks.push_back({i, sink, s0, s1, plan.partial_floats, cost});
            plan.parts.push_back({plan.partial_floats, acc_dim});
            plan.partial_floats += (int64_t)rows * (2 + acc_dim);
            if (fast)
                fast_task_ids.push_back((int64_t)plan.tasks.size() - 1);
            else
                plan.smem_bytes = std::max(plan.smem_bytes, task_smem(rows, rk, acc_dim));
        };
        if (n > 0) {
            const int64_t cost = n * (kv.r_k + kv.r_v);
            int64_t nc = std::max<int64_t>(1, (cost + W / 2) / W);
            nc = std::max<int64_t>(1, std::min(nc, n / min_range));
            for (int64_t c = 0; c < nc; c++) {
                int64_t s0 = a + n * c / nc;
                const int64_t s1 = a + n * (c + 1) / nc;
                // the fast kernel reads one layout per side: cut where a side turns to rows
                if (fast)
                    for (int64_t cut : {std::min(kv.k.n_quant, kv.v.n_quant), std::max(kv.k.n_quant, kv.v.n_quant)})
                        if (cut > s0 && cut < s1) {
                            add(0, s0, cut, (cut - s0) * (kv.r_k + kv.r_v), kv.r_v, kv.r_k);
                            s0 = cut;
                        }
                add(0, s0, s1, (s1 - s0) * (kv.r_k + kv.r_v), kv.r_v, kv.r_k);
            }
        }
        if (kv.n_sink_slots > 0) add(1, 0, kv.n_sink_slots, kv.n_sink_slots * 2 * kv.sink_dim, kv.sink_dim, kv.sink_dim);
        plan.item_parts.push_back((int32_t)plan.parts.size());
    }
    // fast tasks first, each kind longest first; equal costs keep their creation order
    std::vector<uint8_t> is_fast(plan.tasks.size(), 0);
    for (int64_t k : fast_task_ids) is_fast[k] = 1;
    std::vector<int64_t> order(plan.tasks.size());
    for (size_t k = 0; k < order.size(); k++) order[k] = (int64_t)k;
    std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) {
        if (is_fast[x] != is_fast[y]) return is_fast[x] > is_fast[y];
        return plan.tasks[x].cost > plan.tasks[y].cost;
    });
    std::vector<cuda_attn_task> sorted;
    sorted.reserve(order.size());
    for (int64_t k : order) sorted.push_back(plan.tasks[k]);
    plan.tasks = std::move(sorted);
    plan.n_fast = (int)fast_task_ids.size();
    return plan;
}

void cuda_attention_decode(dptr<const cuda_attn_item> items, int n_items, const cuda_attn_plan& plan,
                           const cuda_attn_plan_device& dplan, dptr<float> partials, cuda_stream stream) {
    if (n_items == 0) return;
    if (dplan.n_tasks != (int)plan.tasks.size()) ZK_THROW("CUDA decode attention: the device plan is not the plan's");
    cuda_attention_decode_fast(items, dplan.tasks, plan.n_fast, plan.fast_variant, plan.max_fast_rows, partials,
                               stream);
    if (dplan.n_tasks > plan.n_fast) {
        if (plan.smem_bytes > 48 * 1024) ZK_SET_MAX_DYNAMIC_SMEM(attn_decode_kernel, plan.smem_bytes);
        ZK_LAUNCH(attn_decode_kernel, dim3(dplan.n_tasks - plan.n_fast), dim3(k_attn_block), plan.smem_bytes, stream,
                  items, dplan.tasks + plan.n_fast, partials);
    }
    ZK_LAUNCH(attn_merge_kernel, dim3(n_items, plan.max_rows), dim3(k_attn_block), 0, stream, items, dplan.parts,
              dplan.item_parts,
              partials);
}

}  // namespace cuda
}  // namespace zk
