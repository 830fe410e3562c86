// Type traits and scalar conversions. Block quantization, dequantization and
// dot products live in quant.cpp.
#include "ggml-like/dtype.h"

#include <cctype>
#include <cstring>

#include "ggml-like/error.h"

namespace zk {

namespace {

// Every ggml type id GGUF files carry, in id order. Sizes are the formats'
// (gguf-py's GGML_QUANT_SIZES); the supported ones are also checked against
// the block structs in quant_ref.h. Ids 4, 5 (Q4_2, Q4_3) were dropped before
// GGUF existed and are unknown here. 31..33 and 36..38 are row-interleaved
// repacks of Q4_0 / IQ4_NL blocks that ggml wrote into files for a while.
struct dtype_entry {
    uint32_t id;
    dtype_traits traits;
};

constexpr bool S = true, W = true, N = false;  // supported / weight / not

const dtype_entry k_dtypes[] = {
    {0, {"F32", 1, 4, S, W}},
    {1, {"F16", 1, 2, S, W}},
    {2, {"Q4_0", 32, 2 + 16, S, W}},
    {3, {"Q4_1", 32, 2 + 2 + 16, S, W}},
    {6, {"Q5_0", 32, 2 + 4 + 16, S, W}},
    {7, {"Q5_1", 32, 2 + 2 + 4 + 16, S, W}},
    {8, {"Q8_0", 32, 2 + 32, S, W}},
    {9, {"Q8_1", 32, 2 + 2 + 32, S, N}},
    {10, {"Q2_K", 256, 16 + 64 + 2 + 2, S, W}},
    {11, {"Q3_K", 256, 32 + 64 + 12 + 2, S, W}},
    {12, {"Q4_K", 256, 2 + 2 + 12 + 128, S, W}},
    {13, {"Q5_K", 256, 2 + 2 + 12 + 32 + 128, S, W}},
    {14, {"Q6_K", 256, 128 + 64 + 16 + 2, S, W}},
    {15, {"Q8_K", 256, 4 + 256 + 16 * 2, S, N}},
    {16, {"IQ2_XXS", 256, 66, N, N}},
    {17, {"IQ2_XS", 256, 74, N, N}},
    {18, {"IQ3_XXS", 256, 98, N, N}},
    {19, {"IQ1_S", 256, 50, N, N}},
    {20, {"IQ4_NL", 32, 2 + 16, S, W}},
    {21, {"IQ3_S", 256, 110, N, N}},
    {22, {"IQ2_S", 256, 82, N, N}},
    {23, {"IQ4_XS", 256, 136, N, N}},
    {24, {"I8", 1, 1, N, N}},
    {25, {"I16", 1, 2, N, N}},
    {26, {"I32", 1, 4, N, N}},
    {27, {"I64", 1, 8, N, N}},
    {28, {"F64", 1, 8, N, N}},
    {29, {"IQ1_M", 256, 56, N, N}},
    {30, {"BF16", 1, 2, S, W}},
    {31, {"Q4_0_4_4", 32, 18, N, N}},
    {32, {"Q4_0_4_8", 32, 18, N, N}},
    {33, {"Q4_0_8_8", 32, 18, N, N}},
    {34, {"TQ1_0", 256, 54, N, N}},
    {35, {"TQ2_0", 256, 66, N, N}},
    {36, {"IQ4_NL_4_4", 32, 18, N, N}},
    {37, {"IQ4_NL_4_8", 32, 18, N, N}},
    {38, {"IQ4_NL_8_8", 32, 18, N, N}},
    {39, {"MXFP4", 32, 17, N, N}},
    {40, {"NVFP4", 64, 36, N, N}},
    {41, {"Q1_0", 128, 18, N, N}},
};

const dtype_entry* find_entry(uint32_t id) {
    for (const auto& e : k_dtypes)
        if (e.id == id) return &e;
    return nullptr;
}

}  // namespace

bool dtype_is_known(uint32_t id) { return find_entry(id) != nullptr; }

bool dtype_is_supported(uint32_t id) {
    const dtype_entry* e = find_entry(id);
    return e && e->traits.supported;
}

bool dtype_is_weight(dtype t) {
    const dtype_entry* e = find_entry((uint32_t)t);
    return e && e->traits.weight;
}

const std::string& dtype_weight_names() {
    static const std::string names = [] {
        std::string s;
        for (const auto& e : k_dtypes)
            if (e.traits.weight) s += (s.empty() ? "" : ", ") + std::string(e.traits.name);
        return s;
    }();
    return names;
}

const dtype_traits& dtype_get_traits(dtype t) {
    if (const dtype_entry* e = find_entry((uint32_t)t)) return e->traits;
    ZK_THROW("unknown tensor type id %u (not a ggml type)", (unsigned)t);
}

const char* dtype_name(dtype t) { return dtype_get_traits(t).name; }

dtype dtype_from_name(const std::string& name) {
    std::string up;
    for (char c : name) up += (char)std::toupper((unsigned char)c);
    for (const auto& e : k_dtypes)
        if (up == e.traits.name) return (dtype)e.id;
    ZK_THROW("unknown tensor type '%s'", name.c_str());
}

size_t dtype_row_size(dtype t, int64_t n) {
    const dtype_traits& tr = dtype_get_traits(t);
    if (n < 0 || n % tr.block_size != 0)
        ZK_THROW("row of %lld elements is not a multiple of the %s block size %lld", (long long)n,
                 tr.name, (long long)tr.block_size);
    return (size_t)(n / tr.block_size) * tr.type_size;
}

float fp16_to_fp32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exp = (h >> 10) & 0x1f;
    const uint32_t man = h & 0x3ff;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            int e = -1;
            uint32_t m = man;
            do {
                e++;
                m <<= 1;
            } while ((m & 0x400) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((m & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_fp16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    const uint32_t absx = x & 0x7fffffff;
    if (absx >= 0x7f800000u)  // inf or nan
        return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000u ? 0x200 : 0));
    if (absx >= 0x477ff000u) return (uint16_t)(sign | 0x7c00);  // rounds to >= 65520: inf
    if (absx < 0x38800000u) {  // below the smallest normal half: subnormal or zero
        if (absx < 0x33000000u) return (uint16_t)sign;  // < 2^-25 rounds to 0
        const uint32_t e = absx >> 23;
        const uint32_t m = (absx & 0x7fffff) | 0x800000;
        const uint32_t shift = 126 - e;  // 14 + (113 - e)
        uint32_t half = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = ((absx >> 13) - (112u << 10));
    const uint32_t rem = absx & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
    return (uint16_t)(sign | half);
}

float bf16_to_fp32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t fp32_to_bf16(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40);  // quiet nan
    x += 0x7fff + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

}  // namespace zk
