// The device description of a cache block (kv_head.h): array extents per
// layout and the head built over device copies of a CPU view. Host code only.
#include "kernels/cuda/kv_head.h"

#include "ggml-like/error.h"

namespace zk {
namespace cuda {

namespace {

bool is_kivi(int layout) { return layout == KV_LAYOUT_Q4 || layout == KV_LAYOUT_Q2; }
int kivi_bits(int layout) { return layout == KV_LAYOUT_Q4 ? 4 : 2; }

template <class T>
dptr<const T> up_array(const cuda_kv_uploader& up, const void* host, int64_t n, const char* name) {
    if (n <= 0 || !host) return dptr<const T>();
    return dptr<const T>((const T*)up(host, (size_t)n * sizeof(T), name));
}

cuda_kv_side side_from_view(const attn_kv_view& v, bool keys, const cuda_kv_uploader& up) {
    const attn_side_view& s = keys ? v.k : v.v;
    const cuda_kv_side_extent e = cuda_kv_side_extent_of(v, keys);
    cuda_kv_side d;
    d.layout = s.layout;
    d.n_quant = s.layout == KV_LAYOUT_ROWS ? 0 : s.n_quant;
    if (v.type == dtype::F32)
        d.rows32 = up_array<float>(up, s.rows, e.rows, keys ? k_kv_label_k_rows : k_kv_label_v_rows);
    else
        d.rows16 = up_array<uint16_t>(up, s.rows, e.rows, keys ? k_kv_label_k_rows : k_kv_label_v_rows);
    d.codes = up_array<uint8_t>(up, s.codes, e.codes, keys ? "k codes" : "v codes");
    d.scale = up_array<uint16_t>(up, s.scale, e.scale, keys ? "k scales" : "v scales");
    d.min = up_array<uint16_t>(up, s.min, e.min, keys ? "k mins" : "v mins");
    if (keys && is_kivi(s.layout)) d.tail = s.tail, d.zero = s.zero, d.mid = s.mid;
    if (s.layout == KV_LAYOUT_VQ) {
        d.vq_c = s.vq.c, d.vq_k = s.vq.K, d.vq_bits = s.vq.bits;
        d.vq_book = up_array<float>(up, s.vq.book, e.book, keys ? "k book" : "v book");
    }
    if (e.gear_a > 0 || e.gear_out > 0) {
        d.gear_rank = s.gear.rank;
        d.gear_nout = s.gear.n_out;
        d.gear_a = up_array<uint16_t>(up, s.gear.a, e.gear_a, keys ? "k gear A" : "v gear A");
        d.gear_b = up_array<uint16_t>(up, s.gear.b, e.gear_b, keys ? "k gear B" : "v gear B");
        d.gear_idx = up_array<uint16_t>(up, s.gear.out_idx, e.gear_out, keys ? "k gear idx" : "v gear idx");
        d.gear_val = up_array<uint16_t>(up, s.gear.out_val, e.gear_out, keys ? "k gear val" : "v gear val");
    }
    return d;
}

}  // namespace

cuda_kv_side_extent cuda_kv_side_extent_of(const attn_kv_view& v, bool keys) {
    const attn_side_view& s = keys ? v.k : v.v;
    const int r = keys ? v.r_k : v.r_v;
    const int64_t nq = s.layout == KV_LAYOUT_ROWS ? 0 : s.n_quant;
    cuda_kv_side_extent e;
    e.rows = (v.n_slots - nq) * r;
    if (s.layout == KV_LAYOUT_Q8) {
        e.codes = nq * r;
        e.scale = nq * kv_n_blocks(r, KV_Q8_BLOCK);
    } else if (s.layout == KV_LAYOUT_VQ) {
        if (s.vq.c < 1 || r % s.vq.c != 0 || s.vq.K < 2 || s.vq.K > KV_VQ_MAX_K || s.vq.bits < 1 || s.vq.bits > 8)
            ZK_THROW("CUDA KV head: vector codes of %d channels, %d centroids, %d bits on a side of %d channels",
                     s.vq.c, s.vq.K, s.vq.bits, r);
        e.codes = nq * kv_vq_row_bytes(r / s.vq.c, s.vq.bits);
        e.scale = nq;
        e.book = (int64_t)r * s.vq.K;
    } else if (is_kivi(s.layout)) {
        const int bits = kivi_bits(s.layout);
        e.codes = nq * (keys ? kv_key_row_bytes(bits, r, s.tail, s.zero, s.mid) : kv_kivi_row_bytes(bits, r));
        e.scale = keys ? v.n_groups * kv_key_grid_words(r, s.zero) : nq * kv_n_blocks(r, KV_Q4_VBLOCK);
        e.min = v.n_groups * KV_GRID_STEPS;
        if (s.gear.rank > 0 || s.gear.n_out > 0) {
            e.gear_a = v.n_groups * v.group * s.gear.rank;
            e.gear_b = v.n_groups * r * s.gear.rank;
            e.gear_out = v.n_groups * s.gear.n_out;
        }
    }
    return e;
}

void cuda_kv_head_check(const cuda_kv_head& kv, const char* who, int item) {
    if (kv.r_k < 1 || kv.r_v < 1 || kv.r_k > k_attn_max_rank || kv.r_v > k_attn_max_rank)
        ZK_THROW("%s: item %d has ranks r_k %d, r_v %d (1..%d)", who, item, kv.r_k, kv.r_v, k_attn_max_rank);
    if (kv.type != CUDA_KV_F32 && kv.type != CUDA_KV_F16) ZK_THROW("%s: item %d has row type %d", who, item, kv.type);
    if (kv.n_slots < 0 || kv.n_sink_slots < 0 || kv.n_sink_slots > kv.n_slots ||
        (kv.n_sink_slots > 0 && (kv.sink_dim < kv.r_k || kv.sink_dim > k_attn_max_rank)))
        ZK_THROW("%s: item %d has %lld sink slots of %d channels (r_k %d, %lld slots)", who, item,
                 (long long)kv.n_sink_slots, kv.sink_dim, kv.r_k, (long long)kv.n_slots);
    const char* names[2] = {"keys", "values"};
    const cuda_kv_side* sides[2] = {&kv.k, &kv.v};
    for (int i = 0; i < 2; i++) {
        const cuda_kv_side& d = *sides[i];
        if (d.layout < KV_LAYOUT_ROWS || d.layout >= KV_LAYOUT_COUNT)
            ZK_THROW("%s: item %d: %s in unknown layout %d", who, item, names[i], d.layout);
        if (d.n_quant < 0 || d.n_quant > kv.n_slots || (d.layout == KV_LAYOUT_ROWS && d.n_quant != 0))
            ZK_THROW("%s: item %d: %s (layout %d) have %lld of %lld slots quantized", who, item, names[i], d.layout,
                     (long long)d.n_quant, (long long)kv.n_slots);
        if (is_kivi(d.layout) && d.n_quant > 0 && (kv.n_groups < 1 || kv.group < 1))
            ZK_THROW("%s: item %d: %lld KIVI %s slots in %lld groups of %d", who, item, (long long)d.n_quant, names[i],
                     (long long)kv.n_groups, kv.group);
        if ((d.gear_rank != 0 || d.gear_nout != 0) && (!is_kivi(d.layout) || d.gear_rank < 0 || d.gear_nout < 0))
            ZK_THROW("%s: item %d: GEAR rank %d, %d outliers on %s in layout %d", who, item, d.gear_rank, d.gear_nout,
                     names[i], d.layout);
        const int r = i == 0 ? kv.r_k : kv.r_v;
        if (d.layout == KV_LAYOUT_VQ && (i != 1 || d.vq_c < 1 || r % d.vq_c != 0 || d.vq_k < 2 ||
                                         d.vq_k > KV_VQ_MAX_K || d.vq_bits < 1 || d.vq_bits > 8 ||
                                         (1 << d.vq_bits) < d.vq_k || (d.n_quant > 0 && !d.vq_book)))
            ZK_THROW("%s: item %d: vector-coded %s of %d channels: %d channels a code, %d centroids of %d bits", who,
                     item, names[i], r, d.vq_c, d.vq_k, d.vq_bits);
        const bool parts = d.tail != 0 || d.zero != 0 || d.mid != 0;
        if (parts && (i != 0 || !is_kivi(d.layout) || d.tail < 0 || d.zero < 0 || d.mid < 0 ||
                      d.tail > KV_KEY_TAIL_MAX || d.tail + d.zero + d.mid > r ||
                      (d.mid > 0 && d.layout != KV_LAYOUT_Q4) || d.gear_rank != 0 || d.gear_nout != 0))
            ZK_THROW("%s: item %d: %s in layout %d (rank %d, GEAR rank %d) with %d 2-bit, %d 1-bit, %d 0-bit channels",
                     who, item, names[i], d.layout, r, d.gear_rank, d.mid, d.tail, d.zero);
    }
    if (is_kivi(kv.k.layout) && is_kivi(kv.v.layout) && kv.k.n_quant != kv.v.n_quant)
        ZK_THROW("%s: item %d: KIVI keys and values with %lld and %lld quantized slots", who, item,
                 (long long)kv.k.n_quant, (long long)kv.v.n_quant);
}

cuda_kv_head cuda_kv_head_from_view(const attn_kv_view& v, const cuda_kv_uploader& up) {
    if (v.tier) ZK_THROW("--kv-tier is not on the GPU yet; run with --device cpu or without it");
    if (v.type != dtype::F32 && v.type != dtype::F16)
        ZK_THROW("CUDA KV head: rows of type %s (f32, f16)", dtype_name(v.type));
    if (v.r_k < 1 || v.r_v < 1 || v.r_k > k_attn_max_rank || v.r_v > k_attn_max_rank)
        ZK_THROW("CUDA KV head: ranks r_k %d, r_v %d (1..%d)", v.r_k, v.r_v, k_attn_max_rank);
    for (const attn_side_view* s : {&v.k, &v.v})
        if (s->layout < KV_LAYOUT_ROWS || s->layout >= KV_LAYOUT_COUNT)
            ZK_THROW("CUDA KV head: unknown layout %d", (int)s->layout);
    cuda_kv_head h;
    h.type = v.type == dtype::F32 ? CUDA_KV_F32 : CUDA_KV_F16;
    h.r_k = v.r_k;
    h.r_v = v.r_v;
    h.n_slots = v.n_slots;
    h.pos = up_array<int32_t>(up, v.pos, v.n_slots, "pos");
    h.k = side_from_view(v, true, up);
    h.v = side_from_view(v, false, up);
    if (is_kivi(v.k.layout) || is_kivi(v.v.layout)) {
        h.group = v.group;
        h.n_groups = v.n_groups;
        h.group_start = up_array<int32_t>(up, v.group_start, v.n_groups + 1, "group starts");
    }
    if (v.n_sink_slots > 0) {
        const int64_t rows = (int64_t)v.pos[v.n_sink_slots - 1] + 1;  // sink row p = position p
        h.n_sink_slots = v.n_sink_slots;
        h.sink_dim = v.sink_dim;
        h.sink_k = up_array<float>(up, v.sink_k, rows * v.sink_dim, "sink k");
        h.sink_v = up_array<float>(up, v.sink_v, rows * v.sink_dim, "sink v");
    }
    return h;
}

}  // namespace cuda
}  // namespace zk
