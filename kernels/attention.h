// Attention of new query tokens against one (layer, KV head) block of the cache.
// Heads may be compressed (r_k, r_v <= head_dim): the cache holds k R[:, :r_k]
// and r_v-dim values, queries arrive already projected, and the scale still uses
// the original head dim. Work is split over slot ranges (flash-decoding): each
// range gives a partial (max, sum, unnormalised accumulator) and a merge combines
// them, so one long head can be shared by several threads.
//
// Storage of a block (engine/kv_cache.h fills it; engine/kv_layout*.h own it).
// Slots are in ascending position order. Keys and values are two sides, each in
// its own layout (kv_layout_id), so one block may hold 4-bit keys and 2-bit
// values and the next 16-bit both. A side's slots [0, n_quant) are in its codes;
// slots [n_quant, n_slots) are full-precision rows of the block's `type` (a rows
// side: every slot, n_quant = 0; a KIVI block: the residual window of the newest
// tokens, whose n_quant is the block's; an 8-bit side in a block without KIVI:
// none, each token is quantized as it arrives).
//   KV_LAYOUT_ROWS: rows of `type` (F16 or F32), [n_slots x r].
//   KV_LAYOUT_Q8: per token, blocks of KV_Q8_BLOCK channels, symmetric int8 codes
//       and one f16 scale per block: x = d * code.
//   KV_LAYOUT_Q4, KV_LAYOUT_Q2 (KIVI, `bits` = 4 or 2; engine/kv_quant.h packs
//       the codes: 8 / bits per byte, channel c in bits bits * (c % (8 / bits))
//       of byte c * bits / 8): keys per channel over groups of `group` tokens,
//       a scale s_c and min m_c per (group, channel): k_c = s_c code_c + m_c,
//       so q.k = sum_c (q_c s_c) code_c + sum_c q_c m_c and the folded query is
//       computed once per group. Values per token, blocks of KV_Q4_VBLOCK
//       channels with a scale and min each. Both sides code their grids in
//       2 bytes a (group, channel) or (token, block) against two f16 steps
//       (ds, dm) a group: the grid's scale / ds (unsigned, low byte)
//       and min / dm (signed, high byte); kivi_grid_scale, kivi_grid_min.
//       Keys: `scale` [n_groups x r] grid codes (with 0-bit channels: below), `min` [n_groups x 2] steps;
//       values: `scale` [n_quant x vblocks(r)], `min` [n_groups x 2]. The AVX2 kernels take both sums
//       as integer dot products (maddubs): the folded query rounded to int8 per
//       (group, head) and laid out in the order the codes unpack (a permutation
//       that costs nothing per slot), the value weights p s_b rounded to 7 bits
//       per 32 slots against centred codes. The reference path is float.
//       1-bit key tails (`tail` > 0, keys only): the last `tail` channels
//       [h, r), h = r - tail, are coded in one bit each against their grids
//       (two levels, m_c and m_c + s_c), after the row's h codes of `bits` bits:
//       a row is kv_kivi_row_bytes(bits, h) bytes, then kv_tail_bytes(tail) =
//       tb bytes where tail channel h + i is bit i / tb of byte i % tb, so
//       that bit plane p of the tail bytes holds tail channels [p tb, p tb + tb)
//       in order (the integer kernel unpacks a plane with a shift and a mask and
//       meets the query in channel order). Why: in the ZACK basis the last key
//       channels carry little energy but their removal costs much more than a
//       coarse code (Qwen2.5-Coder-1.5B, bench/RESULTS.md "1-bit tails").
//       0-bit key channels (`zero` > 0, keys only): the last `zero` channels
//       [r - zero, r) have no codes; each is its group's mean, m_c = dm x an
//       int8 code, and adds q_c m_c to the group's bias. The tail is then
//       channels [h, r - zero), h = r - zero - tail, and a group's grid is
//       kv_key_grid_words(r, zero) words: the r - zero packed codes, then the
//       zero channels' min codes as bytes. Why: the last channels of the ZACK
//       basis vary little within a group; their mean keeps more than a rank
//       cut of the same bytes (bench/RESULTS.md "0-bit key channels").
//       2-bit key channels (`mid` > 0, 4-bit keys only): the `mid` channels
//       after the row's h4 = r - zero - tail - mid 4-bit ones are 2-bit codes
//       against their grids (four levels), kv_kivi_row_bytes(2, mid) bytes
//       laid out as a 2-bit row, after the 4-bit part's
//       kv_kivi_row_bytes(4, h4) bytes and before the tail's. A 4-bit head
//       then codes its directions at 4, 2, 1 and 0 bits, each count chosen
//       per head (calib/keybasis.h keybasis_key_widths). Why: 2 bits is the
//       width between the 4-bit codes and the 1-bit tail that water-filling
//       a head's bytes uses most (bench/RESULTS.md "key bits per channel").
//   GEAR (optional, on KIVI sides): per group of `group` quantized tokens, a
//       rank-k correction A B^T (A [group x k], B [r x k], f16) and n_out sparse
//       corrections (index t * r + c within the group, f16 value) of the
//       quantization residual. Used without materializing anything:
//       q.(A B^T)_t = sum_i A[t,i] (q.B[:,i]);  sum_t p_t (A B^T)_t = (p^T A) B^T.
//   Exact sinks (optional, any layout): the tokens at the first positions
//       are also kept as f32 rows at full head dim (sink_k/sink_v, row p =
//       position p). Slots [0, n_sink_slots) hold those tokens; the range kernel
//       skips them and kernel_attention_sinks attends to the exact rows instead.
//       Why: the sink tokens draw much of the attention in many heads and carry
//       outlier channels that widen the 4-bit range of their group; kept exact
//       they cost a fixed few rows (SmolLM2-135M: 4-bit KL about -25%; no
//       measurable change at a ZACK rank cut, whose error is spread over all tokens).
//
//   KV_LAYOUT_VQ (values only): per token, each group of c consecutive channels
//       is one of K centroids of the block's codebook (k-means at calibration,
//       engine/kv_vq.h), times the token's f16 scale: v = scale_s book[g][code_g].
//       A row is kv_vq_row_bytes(r / c, bits) bytes of log2(K)-bit codes, code i
//       at bit i * bits of the row (little-endian across bytes), readable
//       KV_VQ_PAD bytes past the last row; `scale` [n_quant] f16; `vq.book`
//       [r / c x K x c] the decoding centroids (the k-means centroids times the
//       per-channel gain that undoes the codes' shrink towards their cell
//       centres). Value sums need no per-slot channel work: the weights p s
//       are summed into a histogram per (group, code) and the histogram meets
//       the codebook once per range. Why: at 4 channels x 64 centroids (1.625
//       bits an element) the codes lose half the KL of the 2-bit grid at fewer
//       bytes (Qwen2.5-Coder-1.5B, bench/RESULTS.md "vector codes").
// Code: kernels/cpu/attention.cpp (the range driver, softmax, sinks, merge),
// one file per layout (attention_rows, attention_q8, attention_q4,
// attention_q2, attention_vq; the KIVI group loop and GEAR shared in attention_kivi).
#pragma once
#include <cstdint>

#include "ggml-like/dtype.h"

// The row sizes below are the CUDA kernels' too (kernels/cuda/kv_read.cuh):
// host and device functions under nvcc, plain inline ones elsewhere (the SIMT
// harness compiles the kernels as host C++).
#ifdef __CUDACC__
#define ZK_HOST_DEVICE __host__ __device__
#else
#define ZK_HOST_DEVICE
#endif

namespace zk {

// The storage layout of one side (keys or values) of a block: its precision.
enum kv_layout_id : int {
    KV_LAYOUT_ROWS = 0,  // 16-bit (or f32) rows of the block's type
    KV_LAYOUT_Q8 = 1,
    KV_LAYOUT_Q4 = 2,
    KV_LAYOUT_Q2 = 3,
    KV_LAYOUT_VQ = 4,  // values only: vector codes against per-head codebooks
    KV_LAYOUT_COUNT = 5
};

constexpr int KV_Q8_BLOCK = 32;   // channels per int8 scale
constexpr int KV_Q4_VBLOCK = 64;  // value channels per KIVI (4- or 2-bit) grid

// A KIVI grid (a key channel's in a group, a value block's in a token) from its
// packed codes (see above) and the group's or token's steps.
inline float kivi_grid_scale(uint16_t grid, float ds) { return ds * (float)(grid & 0xff); }
inline float kivi_grid_min(uint16_t grid, float dm) { return dm * (float)(int8_t)(grid >> 8); }
constexpr int KV_GRID_STEPS = 2;  // f16 steps per key group or value token: ds, dm
// The clipped key grids (engine/kv_quant.h, kvq_key_grid_search): up to
// KV_KEY_CLIP_STEPS steps of KV_KEY_CLIP_STEP x the range off either end; keys
// of at most KV_KEY_MAX_R channels.
constexpr int KV_KEY_CLIP_STEPS = 8;
constexpr float KV_KEY_CLIP_STEP = 0.04f;
constexpr int KV_KEY_MAX_R = 512;
// Value grids a group codes against its steps: tokens x blocks of KV_Q4_VBLOCK.
constexpr int KV_VALUE_MAX_GRIDS = 2048;

// KIVI code buffers are readable this many bytes past their last row: the
// kernels load 32 bytes at a time and a rank that does not fill the last load
// reads on (the extra codes meet zero query bytes or land in dropped channels).
constexpr int KV_Q4_PAD = 32;

constexpr uint16_t KV_GEAR_NONE = 0xFFFF;  // unused sparse-correction slot

// Vector-coded values: K in [2, KV_VQ_MAX_K] a power of two, c channels a code
// with K <= KV_VQ_CELLS_PER_CH x c (the kernel's histogram has at most that many
// cells a channel); rows readable KV_VQ_PAD bytes on (a code is read as 16 bits).
constexpr int KV_VQ_MAX_K = 256;
constexpr int KV_VQ_CELLS_PER_CH = 64;
constexpr int KV_VQ_PAD = 2;
inline ZK_HOST_DEVICE int kv_vq_row_bytes(int n_codes, int bits) { return (n_codes * bits + 7) / 8; }
// Code i of a row of `bits`-bit codes.
inline int kv_vq_code(const uint8_t* row, int i, int bits) {
    const int at = i * bits;
    const unsigned w = (unsigned)row[at >> 3] | ((unsigned)row[(at >> 3) + 1] << 8);
    return (int)((w >> (at & 7)) & ((1u << bits) - 1));
}

inline int kv_n_blocks(int r, int block) { return (r + block - 1) / block; }
inline int kv_q4_row_bytes(int r) { return (r + 1) / 2; }
// Bytes of a row of r KIVI codes of `bits` (4 or 2) bits.
inline ZK_HOST_DEVICE int kv_kivi_row_bytes(int bits, int r) { return (r * bits + 7) / 8; }
// 1-bit key tails: at most KV_KEY_TAIL_MAX channels (tb <= 16 bytes, one
// 128-bit lane of the integer kernel); bytes of a tail, and of a key row of r
// channels whose last `tail` are 1-bit.
constexpr int KV_KEY_TAIL_MAX = 128;
inline ZK_HOST_DEVICE int kv_tail_bytes(int tail) { return (tail + 7) / 8; }
// ... with `mid` 2-bit channels before the tail (4-bit keys; 0 otherwise).
inline ZK_HOST_DEVICE int kv_key_row_bytes(int bits, int r, int tail, int zero = 0, int mid = 0) {
    return kv_kivi_row_bytes(bits, r - tail - zero - mid) + kv_kivi_row_bytes(2, mid) + kv_tail_bytes(tail);
}
// 0-bit key channels: the last `zero` channels of a KIVI key row have no codes,
// each is its group mean m_c; a group's grid is then r - zero packed grid codes
// followed by the zero channels' int8 min codes, two a word.
inline ZK_HOST_DEVICE int kv_key_grid_words(int r, int zero) { return r - zero + (zero + 1) / 2; }
// The int8 min codes of a group's 0-bit channels (grid: the group's
// kv_key_grid_words(r, zero) words); channel r - zero + i has m = dm x codes[i].
inline const int8_t* kv_key_zero_mins(const uint16_t* grid, int r, int zero) {
    return (const int8_t*)(grid + (r - zero));
}

struct attn_gear_view {
    int rank = 0;                      // low-rank part (0: none)
    int n_out = 0;                     // sparse correction slots per group (rank 0 and n_out 0: no GEAR)
    const uint16_t* a = nullptr;       // [n_groups x group x rank] f16, row t = t-th slot of the group
    const uint16_t* b = nullptr;       // [n_groups x r x rank] f16
    const uint16_t* out_idx = nullptr; // [n_groups x n_out] t * r + c ascending, KV_GEAR_NONE pads the end
    const uint16_t* out_val = nullptr; // [n_groups x n_out] f16
};

// One side (keys or values, r = r_k or r_v channels) of a block.
struct attn_side_view {
    kv_layout_id layout = KV_LAYOUT_ROWS;
    int64_t n_quant = 0;              // slots [0, n_quant) are in the codes (0 for KV_LAYOUT_ROWS)
    const void* rows = nullptr;       // slot s >= n_quant: row s - n_quant of [.. x r] `type`
    const void* codes = nullptr;      // Q8: int8 [n_quant x r]; KIVI: [n_quant x row_bytes(r)] + KV_Q4_PAD
    const uint16_t* scale = nullptr;  // Q8: [n_quant x blocks(r)] f16; KIVI keys: [n_groups x
                                      // kv_key_grid_words(r, zero)] packed grid codes; KIVI values:
                                      // [n_quant x vblocks(r)] packed grid codes
    const uint16_t* min = nullptr;    // KIVI keys: [n_groups x KV_GRID_STEPS] f16 steps; values: [n_quant x
                                      // KV_GRID_STEPS] f16 steps
    int tail = 0;                     // KIVI keys: `tail` channels in 1-bit codes before the `zero` ones
    int zero = 0;                     // KIVI keys: the last `zero` channels with no codes (rows of
                                      // kv_key_row_bytes(bits, r, tail, zero, mid) bytes; grids of
                                      // kv_key_grid_words(r, zero) words a group)
    int mid = 0;                      // 4-bit keys: `mid` channels in 2-bit codes before the tail
    attn_gear_view gear;
    // KV_LAYOUT_VQ: channels a code, centroids, bits a code, the decoding
    // centroids [r / c x K x c]
    struct {
        int c = 0, K = 0, bits = 0;
        const float* book = nullptr;
        // the same in int8 (engine/kv_vq.h kvq_vq_int8_book): codes [r / c x K x
        // c] and a scale a group [r / c]; null: the value sums stay in float
        const int8_t* book8 = nullptr;
        const float* book8_scale = nullptr;
    } vq;
};

struct attn_kv_view {
    dtype type;          // F32 or F16: the full-precision rows
    const int32_t* pos;  // [n_slots] token position held by each slot, ascending
    int64_t n_slots;
    int r_k;
    int r_v;
    attn_side_view k, v;
    // KIVI (either side): quantized slots form n_groups groups of at most
    // `group` tokens; group g holds slots [group_start[g], group_start[g + 1])
    // (all full unless eviction removed tokens from a group).
    int group = 0;
    int64_t n_groups = 0;
    const int32_t* group_start = nullptr;  // [n_groups + 1], group_start[n_groups] = the block's n_quant
    // exact sinks (n_sink_slots = 0: none)
    int64_t n_sink_slots = 0;
    int sink_dim = 0;                  // channels of a sink row (the head dim)
    const float* sink_k = nullptr;     // [sinks x sink_dim], rotated like the cache's keys when compressed
    const float* sink_v = nullptr;     // [sinks x sink_dim]
    // A tier (kv_cache_params::tier): slots [k.n_quant, n_slots) are this other
    // view's, its slot s - k.n_quant (4-bit KIVI codes, then the residual
    // window's rows); k.n_quant == v.n_quant. Null: those slots are rows.
    const attn_kv_view* tier = nullptr;
};

struct attn_q_view {
    const float* q;        // q[t * q_stride + j * q_head_stride + c]: token t, group member j, channel c < r_k
                           // (c < sink_dim for kernel_attention_sinks)
    int64_t q_stride;
    int64_t q_head_stride;
    int n_group;           // query heads sharing this KV head
    int64_t n_tok;
    const int32_t* q_pos;  // [n_tok]: token t sees slots whose pos <= q_pos[t] (causal)
    float scale;           // 1 / sqrt(original head dim)
};

// Partial results over a slot range: m, l [n_tok x n_group] (max score, sum of
// e^(s - m)); acc [n_tok x n_group x r_v] = sum of e^(s - m) v. A range with no
// visible slot gives m = -inf, l = 0, acc = 0.
// logits (optional, for eviction policies): the scaled scores are written to
// logits[(t * n_group + j) * logits_stride + s] for every slot s of the range,
// -inf for slots the token cannot see.
struct attn_partial {
    float* m;
    float* l;
    float* acc;
    float* logits = nullptr;
    int64_t logits_stride = 0;
    int acc_dim = 0;  // channels per (t, j) in acc; 0 = the block's r_v (a sink partial has sink_dim)
};

// Floats of scratch kernel_attention_range needs for a range of n slots.
// Whether this build's value sums over 8 x 256 vector codes are faster with
// int8 decoding books (attn_side_view::vq.book8) than in float: with VNNI's
// dpbusd (AVX-512 VNNI or AVX-VNNI), not with AVX2's maddubs + madd
// (bench/RESULTS.md "integer value sums for vector codes"). Books built or not
// by this; the kernel sums in integers whenever it is given them.
bool kernel_attention_vq_int8_faster();
// The book shape the integer kernel takes (8 channels a code, 256 centroids);
// books of that shape get int8 copies where the kernel is faster.
inline bool kernel_attention_vq_int8_shape(int c, int K) { return c == 8 && K == 256; }
int64_t kernel_attention_scratch(int n_group, int64_t n, int r_k, int r_v, int gear_rank);

// Slots below kv.n_sink_slots are left to kernel_attention_sinks (their logits
// are not written here).
void kernel_attention_range(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                            const attn_partial& out, float* scratch);
// The same through the reference path on every build: float dot products and
// sums over each layout's dequantized codes (no int8 rounding of the query or
// the value weights, no register-blocked loops). The tests hold the fast path
// to it; the engine never calls it.
void kernel_attention_range_ref(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q,
                                const attn_partial& out, float* scratch);

// The partial over the slot runs [runs[2 i], runs[2 i + 1]), i < n_runs
// (ascending, not overlapping; slots below kv.n_sink_slots left out as
// above), as one range: the scores of every run side by side, one softmax,
// the value sums of KIVI codes over all the runs in one call of the value
// kernel (its accumulators set up and scattered once, not once a run), other
// slots run by run. Equals kernel_attention_range over each run with the
// partials combined, up to float rounding, at one call's fixed cost instead
// of one a run (decode-time selection picks scattered 32-slot groups: 2-3 us
// a run on Zen 4, more than the run's own work; bench_attention
// BM_select_attention). scratch: kernel_attention_scratch for the runs' slots.
void kernel_attention_runs(const attn_kv_view& kv, const int64_t* runs, int64_t n_runs, const attn_q_view& q,
                           const attn_partial& out, float* scratch);

// The scaled scores q.scale (q_j . k) of slots [s0, s1) for the first query
// token of q, every one visible (kv.n_sink_slots <= s0 <= s1 <= the slots the
// token sees), left at the start of scratch: slot s of head j at
// scratch[j (s1 - s0) + s - s0]. scratch: kernel_attention_scratch for
// s1 - s0 slots. What decode-time selection ranks the slots of a block by when
// its keys have no grids to estimate from (engine/kv_select.h).
void kernel_attention_scores(const attn_kv_view& kv, int64_t s0, int64_t s1, const attn_q_view& q, float* scratch);

// The partial over the exact sink rows of the block's first n_sink_slots slots
// (acc [n_tok x n_group x sink_dim], out.acc_dim must be kv.sink_dim); the
// scores go to out.logits at those slots. No sink slots: an empty partial.
void kernel_attention_sinks(const attn_kv_view& kv, const attn_q_view& q, const attn_partial& out);

// Combines n_parts partials of the same queries and writes the normalised
// result to out[t * out_stride + j * out_head_stride + c] for c < the widest
// part (r_v, or a sink partial's acc_dim); narrower parts count as zeros there.
void kernel_attention_merge(const attn_partial* parts, int n_parts, int64_t n_tok, int n_group,
                            int r_v, float* out, int64_t out_stride, int64_t out_head_stride);

// Decode-time key-group selection (Quest's page bounds, read from KIVI grids):
// for key groups [g0, g1) of a block whose keys are KIVI (4- or 2-bit, tails
// and 0-bit channels included), bound[j x (g1 - g0) + g - g0] = q.scale x
// sum_c (q_jc centre_c + spread |q_jc| halfwidth_c) over each channel's range
// [m_c, m_c + L_c s_c] from the group's grids (GEAR's corrections not
// counted), for the first query token of q. spread = 1 gives an upper bound of
// q_j . k over every key the group can code; smaller spreads rank groups better
// (engine/kv_select.cpp). Reads 1/group of the keys' bytes, but works each
// query head against every group (bench_attention BM_select_groups). scratch: floats of
// kernel_attention_select_scratch. Why: at depth, decode reads every key
// and value; the groups whose bound is far below the best hold keys whose
// softmax weight is small, so a step may attend to the best groups only
// (engine/kv_select.h chooses them; bench/RESULTS.md "group selection").
int64_t kernel_attention_select_scratch(int n_group, int r_k);
void kernel_attention_group_bounds(const attn_kv_view& kv, const attn_q_view& q, int64_t g0, int64_t g1,
                                   float spread, float* bound, float* scratch);
// The same sums with each head's weights rounded to int8 (one step per head
// and sum, as the score kernels round the query), in integer dot products
// against the grid bytes as they lie: what selection ranks groups by. Within
// q.scale x (ds x step_w / 2 x sum_c scode_c + dm x step_q / 2 x sum_c |mcode_c|)
// of the float sums, step = max|x| / 63 (127 with VNNI). Why: at 32K the float
// sums over 1,024 groups were half of a selected layer's attention.
void kernel_attention_group_estimates(const attn_kv_view& kv, const attn_q_view& q, int64_t g0, int64_t g1,
                                      float spread, float* est, float* scratch);

}  // namespace zk
