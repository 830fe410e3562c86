// Interleaved ("packed") copies of K-quant, Q8_0 and Q5_0 weight matrices, and
// the tiled matmul kernels that read them (ggml-like/quant_tile_k.cpp).
//
// Why: a GGUF row stores its 256-element blocks one after the other, so a dot
// product walks one row at a time and needs a horizontal sum per output. The
// packed layout interleaves k_pack_rows rows at 4-byte granularity: one 32-byte
// load of weights holds 4 consecutive elements of each of 8 rows, and one
// dpbusd of it against 4 broadcast activation bytes adds a 4-term dot to all 8
// rows at once (8 int32 lanes, one per row; 16 rows and 64-byte loads with
// AVX-512). Each loaded and unpacked weight
// vector is reused for up to k_pack_toks tokens, and the results of 8 rows come
// out as one vector, with no horizontal sums. The per-row scales are stored
// unpacked as bytes ([sub-block][row]), so the kernel scales 8 rows per
// instruction.
//
// A packed matrix is a sequence of row groups of k_pack_rows rows (the last one
// padded with zero rows); group g holds its n_cols / quant_pack_block_elems(t)
// blocks one after the other, each quant_pack_block_bytes(t) long. Packing
// changes no value: the packed kernels give the same integer sums as the
// scalar references (quant_dot_ref), only the float summation order differs.
//
// Activations for the packed K-quant kernels are quantized per 256 elements
// exactly as Q8_K (same int8 values and scale, so the same arithmetic as
// quant_dot_ref), in a block that also carries the sums the weights' offsets
// need (block_q8_Kp); for Q8_0 and Q5_0, per 32 exactly as Q8_0 (block_q8_0pa).
#pragma once
#include <cstddef>
#include <cstdint>

#include "ggml-like/dtype.h"

namespace zk {

// Rows per packed group: one int32 lane each of the kernels' vectors (16 with
// AVX-512 VNNI, else 8). The layout exists only in memory, so it follows the build.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__)
constexpr int k_pack_rows = 16;
#else
constexpr int k_pack_rows = 8;
#endif
// Tokens per kernel call at most (the kernels' register tiles may be smaller:
// quant_tile_k.cpp).
constexpr int k_pack_toks = 8;

// Q4_K, R rows, one 256-element block (1184 bytes for 8 rows, 2368 for 16: a
// multiple of the vector size, so every weight load of an aligned packed
// matrix is aligned):
//   qs[k][i][r][b]: low nibble = element 64k + 4i + b of row r (sub-block 2k),
//                   high nibble = element 64k + 32 + 4i + b (sub-block 2k + 1)
//   sc[j][r]: 6-bit scale of sub-block j, m[p][r][e]: 6-bit min of sub-block 2p + e
struct block_q4_Kp {
    uint8_t qs[4][8][k_pack_rows][4];
    uint16_t d[k_pack_rows];
    uint16_t dmin[k_pack_rows];
    uint8_t sc[8][k_pack_rows];
    uint8_t m[4][k_pack_rows][2];
};
// Q6_K, R rows, one block (1680 bytes of data for 8 rows, padded to 1696; 3392
// for 16). Element e = 16n + 4j + b of row r (group n of 16, chunk j of 4,
// byte b) has
//   its low 4 bits in ql[2n + j / 2][r][b] (low nibble for even j, high for odd),
//   its high 2 bits in bits 2j..2j+1 of qh[n][r][b];
//   sc[n][r]: int8 scale of group n.
struct block_q6_Kp {
    uint8_t ql[32][k_pack_rows][4];
    uint8_t qh[16][k_pack_rows][4];
    int8_t sc[16][k_pack_rows];
    uint16_t d[k_pack_rows];
    uint8_t pad[2 * k_pack_rows];
};
// Q8_0 and Q5_0, R rows, two 32-element blocks (64 elements): the GGUF rows'
// bytes, so decode reads as much as from the rows. The codes are unsigned, c =
// q + Off (Q8_0: the int8 plus 128; Q5_0: its 5-bit code, value c - 16), so a
// dpbusd multiplies them by the signed activations; the activations carry
// -Off x their block's sum to start each block's integer sum from.
//   Q8_0: qs[8h + i][r][b] = code of element 4i + b of block h of row r
//   Q5_0: qs[i][r][b] = low 4 bits of element 4i + b of block 0 (low nibble)
//         and of block 1 (high nibble); bit i of qh[h][r][b] = bit 4 of that
//         element of block h
//   d[h][r]: f16 scale of block h
struct block_q8_0p {
    uint8_t qs[16][k_pack_rows][4];
    uint16_t d[2][k_pack_rows];
};
struct block_q5_0p {
    uint8_t qs[8][k_pack_rows][4];
    uint8_t qh[2][k_pack_rows][4];
    uint16_t d[2][k_pack_rows];
};
static_assert(sizeof(block_q4_Kp) == 148 * k_pack_rows && sizeof(block_q4_Kp) % (4 * k_pack_rows) == 0, "block_q4_Kp layout");
static_assert(sizeof(block_q6_Kp) == 212 * k_pack_rows && sizeof(block_q6_Kp) % (4 * k_pack_rows) == 0, "block_q6_Kp layout");
static_assert(sizeof(block_q8_0p) == 68 * k_pack_rows && sizeof(block_q8_0p) % (4 * k_pack_rows) == 0, "block_q8_0p layout");
static_assert(sizeof(block_q5_0p) == 44 * k_pack_rows && sizeof(block_q5_0p) % (4 * k_pack_rows) == 0, "block_q5_0p layout");

// Activations for the packed kernels, per 256 elements (384 bytes).
struct block_q8_Kp {
    int8_t qs[256];   // as Q8_K
    float d;          // as Q8_K
    int16_t s32[8];   // sum of each 32 qs (Q4_K mins)
    int16_t s16[16];  // sum of each 16 qs (as Q8_K's bsums)
    int32_t n16[16];  // -32 * s16 (Q6_K's q - 32 offset, as int32 to start a sum from)
    uint8_t pad[12];
};
static_assert(sizeof(block_q8_Kp) == 384, "block_q8_Kp layout");

// Activations for the packed Q8_0 / Q5_0 kernels, per 32 elements (48 bytes):
// Q8_0's int8 values and scale (the reference dots' activations), and the
// block's sum times -16 and -128, the start of a Q5_0 and a Q8_0 block's sum.
struct block_q8_0pa {
    int8_t qs[32];
    float d;  // the f16 scale of Q8_0, as f32
    int32_t n16;
    int32_t n128;
    int32_t pad;
};
static_assert(sizeof(block_q8_0pa) == 48, "block_q8_0pa layout");

// True when this build has a packed kernel for [* x n_cols] weights of type t
// (Q4_K, Q6_K; Q8_0 and Q5_0 where the build has int32 byte dots, VNNI, and
// rows are whole 64-element blocks).
bool quant_pack_supported(dtype t, int64_t n_cols);
// Elements per packed block (256 for the K-quants, 64 for Q8_0 / Q5_0), and
// the bytes of one of k_pack_rows rows (both throw for unsupported types).
int64_t quant_pack_block_elems(dtype t);
size_t quant_pack_block_bytes(dtype t);
// Bytes of the packed copy of a [n_rows x n_cols] matrix.
size_t quant_pack_size(dtype t, int64_t n_rows, int64_t n_cols);
// Packs row groups [g0, g1) of the [n_rows x n_cols] matrix src (GGUF rows,
// row stride dtype_row_size(t, n_cols)) into dst, the start of the packed copy.
void quant_pack_groups(dtype t, const void* src, int64_t n_rows, int64_t n_cols, int64_t g0, int64_t g1,
                       void* dst);
// Writes row r of a packed matrix back in GGUF layout (tests; the inverse of packing).
void quant_unpack_row(dtype t, const void* packed, int64_t n_cols, int64_t r, void* dst);
// Row r of a packed matrix as n_cols floats, the values dtype_dequantize_row
// gives for its GGUF row (the embedding rows of a table that is also the tied,
// packed output matrix: its GGUF pages are then released; nothing allocated).
void quant_pack_dequantize_row(dtype t, const void* packed, int64_t n_cols, int64_t r, float* y);

// Activation rows for the packed kernels of weight type t (block_q8_Kp for the
// K-quants, block_q8_0pa for Q8_0 / Q5_0): the kind (weights of one kind share
// a row), bytes per row, and the quantizer (SIMD where the build has it; the
// same bytes as quant_pack_quantize_ref).
int quant_pack_act_kind(dtype t);
size_t quant_pack_act_row_size(dtype t, int64_t n_cols);
void quant_pack_quantize(dtype t, const float* x, void* dst, int64_t n_cols);
void quant_pack_quantize_ref(dtype t, const float* x, void* dst, int64_t n_cols);

// One row group x nt tokens (nt <= k_pack_toks):
//   y[t * y_stride + r] = dot(row r of the group, token t)   for r < nr, t < nt
// group points at the group's first block; a holds quant_pack_quantize rows.
// Each output is computed the same way whatever nt, nr and its position in the
// tile, so results do not depend on the tiling. `prefetch` (an address, may be
// past the end) is touched block by block for single-token (decode) calls.
void quant_pack_tile(dtype t, int64_t n_cols, const void* group, int nr, const void* a, size_t a_stride, int nt,
                     float* y, size_t y_stride, const void* prefetch);

// Scalar reference of one output from the packed layout (tests).
float quant_pack_dot_ref(dtype t, int64_t n_cols, const void* group, int r, const void* a);

}  // namespace zk
