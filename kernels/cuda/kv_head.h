// One (sequence, layer, KV head) block of the KV cache in device memory, as the
// CUDA attention kernels read it: the device twin of attn_kv_view
// (kernels/attention.h), in the CPU's layouts byte for byte (engine/kv_layout*.h
// write them, engine/kv_quant.h quantizes). Keys and values are two sides, each
// in its own layout (kv_layout_id: f16/f32 rows, 8-bit per token, 4- or 2-bit
// KIVI with optional GEAR), sharing the block's positions, KIVI group table and
// exact sinks. A side's slots [0, n_quant) are in its codes, slot s >= n_quant
// is row s - n_quant of its full-precision rows (a rows side: n_quant = 0; a
// KIVI side and an 8-bit side of a windowed block: the residual window; an
// 8-bit side of a block without KIVI: n_quant = n_slots, no rows).
//
// cuda_kv_head_from_view builds the description over device copies of a CPU
// view's arrays, each at exactly the size the block uses (cuda_kv_side_extent):
// what the tests upload, and what a backend mirroring a CPU cache would copy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/attention.h"
#include "kernels/cuda/cuda_types.h"

namespace zk {
namespace cuda {

constexpr int k_attn_max_rank = 256;  // channels of a key/value row or sink row

enum cuda_kv_type : int { CUDA_KV_F32 = 0, CUDA_KV_F16 = 1 };

// One side (keys, r = r_k channels, or values, r = r_v) of a block.
struct cuda_kv_side {
    int layout = KV_LAYOUT_ROWS;  // kv_layout_id
    int64_t n_quant = 0;          // slots [0, n_quant) in the codes (0 for KV_LAYOUT_ROWS)
    // slot s >= n_quant: row s - n_quant, [(n_slots - n_quant) x r] of the head's
    // type (one of the two, by type; none when every slot is quantized)
    dptr<const float> rows32{};
    dptr<const uint16_t> rows16{};
    // Q8: int8 codes (as bytes) [n_quant x r]; KIVI: [n_quant x kv_kivi_row_bytes(bits, r)],
    // channel c in bits bits * (c % (8 / bits)) of byte c * bits / 8 (keys
    // with parts below: rows of kv_key_row_bytes(bits, r, tail, zero, mid))
    dptr<const uint8_t> codes{};
    // scale: Q8 f16 scales [n_quant x blocks32(r)]; KIVI packed grid codes
    // (kernels/attention.h), keys per (group, channel) [n_groups x r] (with
    // 0-bit channels: [n_groups x kv_key_grid_words(r, zero)]), values per
    // (slot, block of 32 channels) [n_quant x blocks32(r)]. min: KIVI, the
    // groups' f16 steps [n_groups x KV_GRID_STEPS].
    dptr<const uint16_t> scale{}, min{};
    // KIVI keys of a plan (kernels/attention.h): after the row's h4 codes of
    // `bits` bits, `mid` 2-bit ones (4-bit keys), then a 1-bit tail of `tail`
    // channels, then `zero` channels with no codes (each its group's mean);
    // h4 = r - mid - tail - zero. All 0 elsewhere; none with GEAR.
    int tail = 0, zero = 0, mid = 0;
    // KV_LAYOUT_VQ (values): codes rows of kv_vq_row_bytes(r / vq_c, vq_bits)
    // bytes (code i at bit i vq_bits, little-endian), scale one f16 a slot
    // [n_quant], vq_book the decoding centroids [r / vq_c x vq_k x vq_c]:
    // v = scale_s book[g][code_g] (kernels/attention.h)
    int vq_c = 0, vq_k = 0, vq_bits = 0;
    dptr<const float> vq_book{};
    // GEAR (KIVI only; rank 0 and n_out 0: none): A [n_groups x group x rank],
    // B [n_groups x r x rank] f16; sparse corrections [n_groups x n_out]: index
    // t * r + c ascending (KV_GEAR_NONE pads the end) and f16 value
    int gear_rank = 0, gear_nout = 0;
    dptr<const uint16_t> gear_a{}, gear_b{}, gear_idx{}, gear_val{};
};

struct cuda_kv_head {
    int type = CUDA_KV_F16;  // the full-precision rows of both sides
    int r_k = 0, r_v = 0;
    int64_t n_slots = 0;
    dptr<const int32_t> pos{};  // [n_slots] ascending
    cuda_kv_side k, v;
    // KIVI groups (a block with a KIVI side): group g holds slots
    // [group_start[g], group_start[g + 1]), group_start[n_groups] = the KIVI sides' n_quant
    int group = 0;
    int64_t n_groups = 0;
    dptr<const int32_t> group_start{};  // [n_groups + 1]
    // exact sinks: slots [0, n_sink_slots) read f32 rows of sink_dim channels, row pos[s]
    int64_t n_sink_slots = 0;
    int sink_dim = 0;
    dptr<const float> sink_k{}, sink_v{};  // [pos[n_sink_slots - 1] + 1 x sink_dim]
};

// Elements of each array of one side that a block uses (counts of the array's
// element type: rows in floats or f16, codes in bytes, the rest in uint16).
struct cuda_kv_side_extent {
    int64_t rows = 0;    // (n_slots - n_quant) x r
    int64_t codes = 0;   // bytes
    int64_t scale = 0;   // KIVI keys: grid codes; otherwise f16 scales
    int64_t min = 0;     // KIVI keys: the groups' steps; values: = scale's
    int64_t gear_a = 0, gear_b = 0, gear_out = 0;
    int64_t book = 0;    // VQ: the decoding centroids, floats
};
cuda_kv_side_extent cuda_kv_side_extent_of(const attn_kv_view& v, bool keys);

// The labels cuda_kv_head_from_view gives a side's full-precision rows (the
// one array of a block whose contents move: a windowed side's residual rows
// shift down when a group is quantized; the CUDA backend's mirror relies on it).
constexpr const char* k_kv_label_k_rows = "k rows";
constexpr const char* k_kv_label_v_rows = "v rows";

// Copies one host array to device memory (bytes may be 0: return nullptr) and
// returns the device pointer; name labels it (the harness's reports).
using cuda_kv_uploader = std::function<void*(const void* host, size_t bytes, const char* name)>;

// The device description of the block v views, over device copies of its
// arrays made by `up`. Throws zk::error for a view the kernels cannot read
// (a type other than F32/F16, ranks above k_attn_max_rank, an unknown layout).
cuda_kv_head cuda_kv_head_from_view(const attn_kv_view& v, const cuda_kv_uploader& up);

// Throws zk::error naming `who` and the item when the description is one the
// kernels cannot read: ranks outside 1..k_attn_max_rank, a side's layout or
// quantized slot count out of range, KIVI slots without groups, two KIVI sides
// with different n_quant, GEAR on a side that is not KIVI, sinks narrower than
// r_k or wider than k_attn_max_rank.
void cuda_kv_head_check(const cuda_kv_head& kv, const char* who, int item);

}  // namespace cuda
}  // namespace zk
