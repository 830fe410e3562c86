// Type traits and scalar conversions. Block quantization, dequantization and
// dot products live in quant.cpp.
#include "ggml-like/dtype.h"

#include <cctype>
#include <cstring>

#include "ggml-like/error.h"

namespace zk {

namespace {

struct dtype_entry {
    dtype t;
    dtype_traits traits;
};

const dtype_entry k_dtypes[] = {
    {dtype::F32, {"F32", 1, 4}},
    {dtype::F16, {"F16", 1, 2}},
    {dtype::Q4_0, {"Q4_0", 32, 2 + 16}},
    {dtype::Q4_1, {"Q4_1", 32, 2 + 2 + 16}},
    {dtype::Q8_0, {"Q8_0", 32, 2 + 32}},
    {dtype::Q8_1, {"Q8_1", 32, 2 + 2 + 32}},
    {dtype::Q4_K, {"Q4_K", 256, 2 + 2 + 12 + 128}},
    {dtype::Q6_K, {"Q6_K", 256, 128 + 64 + 16 + 2}},
    {dtype::Q8_K, {"Q8_K", 256, 4 + 256 + 16 * 2}},
    {dtype::BF16, {"BF16", 1, 2}},
};

}  // namespace

bool dtype_is_supported(uint32_t id) {
    for (const auto& e : k_dtypes)
        if ((uint32_t)e.t == id) return true;
    return false;
}

const dtype_traits& dtype_get_traits(dtype t) {
    for (const auto& e : k_dtypes)
        if (e.t == t) return e.traits;
    ZK_THROW("unsupported tensor type id %u", (unsigned)t);
}

const char* dtype_name(dtype t) { return dtype_get_traits(t).name; }

dtype dtype_from_name(const std::string& name) {
    std::string up;
    for (char c : name) up += (char)std::toupper((unsigned char)c);
    for (const auto& e : k_dtypes)
        if (up == e.traits.name) return e.t;
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
