// Tensor element types as GGUF numbers them (ggml_type ids) and their block
// layouts. A block format stores `block_size` elements in `type_size` bytes.
// zack computes with the types below; dtype.cpp's table also knows the layout
// of every other ggml type (IQ2_XXS, TQ1_0, MXFP4, ...) so that a file holding
// them can still be laid out, shown by `zack info` and refused by name.
//   F32 (0)   4 B/elem            F16 (1)  2 B/elem        BF16 (30) 2 B/elem
//   Q4_0 (2)  32 elems: f16 d, 16 B nibbles                 x = d * (q - 8)
//   Q4_1 (3)  32 elems: f16 d, f16 m, 16 B nibbles          x = d * q + m
//   Q5_0 (6)  32 elems: f16 d, 4 B high bits, 16 B nibbles  x = d * (q - 16)
//   Q5_1 (7)  32 elems: f16 d, f16 m, 4 B high bits, 16 B nibbles   x = d * q + m
//   Q8_0 (8)  32 elems: f16 d, 32 x int8                    x = d * q
//   Q8_1 (9)  32 elems: f16 d, f16 s (= d * sum q), 32 x int8  (activations only)
//   IQ4_NL (20) 32 elems: f16 d, 16 B nibbles indexing a fixed table of 16 int8
//                                                           x = d * kvalues[q]
//   Q2_K (10) 256 elems: 16 B 4-bit scales/mins, 64 B 2-bit quants, f16 d, f16 dmin
//                                                           x = d * sc * q - dmin * m
//   Q3_K (11) 256 elems: 32 B high bits, 64 B low 2 bits, 12 B 6-bit scales, f16 d
//                                                           x = d * (sc - 32) * (q - 4)
//   Q4_K (12) 256 elems: f16 d, f16 dmin, 12 B 6-bit scales/mins, 128 B nibbles
//   Q5_K (13) 256 elems: f16 d, f16 dmin, 12 B 6-bit scales/mins, 32 B high bits,
//                        128 B nibbles                      x = d * sc * q - dmin * m
//   Q6_K (14) 256 elems: 128 B low nibbles, 64 B high 2 bits, 16 x int8 scales, f16 d
//   Q8_K (15) 256 elems: f32 d, 256 x int8, 16 x int16 block sums (activations only)
// Low nibbles of a Q4_0/Q4_1/Q5_0/Q5_1/IQ4_NL block hold elements 0..15, high
// nibbles 16..31; quant_ref.h gives the bit layout of each block struct.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace zk {

enum class dtype : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ4_NL = 20,
    BF16 = 30,
};

struct dtype_traits {
    const char* name;    // as gguf-py spells it: "Q4_K", "IQ2_XXS"
    int64_t block_size;  // elements per block
    size_t type_size;    // bytes per block
    bool supported;      // one of the dtype enumerators: zack dequantizes it
    bool weight;         // zack multiplies matrices of it (not Q8_1 / Q8_K)
};

// A ggml type id whose layout zack knows (every ggml type gguf-py 0.19 lists,
// and the repacked Q4_0_4_4.. / IQ4_NL_4_4.. ids older files carry); a tensor of
// such a type can be read and shown even where zack cannot compute with it.
bool dtype_is_known(uint32_t id);
// True for the ids of the enumerators above (types zack computes with).
bool dtype_is_supported(uint32_t id);
// True for the types a weight matrix may have (matmul, embedding rows).
bool dtype_is_weight(dtype t);
// "F32, F16, BF16, Q4_0, ..." : the weight types, for error messages.
const std::string& dtype_weight_names();
// Works for every known id (supported or not); throws zk::error for others.
const dtype_traits& dtype_get_traits(dtype t);
const char* dtype_name(dtype t);
// Parses "f32", "q4_0", "Q8_0", ... (any known type); throws on unknown names.
dtype dtype_from_name(const std::string& name);
// Bytes for a row of n elements; throws if n is not a multiple of the block size.
size_t dtype_row_size(dtype t, int64_t n);

// Half/bfloat conversions (round to nearest even).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);

// n must be a multiple of the block size. Dequantize works for every supported
// type; quantize works for F32, F16, BF16, Q4_0, Q4_1, Q8_0, Q8_1, Q8_K (the
// types zack writes or uses for activations), and throws for the others.
void dtype_dequantize_row(dtype t, const void* src, float* dst, int64_t n);
void dtype_quantize_row(dtype t, const float* src, void* dst, int64_t n);

// The activation type a weight type's dot product pairs with (as llama.cpp):
// Q4_0/Q5_0/Q8_0/IQ4_NL->Q8_0, Q4_1/Q5_1->Q8_1, Q2_K..Q6_K->Q8_K, F16/BF16/F32->F32.
dtype dtype_vec_dot_type(dtype weight);
// dot(w, a) over n elements: w is a row of `weight`, a is that many elements of
// dtype_vec_dot_type(weight). SIMD inside (AVX2 / AVX-512 when built for them).
float dtype_vec_dot(dtype weight, const void* w, const void* a, int64_t n);

}  // namespace zk
