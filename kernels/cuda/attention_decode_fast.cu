// The fast decode-attention kernel (attention_decode_fast.h).
//
// A warp works through its chunks (32 P slots each) in three steps:
//   1. stage: the chunk's key rows, value rows and per-slot scales are copied
//      raw (still quantized) from global to the warp's shared buffer, every
//      lane issuing its loads in batches of 16 before storing any, so a warp
//      has kilobytes in flight (one load at a time, as in the generic kernel,
//      leaves the GPU waiting on latency at a few percent of its bandwidth);
//      key rows are padded so that lanes reading different rows hit different
//      banks;
//   2. scores: a lane per slot, the key row decoded 8 channels at a time from
//      shared memory against the scaled queries (broadcast), then the chunk's
//      online softmax per query row (warp shuffles);
//   3. values: the warp reads the staged value rows one slot at a time, a lane
//      per 4 channels, weighted by the probabilities (broadcast).
// KIVI keys' per-channel scales and mins: when a chunk's slots lie in at most
// two groups (always, unless eviction shortened groups), the warp decodes the
// two groups' grid codes once into its stage, folded for codes read as floats
// without conversions (kv_read.cuh: kv_grid_fold; kd, in the room f16 key rows
// would take), and a lane's key element costs a byte permute and one FMA;
// otherwise each lane decodes its group's codes from global memory per
// element (the same 16 bytes for every lane of a group: one L1 line), as the
// generic kernel does. KIVI values' per-slot grids are folded once when
// staged (vd), a lane per slot.
#include "kernels/cuda/attention_decode_fast.h"

#include <cmath>

#include "ggml-like/error.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/kv_read.cuh"

namespace zk {
namespace cuda {

namespace {

constexpr int k_batch = 8;  // loads a lane has in flight while staging

// How a task reads one side: rows of f16 (a rows side, or a windowed block's
// residual window), 8-bit codes, 4- or 2-bit KIVI codes, or the exact f32 sink
// rows.
enum fast_read : int { FR_F16 = 0, FR_Q8 = 1, FR_Q4 = 2, FR_Q2 = 3, FR_SINK = 4 };

__device__ __forceinline__ int fast_read_of(const cuda_kv_side& d, int64_t s0) {
    if (s0 >= d.n_quant) return FR_F16;
    return d.layout == KV_LAYOUT_Q8 ? FR_Q8 : (d.layout == KV_LAYOUT_Q4 ? FR_Q4 : FR_Q2);
}

// Bytes of 8 channels of a row read as `fr` (the staging unit).
template <int FR>
struct unit_of {
    static constexpr int bytes = FR == FR_F16 ? 16 : (FR == FR_Q8 ? 8 : (FR == FR_Q4 ? 4 : 2));
};
template <int B>
struct unit_type;
template <>
struct unit_type<16> { using type = cu_v16; };
template <>
struct unit_type<8> { using type = cu_v8; };
template <>
struct unit_type<4> { using type = uint32_t; };
template <>
struct unit_type<2> { using type = uint16_t; };

// The staged key row stride in bytes: whole units, and an odd number of
// max(unit, 4)-byte words, so the lanes of a warp reading unit u of 32
// consecutive rows fall in different banks.
__device__ __forceinline__ int key_stride(int units, int unit) {
    const int w = unit < 4 ? 4 : unit;
    int s = (units * unit + w - 1) / w;
    if (s % 2 == 0) s++;
    return s * w;
}

// Copies n rows of upr units of U bytes (row i at src + i * src_stride) to
// dst + i * dst_stride, the warp's lanes taking units in turn, k_batch loads
// issued before their stores.
template <int U>
__device__ __forceinline__ void warp_stage(sptr<unsigned char> dst, int dst_stride, dptr<const unsigned char> src,
                                           int64_t src_stride, int n, int upr) {
    using T = typename unit_type<U>::type;
    const int lane = threadIdx.x % 32, total = n * upr;
    const float inv = 1.0f / (float)upr;
    for (int base = 0; base < total; base += 32 * k_batch) {
        T v[k_batch] = {};  // initialised: GCC cannot see that both loops skip the same i
        ZK_UNROLL
        for (int b = 0; b < k_batch; b++) {
            const int i = base + 32 * b + lane;
            if (i < total) {
                const int row = (int)(((float)i + 0.5f) * inv), u = i - row * upr;
                v[b] = dptr_cast<const T>(src + (int64_t)row * src_stride + (int64_t)u * U)[0];
            }
        }
        ZK_UNROLL
        for (int b = 0; b < k_batch; b++) {
            const int i = base + 32 * b + lane;
            if (i < total) {
                const int row = (int)(((float)i + 0.5f) * inv), u = i - row * upr;
                sptr_cast<T>(dst + (int64_t)row * dst_stride + (int64_t)u * U)[0] = v[b];
            }
        }
    }
}

// Copies n 16-bit values (scales) from src to dst, in 2-byte units.
__device__ __forceinline__ void warp_stage_u16(sptr<unsigned char> dst, dptr<const uint16_t> src, int n) {
    warp_stage<2>(dst, 2, dptr_cast<const unsigned char>(src), 2, n, 1);
}

// A warp's staged chunk: key rows [n x kstride] bytes, value rows [n x vrow]
// bytes, per-slot f16 scales of 8-bit keys [n x nbk] and 8-bit values [n x nbv].
//   kd: KIVI keys' grids of the chunk's first and last groups, folded
//   (kv_grid_fold), per group [2 x k_fast_rank] f32 (S, then M), groups
//   k_kd_stride apart;
//   vd: KIVI values' grids, folded, per slot and block [n x nbv] (S, M) f32.
struct staged {
    sptr<unsigned char> k, v, ks, vs;
    sptr<float> kd, vd;
    int kstride, vrow, nbk, nbv;
};
// 2 x k_fast_rank floats, and 4 more so that lanes reading the two groups'
// entries of one channel (16-byte loads) fall in different banks.
constexpr int k_kd_stride = 2 * k_fast_rank + 4;

// Channels c .. c + 7 of key row sl of the chunk. g: the slot's KIVI group.
// PRE: the chunk's groups are decoded in st.kd, sel says which of the two
// holds the slot's group.
template <int KR, bool PRE>
__device__ __forceinline__ void key8(const cuda_kv_head& kv, const staged& st, int r, int64_t s, int sl, int32_t g,
                                     int sel, int c, float (&x)[8]) {
    if constexpr (KR == FR_SINK) {
        const int64_t o = (int64_t)kv.pos[s] * kv.sink_dim + c;
        const cu_f4 a = cu_load<cu_f4>(kv.sink_k, o), b = cu_load<cu_f4>(kv.sink_k, o + 4);
        ZK_UNROLL
        for (int j = 0; j < 4; j++) x[j] = a.x[j], x[4 + j] = b.x[j];
        return;
    } else {
        constexpr int U = unit_of<KR>::bytes;
        using T = typename unit_type<U>::type;
        const T w = sptr_cast<T>(st.k + (int64_t)sl * st.kstride + (c / 8) * U)[0];
        if constexpr (KR == FR_F16) {
            ZK_UNROLL
            for (int j = 0; j < 4; j++) x[2 * j] = h2f_lo(w.w[j]), x[2 * j + 1] = h2f_hi(w.w[j]);
        } else if constexpr (KR == FR_Q8) {
            const float sc = h2f(sptr_cast<uint16_t>(st.ks)[sl * st.nbk + c / 32]);
            ZK_UNROLL
            for (int j = 0; j < 8; j++) x[j] = (float)(int8_t)(uint8_t)(w.w[j / 4] >> (8 * (j % 4))) * sc;
        } else {
            // KIVI keys: per channel grid codes and the group's steps; channel c + j
            // in bits (j bits) of the little-endian code word
            constexpr int bits = KR == FR_Q4 ? 4 : 2;
            const uint32_t cw = (uint32_t)w;
            if constexpr (PRE) {
                // the group's folded grids (kv_grid_fold): x = S f + M, f the code as a float
                const sptr<cu_f4> sm = sptr_cast<cu_f4>(st.kd + sel * k_kd_stride + c);
                const cu_f4 s0 = sm[0], s1 = sm[1], m0 = sm[k_fast_rank / 4], m1 = sm[k_fast_rank / 4 + 1];
                float f[8];
                if constexpr (bits == 4)
                    kv_nibbles_f<8>(cw, f);
                else
                    kv_crumbs_f<8>(cw, f);
                ZK_UNROLL
                for (int j = 0; j < 8; j++) x[j] = (j < 4 ? s0.x[j] : s1.x[j - 4]) * f[j] + (j < 4 ? m0.x[j] : m1.x[j - 4]);
                return;
            }
            const cuda_kv_side& d = kv.k;
            const cu_v16 gc = cu_load<cu_v16>(d.scale, (int64_t)g * r + c);
            const float ds = h2f(d.min[(int64_t)g * KV_GRID_STEPS]), dm = h2f(d.min[(int64_t)g * KV_GRID_STEPS + 1]);
            ZK_UNROLL
            for (int j = 0; j < 8; j++) {
                const float code = (float)((cw >> (bits * j)) & ((1u << bits) - 1));
                const uint32_t gj = gc.w[j / 2] >> (16 * (j % 2));
                x[j] = kv_grid_scale(gj, ds) * code + kv_grid_min(gj, dm);
            }
        }
    }
}

// Channels c .. c + 3 (c a multiple of 4) of value row sl of the chunk.
template <int VR>
__device__ __forceinline__ void val4(const cuda_kv_head& kv, const staged& st, int64_t s, int sl, int c,
                                     float (&x)[4]) {
    if constexpr (VR == FR_SINK) {
        const cu_f4 a = cu_load<cu_f4>(kv.sink_v, (int64_t)kv.pos[s] * kv.sink_dim + c);
        ZK_UNROLL
        for (int j = 0; j < 4; j++) x[j] = a.x[j];
    } else {
        const sptr<unsigned char> row = st.v + (int64_t)sl * st.vrow;
        if constexpr (VR == FR_F16) {
            const cu_v8 v = sptr_cast<cu_v8>(row + 2 * c)[0];
            x[0] = h2f_lo(v.w[0]), x[1] = h2f_hi(v.w[0]), x[2] = h2f_lo(v.w[1]), x[3] = h2f_hi(v.w[1]);
        } else if constexpr (VR == FR_Q8) {
            const uint32_t w = sptr_cast<uint32_t>(row + c)[0];
            const float sc = h2f(sptr_cast<uint16_t>(st.vs)[sl * st.nbv + c / 32]);
            ZK_UNROLL
            for (int j = 0; j < 4; j++) x[j] = (float)(int8_t)(uint8_t)(w >> (8 * j)) * sc;
        } else {
            // KIVI values: the slot's grid of this block of KV_Q4_VBLOCK channels, folded
            // when staged (S, M: kv_grid_fold), and the codes as floats
            const cu_f2 g = sptr_cast<cu_f2>(st.vd)[sl * st.nbv + c / KV_Q4_VBLOCK];
            const float S = g.x[0], M = g.x[1];
            float f[4];
            if constexpr (VR == FR_Q4)
                kv_nibbles_f<4>(sptr_cast<uint16_t>(row + c / 2)[0], f);
            else
                kv_crumbs_f<4>(row[c / 4], f);
            ZK_UNROLL
            for (int j = 0; j < 4; j++) x[j] = S * f[j] + M;
        }
    }
}

// The group of quantized slot s, searching forward from g (a group at or
// before s's).
__device__ __forceinline__ int32_t group_from(const cuda_kv_head& kv, int32_t g, int64_t s) {
    while (g + 1 < kv.n_groups && kv.group_start[g + 1] <= s) g++;
    return g;
}

// Stages chunk [c0, c0 + n) (n <= 32 P) of the task's sides (the sink task
// reads its rows from global memory instead). g_run: the KIVI group of slot
// c0. KIVI values' grid codes and steps are loaded first, a lane per slot, and
// folded after the rows' loads are issued, so that their latency overlaps.
template <int P, int KR, int VR>
__device__ __forceinline__ void stage_chunk(const cuda_kv_head& kv, int rk, int rv, int64_t c0, int n, int32_t g_run,
                                            const staged& st) {
    if constexpr (KR != FR_SINK) {
        constexpr bool kivi_values = VR == FR_Q4 || VR == FR_Q2;
        constexpr int NB = (k_fast_rank + KV_Q4_VBLOCK - 1) / KV_Q4_VBLOCK;  // value grids a slot, at most
        const cuda_kv_side& v = kv.v;
        const int lane = (int)(threadIdx.x % 32);
        uint32_t vgc[P][NB] = {}, vds[P] = {}, vdm[P] = {};
        if constexpr (kivi_values) {
            ZK_UNROLL
            for (int p = 0; p < P; p++) {
                const int sl = lane + 32 * p;
                if (sl >= n) continue;
                const int32_t g = group_from(kv, g_run, c0 + sl);
                vds[p] = v.min[(int64_t)g * KV_GRID_STEPS], vdm[p] = v.min[(int64_t)g * KV_GRID_STEPS + 1];
                ZK_UNROLL
                for (int b = 0; b < NB; b++)
                    if (b < st.nbv) vgc[p][b] = v.scale[(c0 + sl) * st.nbv + b];
            }
        }
        const cuda_kv_side& k = kv.k;
        constexpr int UK = unit_of<KR>::bytes;
        const int64_t krow = (int64_t)rk / 8 * UK;
        dptr<const unsigned char> ksrc = KR == FR_F16 ? dptr_cast<const unsigned char>(k.rows16) + (c0 - k.n_quant) * krow
                                                      : k.codes + c0 * krow;
        warp_stage<UK>(st.k, st.kstride, ksrc, krow, n, rk / 8);
        if (KR == FR_Q8) warp_stage_u16(st.ks, k.scale + c0 * st.nbk, n * st.nbk);
        constexpr int UV = unit_of<VR>::bytes;
        const int64_t vrow = (int64_t)rv / 8 * UV;
        dptr<const unsigned char> vsrc = VR == FR_F16 ? dptr_cast<const unsigned char>(v.rows16) + (c0 - v.n_quant) * vrow
                                                      : v.codes + c0 * vrow;
        warp_stage<UV>(st.v, (int)vrow, vsrc, vrow, n, rv / 8);
        if (VR == FR_Q8) warp_stage_u16(st.vs, v.scale + c0 * st.nbv, n * st.nbv);
        if constexpr (kivi_values) {  // each slot's grids against its group's steps, folded
            const sptr<cu_f2> vd = sptr_cast<cu_f2>(st.vd);
            ZK_UNROLL
            for (int p = 0; p < P; p++) {
                const int sl = lane + 32 * p;
                if (sl >= n) continue;
                const float ds = h2f((uint16_t)vds[p]), dm = h2f((uint16_t)vdm[p]);
                ZK_UNROLL
                for (int b = 0; b < NB; b++) {
                    if (b >= st.nbv) break;
                    cu_f2 e;
                    kv_grid_fold(kv_grid_scale(vgc[p][b], ds), kv_grid_min(vgc[p][b], dm), e.x[0], e.x[1]);
                    vd[sl * st.nbv + b] = e;
                }
            }
        }
    }
}

// The KIVI key grid codes of groups ga and gb decoded and folded into st.kd
// (ga first, gb k_kd_stride floats on; each S then M, rk channels); ga alone
// when gb is ga (every slot then selects the first).
__device__ __forceinline__ void stage_key_groups(const cuda_kv_head& kv, int rk, int32_t ga, int32_t gb,
                                                 const staged& st) {
    const cuda_kv_side& d = kv.k;
    const int n = (gb == ga ? 1 : 2) * rk;
    for (int i = (int)(threadIdx.x % 32); i < n; i += 32) {
        const int h = i >= rk ? 1 : 0, c = i - h * rk;
        const int64_t g = h ? gb : ga;
        const uint32_t gc = d.scale[g * rk + c];
        float S, M;
        kv_grid_fold(kv_grid_scale(gc, h2f(d.min[g * KV_GRID_STEPS])), kv_grid_min(gc, h2f(d.min[g * KV_GRID_STEPS + 1])),
                     S, M);
        st.kd[h * k_kd_stride + c] = S;
        st.kd[h * k_kd_stride + k_fast_rank + c] = M;
    }
}

// sc[p][r] = q_r . k of this lane's slots c0 + lane + 32 p (R rows, those
// past the item's zero; slots past n score 0). gs: the slots' KIVI groups;
// PRE: the chunk's groups are decoded in st.kd, ga the first.
template <int P, int R, int KR, bool PRE>
__device__ __forceinline__ void chunk_scores(const cuda_kv_head& kv, const staged& st, sptr<cu_f4> q4, int rk,
                                             int64_t c0, int n, const int32_t (&gs)[P], int32_t ga,
                                             float (&sc)[P][R]) {
    const int lane = (int)(threadIdx.x % 32);
    ZK_UNROLL
    for (int p = 0; p < P; p++) {
        ZK_UNROLL
        for (int r = 0; r < R; r++) sc[p][r] = 0.0f;
    }
    for (int c = 0; c < rk; c += 8) {
        float kx[P][8];
        ZK_UNROLL
        for (int p = 0; p < P; p++) {
            if (lane + 32 * p < n) {
                key8<KR, PRE>(kv, st, rk, c0 + lane + 32 * p, lane + 32 * p, gs[p], gs[p] == ga ? 0 : 1, c, kx[p]);
            } else {
                ZK_UNROLL
                for (int j = 0; j < 8; j++) kx[p][j] = 0.0f;
            }
        }
        ZK_UNROLL
        for (int r = 0; r < R; r++) {
            const cu_f4 qa = q4[(r * rk + c) / 4], qb = q4[(r * rk + c) / 4 + 1];
            ZK_UNROLL
            for (int p = 0; p < P; p++) {
                float d = sc[p][r];
                ZK_UNROLL
                for (int j = 0; j < 4; j++) d += qa.x[j] * kx[p][j];
                ZK_UNROLL
                for (int j = 0; j < 4; j++) d += qb.x[j] * kx[p][4 + j];
                sc[p][r] = d;
            }
        }
    }
}

// Shared memory of a block (bytes):
//   qs   [R x k_fast_rank] f32 scaled queries, row r at r * rk (rows past
//        the item's zero)
//   qpos [R] int32            the position each row's token sees up to
//   per warp: pw [32 P x R] f32 the chunk's probabilities, slot-major, and
//             its stage (fast_stage_bytes)
// After the chunks, the warps' states (m, l [R], acc [R x k_fast_rank]) are
// written over the first warps' stages.
// R, the rows a block computes (4 or 8, the launch's widest item rounded
// up): loops over rows have no bounds to test, and an item with fewer rows
// computes zero queries' rows, never stored (branches per row cost more than
// the FMAs of the rows they skip; R = 4 also needs fewer registers).
__host__ __device__ constexpr int fast_stage_bytes(int chunk) {
    // key rows padded (f16 at rank 128: 272 bytes), value rows, two 16-bit
    // arrays of k_fast_rank / 32 a slot (8-bit scales) and a third's room:
    // enough for the f16 pair, and for the folded KIVI grids (kd, vd) after
    // the arrays where KIVI rows leave room (stage_need below)
    return chunk * ((2 * k_fast_rank + 16) + 2 * k_fast_rank + 3 * 2 * (k_fast_rank / 32));
}
// What stage_chunk and fast_task use of a chunk's stage, rows of key_row and
// val_row bytes (fast_task's carving, 16-byte aligned before kd).
__host__ __device__ constexpr int stage_need(int chunk, int key_row, int val_row, bool kivi_keys, bool kivi_values) {
    return (chunk * (key_row + val_row + 2 * (k_fast_rank / 32) + 2 * (k_fast_rank / 32)) + 15) / 16 * 16 +
           (kivi_keys ? (int)sizeof(float) * 2 * k_kd_stride : 0) +
           (kivi_values ? chunk * (int)sizeof(float) * 2 * ((k_fast_rank + KV_Q4_VBLOCK - 1) / KV_Q4_VBLOCK) : 0);
}
// the widest rows of each kind at k_fast_rank: f16 keys padded (272 bytes),
// f16 values (256), 4-bit KIVI keys padded (68) and values (64)
static_assert(stage_need(32, 2 * k_fast_rank + 16, 2 * k_fast_rank, false, false) <= fast_stage_bytes(32) &&
                  stage_need(32, 2 * k_fast_rank + 16, k_fast_rank / 2, false, true) <= fast_stage_bytes(32) &&
                  stage_need(32, k_fast_rank / 2 + 4, 2 * k_fast_rank, true, false) <= fast_stage_bytes(32) &&
                  stage_need(32, k_fast_rank / 2 + 4, k_fast_rank / 2, true, true) <= fast_stage_bytes(32),
              "a chunk's stage holds every layout pair");
struct fast_smem {
    sptr<float> qs;
    sptr<int32_t> qpos;
    sptr<cu_f4> pw;
    sptr<unsigned char> stage;  // [warps x fast_stage_bytes(chunk)]
};

// NW warps per block, P slots per lane in the scores (a warp's chunk is 32 P
// slots).
template <int NW, int P, int R, int KR, int VR>
__device__ void fast_task(const cuda_attn_item& it, const cuda_attn_task& task, dptr<float> partials,
                          const fast_smem& sh) {
    constexpr int k_threads = 32 * NW, k_chunk = 32 * P;
    constexpr bool kivi_keys = KR == FR_Q4 || KR == FR_Q2, kivi_values = VR == FR_Q4 || VR == FR_Q2;
    const cuda_kv_head& kv = it.kv;
    const bool sink = KR == FR_SINK;
    const int G = it.n_group, rows = it.n_tok * G;
    const int rk = sink ? kv.sink_dim : kv.r_k, rv = sink ? kv.sink_dim : kv.r_v;
    const int tid = threadIdx.x, lane = tid % 32, wid = tid / 32;

    for (int i = tid; i < R * rk; i += k_threads) {
        const int r = i / rk, c = i % rk, t = r / G, j = r % G;
        sh.qs[i] = r < rows ? it.q[t * it.q_stride + j * it.q_head_stride + c] * it.scale : 0.0f;
    }
    for (int i = tid; i < R; i += k_threads) sh.qpos[i] = it.q_pos[i < rows ? i / G : 0];
    __syncthreads();  // queries staged

    float m[R], l[R], acc[R][4];
    ZK_UNROLL
    for (int r = 0; r < R; r++) {
        m[r] = -INFINITY, l[r] = 0.0f;
        ZK_UNROLL
        for (int i = 0; i < 4; i++) acc[r][i] = 0.0f;
    }
    const int cv = 4 * lane;  // this lane's value channels cv .. cv + 3
    const bool v_on = cv < rv;
    const sptr<cu_f4> pw = sh.pw + (int64_t)wid * k_chunk * (R / 4);
    const sptr<cu_f4> q4 = sptr_cast<cu_f4>(sh.qs);
    staged st;
    st.k = sh.stage + (int64_t)wid * fast_stage_bytes(k_chunk);
    st.kstride = key_stride(rk / 8, unit_of<KR == FR_SINK ? FR_F16 : KR>::bytes);
    st.vrow = rv / 8 * unit_of<VR == FR_SINK ? FR_F16 : VR>::bytes;
    st.nbk = kv_blocks32(rk);
    st.nbv = VR == FR_Q8 ? kv_blocks32(rv) : kv_vblocks(rv);  // (f16 and sink rows: unused)
    st.v = st.k + (int64_t)k_chunk * st.kstride;
    st.ks = st.v + (int64_t)k_chunk * st.vrow;
    st.vs = st.ks + (int64_t)k_chunk * 2 * st.nbk;
    {  // then kd and vd, 16-byte aligned (the stage is); fast_stage_bytes checks the room
        int64_t used = (st.vs - st.k) + (int64_t)k_chunk * 2 * st.nbv;
        used = (used + 15) / 16 * 16;
        st.kd = sptr_cast<float>(st.k + used);
        if (kivi_keys) used += (int64_t)sizeof(float) * 2 * k_kd_stride;
        st.vd = sptr_cast<float>(st.k + used);
    }

    int32_t g_run = 0;
    if (kivi_keys || kivi_values) g_run = kv_group_of(kv, task.s0);
    for (int64_t c0 = task.s0 + (int64_t)wid * k_chunk; c0 < task.s1; c0 += (int64_t)NW * k_chunk) {
        const int n = (int)cu_min<int64_t>(k_chunk, task.s1 - c0);
        if (kivi_keys || kivi_values) g_run = group_from(kv, g_run, c0);
        stage_chunk<P, KR, VR>(kv, rk, rv, c0, n, g_run, st);
        // the groups of this lane's slots c0 + lane + 32 p; whether the chunk's
        // slots lie in at most two groups (warp-uniform), whose codes are then decoded once
        int32_t gs[P];
        ZK_UNROLL
        for (int p = 0; p < P; p++)
            gs[p] = kivi_keys && lane + 32 * p < n ? group_from(kv, g_run, c0 + lane + 32 * p) : g_run;
        bool pre = false;
        if constexpr (kivi_keys) {
            const int32_t g_last = group_from(kv, g_run, c0 + n - 1);
            pre = g_last <= g_run + 1;
            if (pre) stage_key_groups(kv, rk, g_run, g_last, st);
        }
        __syncwarp();  // the chunk staged

        float sc[P][R];
        if (pre)
            chunk_scores<P, R, KR, true>(kv, st, q4, rk, c0, n, gs, g_run, sc);
        else
            chunk_scores<P, R, KR, false>(kv, st, q4, rk, c0, n, gs, g_run, sc);
        // causal mask, then the chunk's online softmax per row (the warp's state)
        int32_t ps[P];
        ZK_UNROLL
        for (int p = 0; p < P; p++) ps[p] = lane + 32 * p < n ? kv.pos[c0 + lane + 32 * p] : 0;
        ZK_UNROLL
        for (int r = 0; r < R; r++) {
            const int32_t qp = sh.qpos[r];
            float mx = -INFINITY;
            ZK_UNROLL
            for (int p = 0; p < P; p++) {
                if (!(lane + 32 * p < n && ps[p] <= qp)) sc[p][r] = -INFINITY;
                mx = fmaxf(mx, sc[p][r]);
            }
            const float m_new = fmaxf(m[r], warp_max(mx));
            const float f = m[r] == -INFINITY ? 0.0f : expf(m[r] - m_new);
            float psum = 0.0f;
            ZK_UNROLL
            for (int p = 0; p < P; p++) {
                const float e = sc[p][r] == -INFINITY ? 0.0f : expf(sc[p][r] - m_new);
                sc[p][r] = e;
                psum += e;
            }
            l[r] = l[r] * f + warp_sum(psum);
            m[r] = m_new;
            ZK_UNROLL
            for (int i = 0; i < 4; i++) acc[r][i] *= f;
        }
        // probabilities slot-major, R per slot (R / 4 16-byte broadcasts per slot below)
        ZK_UNROLL
        for (int p = 0; p < P; p++) {
            ZK_UNROLL
            for (int h = 0; h < R / 4; h++) {
                cu_f4 a;
                ZK_UNROLL
                for (int j = 0; j < 4; j++) a.x[j] = sc[p][4 * h + j];
                pw[R / 4 * (lane + 32 * p) + h] = a;
            }
        }
        __syncwarp();  // the chunk's probabilities written

        // acc += P V: the warp reads each staged value row whole, a lane per 4 channels
        for (int j = 0; j < n; j++) {
            float vx[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (v_on) val4<VR>(kv, st, c0 + j, j, cv, vx);
            cu_f4 pj[R / 4];
            ZK_UNROLL
            for (int h = 0; h < R / 4; h++) pj[h] = pw[R / 4 * j + h];
            ZK_UNROLL
            for (int r = 0; r < R; r++) {
                const float pr = pj[r / 4].x[r % 4];
                ZK_UNROLL
                for (int i = 0; i < 4; i++) acc[r][i] += pr * vx[i];
            }
        }
        __syncwarp();  // the stage and probabilities read before the next chunk overwrites them
    }

    // combine the warps: their states over the stages, then the block's partial
    __syncthreads();  // every warp done with its stage
    const sptr<float> wm = sptr_cast<float>(sh.stage), wl = wm + NW * R, wacc = wl + NW * R;
    if (lane == 0) {
        ZK_UNROLL
        for (int r = 0; r < R; r++) wm[wid * R + r] = m[r], wl[wid * R + r] = l[r];
    }
    if (v_on) {
        ZK_UNROLL
        for (int r = 0; r < R; r++) {
            if (r >= rows) break;
            ZK_UNROLL
            for (int i = 0; i < 4; i++) wacc[((int64_t)wid * R + r) * k_fast_rank + cv + i] = acc[r][i];
        }
    }
    __syncthreads();  // the warps' states written
    dptr<float> pm = partials + task.part;
    dptr<float> pl = pm + rows;
    dptr<float> pa = pl + rows;
    for (int i = tid; i < rows * rv; i += k_threads) {
        const int r = i / rv, c = i % rv;
        float M = -INFINITY;
        for (int w = 0; w < NW; w++) M = fmaxf(M, wm[w * R + r]);
        float L = 0.0f, A = 0.0f;
        if (M != -INFINITY) {
            for (int w = 0; w < NW; w++) {
                const float mw = wm[w * R + r];
                if (mw == -INFINITY) continue;
                const float e = expf(mw - M);
                L += e * wl[w * R + r];
                A += e * wacc[((int64_t)w * R + r) * k_fast_rank + c];
            }
        }
        pa[i] = A;
        if (c == 0) pm[r] = M, pl[r] = L;
    }
}

template <int NW, int P, int R>
constexpr size_t fast_smem_bytes() {
    return sizeof(float) * R * k_fast_rank + sizeof(int32_t) * R + sizeof(cu_f4) * NW * 32 * P * (R / 4) +
           (size_t)NW * fast_stage_bytes(32 * P) + 64;  // alignment slack
}
// the warps' states fit where the stages were
static_assert(fast_stage_bytes(32) >= (int)sizeof(float) * (2 * k_fast_rows + k_fast_rows * k_fast_rank),
              "state over one stage");

// Every (key read, value read) pair a task can have: a sink task reads its
// exact rows on both sides; otherwise each side its layout or f16 rows.
// (R = 4 with 4 warps: 3 blocks an SM, their shared memory 3 x 73 KiB; ptxas
// then keeps to 168 registers)
template <int NW, int P, int R>
__global__ void __launch_bounds__(32 * NW, NW == 4 && R == 4 ? 3 : 2)
    attn_decode_fast_kernel(dptr<const cuda_attn_item> items, dptr<const cuda_attn_task> tasks,
                            dptr<float> partials) {
    const cuda_attn_task& task = tasks[blockIdx.x];
    const cuda_attn_item& it = items[task.item];
    ZK_SHARED_DYNAMIC(smem);
    fast_smem sh;
    sh.qs = smem_take<float>(smem, (int64_t)R * k_fast_rank, "qs");
    sh.qpos = smem_take<int32_t>(smem, R, "qpos");
    sh.pw = smem_take<cu_f4>(smem, (int64_t)NW * 32 * P * (R / 4), "pw");
    sh.stage = sptr_cast<unsigned char>(smem_take<cu_v16>(smem, (int64_t)NW * fast_stage_bytes(32 * P) / 16, "stage"));
    if (task.sink) {
        fast_task<NW, P, R, FR_SINK, FR_SINK>(it, task, partials, sh);
        return;
    }
    const int kr = fast_read_of(it.kv.k, task.s0), vr = fast_read_of(it.kv.v, task.s0);
#define ZK_FAST_V(K)                                                                 \
    switch (vr) {                                                                    \
        case FR_F16: fast_task<NW, P, R, K, FR_F16>(it, task, partials, sh); break;     \
        case FR_Q8: fast_task<NW, P, R, K, FR_Q8>(it, task, partials, sh); break;       \
        case FR_Q4: fast_task<NW, P, R, K, FR_Q4>(it, task, partials, sh); break;       \
        default: fast_task<NW, P, R, K, FR_Q2>(it, task, partials, sh); break;          \
    }
    switch (kr) {
        case FR_F16: ZK_FAST_V(FR_F16) break;
        case FR_Q8: ZK_FAST_V(FR_Q8) break;
        case FR_Q4: ZK_FAST_V(FR_Q4) break;
        default: ZK_FAST_V(FR_Q2) break;
    }
#undef ZK_FAST_V
}

template <int NW, int P, int R>
void launch_fast(dptr<const cuda_attn_item> items, dptr<const cuda_attn_task> tasks, int n_tasks,
                 dptr<float> partials, cuda_stream stream) {
    const size_t smem = fast_smem_bytes<NW, P, R>();
    const auto fast_kernel = attn_decode_fast_kernel<NW, P, R>;
    if (smem > 48 * 1024) ZK_SET_MAX_DYNAMIC_SMEM(fast_kernel, smem);
    ZK_LAUNCH(fast_kernel, dim3(n_tasks), dim3(32 * NW), smem, stream, items, tasks, partials);
}

}  // namespace

bool cuda_attn_fast_item(const cuda_attn_item& it) {
    const cuda_kv_head& kv = it.kv;
    // no GEAR, keys in one width and no vector codes (a plan's 2/1/0-bit key
    // parts and coded values: the generic kernel)
    auto side_ok = [](const cuda_kv_side& d) {
        return d.gear_rank == 0 && d.gear_nout == 0 && d.tail == 0 && d.zero == 0 && d.mid == 0 &&
               d.layout != KV_LAYOUT_VQ;
    };
    auto width_ok = [](int r) { return r >= 8 && r <= k_fast_rank && r % 8 == 0; };
    return kv.type == CUDA_KV_F16 && side_ok(kv.k) && side_ok(kv.v) && !it.logits &&
           it.n_tok * it.n_group <= k_fast_rows && width_ok(kv.r_k) && width_ok(kv.r_v) &&
           (kv.n_sink_slots == 0 || width_ok(kv.sink_dim));
}

int cuda_attn_fast_blocks_per_sm(int rows) { return rows <= 4 ? 3 : 2; }

void cuda_attention_decode_fast(dptr<const cuda_attn_item> items, dptr<const cuda_attn_task> tasks, int n_tasks,
                                int variant, int max_rows, dptr<float> partials, cuda_stream stream) {
    if (n_tasks == 0) return;
    if (max_rows < 1 || max_rows > k_fast_rows)
        ZK_THROW("CUDA decode attention: fast kernel for %d query rows (1 to %d)", max_rows, k_fast_rows);
    switch (variant) {
        case 0:
            if (max_rows <= 4)
                launch_fast<4, 1, 4>(items, tasks, n_tasks, partials, stream);
            else
                launch_fast<4, 1, 8>(items, tasks, n_tasks, partials, stream);
            break;
        case 1: launch_fast<2, 2, 8>(items, tasks, n_tasks, partials, stream); break;
        default: ZK_THROW("CUDA decode attention: fast kernel variant %d (0: 4 warps x 32 slots, 1: 2 warps x 64)",
                          variant);
    }
}

}  // namespace cuda
}  // namespace zk
