// Block formats, quantizers and dot products (ggml-like/quant.cpp,
// quant_simd.cpp, dtype.cpp conversions).
//
// References used: the F16C hardware conversion (when built for it) and exact
// double arithmetic for fp16/bf16; the format definitions (hand-built blocks)
// for dequantization; dequantize + double dot for every dot product; the
// scalar reference for every SIMD path. tests/test_dequant_ref.py checks the
// dequantizers against gguf-py on real and synthetic files.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "ggml-like/quant_ref.h"
#include "tests/quant_random.h"

#if defined(__F16C__)
#include <immintrin.h>
#endif

using namespace zk;

namespace {

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v((size_t)n);
    for (auto& x : v) x = u(rng);
    return v;
}

// A row of `t` holding n elements (tests/quant_random.h).
std::vector<uint8_t> random_row(dtype t, int64_t n, uint32_t seed) { return quant_random_rows(t, 1, n, seed); }

std::vector<float> dequant(dtype t, const std::vector<uint8_t>& row, int64_t n) {
    std::vector<float> y((size_t)n);
    dtype_dequantize_row(t, row.data(), y.data(), n);
    return y;
}

}  // namespace

// ---------------------------------------------------------------- fp16 / bf16

TEST(Fp16, EveryHalfRoundTrips) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = fp16_to_fp32((uint16_t)h);
        const uint16_t back = fp32_to_fp16(f);
        const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        if (is_nan) {
            EXPECT_TRUE(std::isnan(f)) << h;
            EXPECT_EQ(back & 0x7c00, 0x7c00) << h;
            EXPECT_NE(back & 0x3ff, 0) << h;
            continue;
        }
        ASSERT_EQ(back, h) << "half 0x" << std::hex << h << " -> " << f;
#if defined(__F16C__)
        ASSERT_EQ(f, _cvtsh_ss((uint16_t)h)) << h;
#endif
    }
}

TEST(Fp16, KnownValues) {
    EXPECT_EQ(fp32_to_fp16(1.0f), 0x3c00);
    EXPECT_EQ(fp32_to_fp16(-2.0f), 0xc000);
    EXPECT_EQ(fp32_to_fp16(65504.0f), 0x7bff);
    EXPECT_EQ(fp32_to_fp16(65520.0f), 0x7c00);  // rounds to infinity
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
    EXPECT_EQ(fp32_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // tie to even: 0
    EXPECT_EQ(fp32_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: tie to even: 2
    EXPECT_EQ(fp16_to_fp32(0x3555), 0.333251953125f);
}

// Rounding of arbitrary floats: the result must be the nearest half (ties to
// even), checked in double against its neighbours; F16C as a second opinion.
TEST(Fp16, RoundsToNearestEven) {
    std::mt19937 rng(7);
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = rng();
        // Concentrate on the half range (exponents 2^-26 .. 2^16).
        bits = (bits & 0x807fffffu) | ((uint32_t)(101 + rng() % 43) << 23);
        float f;
        std::memcpy(&f, &bits, 4);
        const uint16_t h = fp32_to_fp16(f);
#if defined(__F16C__)
        ASSERT_EQ(h, _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT)) << f;
#endif
        if ((h & 0x7fff) >= 0x7c00) continue;  // overflowed to inf: checked in KnownValues
        const double v = fp16_to_fp32(h), x = f;
        const double lo = fp16_to_fp32((uint16_t)(h - ((h & 0x7fff) ? 1 : 0)));
        const double hi = fp16_to_fp32((uint16_t)(h + 1));
        const double err = std::fabs(v - x);
        ASSERT_LE(err, std::fabs(lo - x)) << f;
        if ((h & 0x7fff) != 0x7bff) {
            ASSERT_LE(err, std::fabs(hi - x)) << f;
        }
    }
}

TEST(Bf16, RoundTripAndRounding) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float f = bf16_to_fp32((uint16_t)h);
        if (std::isnan(f)) {
            EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(f))));
            continue;
        }
        ASSERT_EQ(fp32_to_bf16(f), h) << h;
    }
    std::mt19937 rng(11);
    for (int i = 0; i < 200000; i++) {
        uint32_t bits = rng();
        float f;
        std::memcpy(&f, &bits, 4);
        if (!std::isfinite(f) || std::fabs(f) > 3e38f) continue;
        const uint16_t b = fp32_to_bf16(f);
        const double x = f, v = bf16_to_fp32(b);
        const double below = bf16_to_fp32((uint16_t)(bits >> 16));
        const double above = bf16_to_fp32((uint16_t)((bits >> 16) + 1));
        const double dl = std::fabs(below - x), da = std::fabs(above - x);
        if (dl < da) {
            ASSERT_EQ(v, below) << f;
        } else if (da < dl) {
            ASSERT_EQ(v, above) << f;
        } else {
            ASSERT_EQ(b & 1, 0) << f;  // tie: even mantissa
        }
    }
}

// ---------------------------------------------------------------- layouts (from the format definitions)

TEST(Dequant, HandBuiltBlocks) {
    {
        block_q4_0 b;
        b.d = fp32_to_fp16(0.5f);
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        float y[32];
        dtype_dequantize_row(dtype::Q4_0, &b, y, 32);
        for (int j = 0; j < 16; j++) {
            EXPECT_EQ(y[j], 0.5f * (j - 8));
            EXPECT_EQ(y[16 + j], 0.5f * (7 - j));
        }
    }
    {
        block_q4_1 b;
        b.d = fp32_to_fp16(0.25f);
        b.m = fp32_to_fp16(-1.0f);
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));
        float y[32];
        dtype_dequantize_row(dtype::Q4_1, &b, y, 32);
        for (int j = 0; j < 16; j++) {
            EXPECT_EQ(y[j], 0.25f * j - 1.0f);
            EXPECT_EQ(y[16 + j], 0.25f * (15 - j) - 1.0f);
        }
    }
    {
        // Q4_K: sub-block j has scale j+1 and min 2j (packed as documented in
        // gguf-py: bytes 0-3 low 6 bits of scales 0-3, 4-7 mins 0-3, 8-11 low
        // nibbles scales 4-7 / high nibbles mins 4-7, top 2 bits of 0-7 carry
        // the high bits of scales/mins 4-7).
        block_q4_K b;
        std::memset(&b, 0, sizeof b);
        b.d = fp32_to_fp16(1.0f);
        b.dmin = fp32_to_fp16(0.5f);
        int sc[8], mn[8];
        for (int j = 0; j < 8; j++) {
            sc[j] = j + 1 + (j >= 4 ? 40 : 0);  // exercise the high bits
            mn[j] = 2 * j + (j >= 4 ? 32 : 0);
        }
        for (int j = 0; j < 4; j++) {
            b.scales[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
            b.scales[j + 4] = (uint8_t)(mn[j] | ((mn[j + 4] >> 4) << 6));
            b.scales[j + 8] = (uint8_t)((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
        }
        for (int l = 0; l < 128; l++) b.qs[l] = (uint8_t)((l % 16) | ((15 - l % 16) << 4));
        float y[256];
        dtype_dequantize_row(dtype::Q4_K, &b, y, 256);
        for (int e = 0; e < 256; e++) {
            const int j = e / 32, l = e % 32, k = e / 64;
            const int byte = b.qs[32 * k + l];
            const int q = (j % 2 == 0) ? (byte & 15) : (byte >> 4);
            EXPECT_EQ(y[e], 1.0f * sc[j] * q - 0.5f * mn[j]) << e;
        }
    }
    {
        // Q6_K: element e = 128h + 32k + l: low 4 bits from ql[64h + l + 32(k%2)]
        // (low nibble for k < 2, high for k >= 2), high 2 bits from qh[32h + l]
        // at bit 2k; scale scales[e / 16]; value d * sc * (q - 32).
        block_q6_K b;
        std::mt19937 rng(3);
        for (auto& v : b.ql) v = (uint8_t)rng();
        for (auto& v : b.qh) v = (uint8_t)rng();
        for (auto& v : b.scales) v = (int8_t)rng();
        b.d = fp32_to_fp16(0.125f);
        float y[256];
        dtype_dequantize_row(dtype::Q6_K, &b, y, 256);
        for (int e = 0; e < 256; e++) {
            const int h = e / 128, k = (e % 128) / 32, l = e % 32;
            const int lb = b.ql[64 * h + l + 32 * (k % 2)];
            const int lo = k < 2 ? (lb & 15) : (lb >> 4);
            const int hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
            EXPECT_EQ(y[e], 0.125f * b.scales[e / 16] * ((lo | (hi << 4)) - 32)) << e;
        }
    }
}

// The 5-bit, non-linear and 2/3/5-bit K-quant layouts, element by element from
// the format definitions (gguf-py's quants.py), on blocks with every field set.
TEST(Dequant, HandBuiltBlocksMoreTypes) {
    std::mt19937 rng(21);
    auto fill = [&](uint8_t* p, size_t n) {
        for (size_t i = 0; i < n; i++) p[i] = (uint8_t)rng();
    };
    // Element e (< 32) of a 32-block: the low nibble of qs[e] for e < 16, the high
    // nibble of qs[e - 16] after; Q5's 5th bit is bit e of the little-endian u32 qh.
    auto nib = [](const uint8_t* qs, int e) { return e < 16 ? (qs[e] & 15) : (qs[e - 16] >> 4); };
    auto bit5 = [](const uint8_t* qh, int e) { return ((qh[e / 8] >> (e % 8)) & 1) << 4; };
    {
        block_q5_0 b;
        fill((uint8_t*)&b, sizeof b);
        b.d = fp32_to_fp16(0.5f);
        float y[32];
        dtype_dequantize_row(dtype::Q5_0, &b, y, 32);
        for (int e = 0; e < 32; e++) EXPECT_EQ(y[e], 0.5f * ((nib(b.qs, e) | bit5(b.qh, e)) - 16)) << e;
    }
    {
        block_q5_1 b;
        fill((uint8_t*)&b, sizeof b);
        b.d = fp32_to_fp16(0.25f);
        b.m = fp32_to_fp16(-1.5f);
        float y[32];
        dtype_dequantize_row(dtype::Q5_1, &b, y, 32);
        for (int e = 0; e < 32; e++) EXPECT_EQ(y[e], 0.25f * (nib(b.qs, e) | bit5(b.qh, e)) - 1.5f) << e;
    }
    {
        const int table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
        block_iq4_nl b;
        for (int j = 0; j < 16; j++) b.qs[j] = (uint8_t)(j | ((15 - j) << 4));  // every level both halves
        b.d = fp32_to_fp16(2.0f);
        float y[32];
        dtype_dequantize_row(dtype::IQ4_NL, &b, y, 32);
        for (int e = 0; e < 32; e++) EXPECT_EQ(y[e], 2.0f * table[nib(b.qs, e)]) << e;
    }
    // K-quants: element e = 128h + 32s + l has its 2 low bits at bits 2s of qs[32h + l].
    auto low2 = [](const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3; };
    {
        block_q2_K b;
        fill((uint8_t*)&b, sizeof b);
        b.d = fp32_to_fp16(0.5f);
        b.dmin = fp32_to_fp16(0.25f);
        float y[256];
        dtype_dequantize_row(dtype::Q2_K, &b, y, 256);
        for (int e = 0; e < 256; e++) {
            const int sc = b.scales[e / 16] & 15, m = b.scales[e / 16] >> 4;
            EXPECT_EQ(y[e], 0.5f * sc * low2(b.qs, e) - 0.25f * m) << e;
        }
    }
    {
        // 16 6-bit scales stored +32: low 4 bits in the nibbles of bytes 0-7
        // (groups 0-7 low, 8-15 high), high 2 bits in bytes 8-11 at bits 2(g / 4).
        block_q3_K b;
        fill((uint8_t*)&b, sizeof b);
        int sc[16];
        for (int g = 0; g < 16; g++) sc[g] = (g * 37 + 5) % 64;
        std::memset(b.scales, 0, sizeof b.scales);
        for (int g = 0; g < 16; g++) {
            b.scales[g % 8] |= (uint8_t)((sc[g] & 15) << (g < 8 ? 0 : 4));
            b.scales[8 + g % 4] |= (uint8_t)((sc[g] >> 4) << (2 * (g / 4)));
        }
        b.d = fp32_to_fp16(0.125f);
        float y[256];
        dtype_dequantize_row(dtype::Q3_K, &b, y, 256);
        for (int e = 0; e < 256; e++) {
            const int high = (b.hmask[e % 32] >> (e / 32)) & 1;  // a set bit means no -4
            EXPECT_EQ(y[e], 0.125f * (sc[e / 16] - 32) * (low2(b.qs, e) - (high ? 0 : 4))) << e;
        }
    }
    {
        // Q5_K: Q4_K's scales and nibbles plus bit j of qh[l] for element 32j + l.
        block_q5_K b;
        fill((uint8_t*)&b, sizeof b);
        b.d = fp32_to_fp16(1.0f);
        b.dmin = fp32_to_fp16(0.5f);
        float y[256];
        dtype_dequantize_row(dtype::Q5_K, &b, y, 256);
        for (int e = 0; e < 256; e++) {
            const int j = e / 32, l = e % 32;
            int sc, m;
            q4_K_scale_min(b.scales, j, sc, m);  // checked against the packing in HandBuiltBlocks
            const int byte = b.qs[32 * (j / 2) + l];
            const int q = ((j % 2 == 0) ? (byte & 15) : (byte >> 4)) | (((b.qh[l] >> j) & 1) << 4);
            EXPECT_EQ(y[e], 1.0f * sc * q - 0.5f * m) << e;
        }
    }
}

// dtype.cpp's table: sizes equal the block structs, every ggml type known.
TEST(Dtype, TableMatchesBlockStructs) {
    const std::pair<dtype, size_t> structs[] = {
        {dtype::Q4_0, sizeof(block_q4_0)}, {dtype::Q4_1, sizeof(block_q4_1)}, {dtype::Q5_0, sizeof(block_q5_0)},
        {dtype::Q5_1, sizeof(block_q5_1)}, {dtype::Q8_0, sizeof(block_q8_0)}, {dtype::Q8_1, sizeof(block_q8_1)},
        {dtype::Q2_K, sizeof(block_q2_K)}, {dtype::Q3_K, sizeof(block_q3_K)}, {dtype::Q4_K, sizeof(block_q4_K)},
        {dtype::Q5_K, sizeof(block_q5_K)}, {dtype::Q6_K, sizeof(block_q6_K)}, {dtype::Q8_K, sizeof(block_q8_K)},
        {dtype::IQ4_NL, sizeof(block_iq4_nl)},
    };
    for (const auto& [t, size] : structs) {
        EXPECT_EQ(dtype_get_traits(t).type_size, size) << dtype_name(t);
        EXPECT_TRUE(dtype_is_supported((uint32_t)t)) << dtype_name(t);
    }
    // Known but not computed with: laid out, named, refused by the math.
    EXPECT_TRUE(dtype_is_known(16));
    EXPECT_FALSE(dtype_is_supported(16));
    EXPECT_STREQ(dtype_name((dtype)16), "IQ2_XXS");
    EXPECT_EQ(dtype_get_traits((dtype)34).type_size, 54u);  // TQ1_0
    EXPECT_EQ(dtype_from_name("iq2_xxs"), (dtype)16);
    // Not ggml types at all: Q4_2 / Q4_3 (dropped before GGUF), past the end.
    for (uint32_t id : {4u, 5u, 42u, 1000u}) {
        EXPECT_FALSE(dtype_is_known(id)) << id;
        EXPECT_THROW(dtype_get_traits((dtype)id), zk::error) << id;
    }
    EXPECT_EQ(dtype_weight_names(), "F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, BF16");
    EXPECT_FALSE(dtype_is_weight(dtype::Q8_K));
    EXPECT_FALSE(dtype_is_weight((dtype)16));
}

// ---------------------------------------------------------------- quantize -> dequantize error

// Largest |x - x'| each format allows for one block, from its step size. The
// f16 rounding of d (and m) adds |q| * 2^-11 relative terms.
TEST(Quantize, RoundTripErrorWithinStep) {
    const float u = std::ldexp(1.0f, -11);
    for (dtype t : {dtype::Q4_0, dtype::Q4_1, dtype::Q8_0, dtype::Q8_1, dtype::Q8_K, dtype::F16,
                    dtype::BF16, dtype::F32}) {
        const int64_t bs = std::max<int64_t>(256, dtype_get_traits(t).block_size);
        const int64_t n = bs * 8;
        for (uint32_t seed = 1; seed <= 4; seed++) {
            // Mixed magnitudes: one block per scale so every exponent range is hit.
            auto x = random_floats(n, seed, -1.0f, 1.0f);
            for (int64_t i = 0; i < n; i++) x[i] *= std::ldexp(1.0f, (int)(i / bs) - 4);
            if (seed == 4) std::fill(x.begin(), x.begin() + bs, 0.0f);  // all-zero blocks
            const auto row = [&] {
                std::vector<uint8_t> r(dtype_row_size(t, n));
                dtype_quantize_row(t, x.data(), r.data(), n);
                return r;
            }();
            const auto y = dequant(t, row, n);
            const int64_t qb = dtype_get_traits(t).block_size;
            for (int64_t b0 = 0; b0 < n; b0 += std::max<int64_t>(qb, 32)) {
                const int64_t len = std::max<int64_t>(qb, 32);
                float mn = x[b0], mx = x[b0], amax = 0;
                for (int64_t i = b0; i < b0 + len; i++) {
                    mn = std::min(mn, x[i]);
                    mx = std::max(mx, x[i]);
                    amax = std::max(amax, std::fabs(x[i]));
                }
                for (int64_t i = b0; i < b0 + len; i++) {
                    float bound = 0;
                    switch (t) {
                        case dtype::Q4_0: bound = amax / 8 * (1 + 8 * u); break;  // clamped end: one step
                        case dtype::Q4_1: bound = (mx - mn) / 15 * (0.5f + 15 * u) + std::fabs(mn) * u; break;
                        case dtype::Q8_0:
                        case dtype::Q8_1: bound = amax / 127 * (0.5f + 127 * u); break;
                        case dtype::Q8_K: bound = amax / 128; break;  // clamped end: one step
                        case dtype::F16: bound = std::max(std::fabs(x[i]) * u, std::ldexp(1.0f, -25)); break;  // subnormals: half an ulp of 2^-24
                        case dtype::BF16: bound = std::fabs(x[i]) * std::ldexp(1.0f, -8); break;
                        default: bound = 0;
                    }
                    bound += 1e-7f * amax;
                    ASSERT_LE(std::fabs(x[i] - y[i]), bound)
                        << dtype_name(t) << " element " << i << " x " << x[i] << " -> " << y[i];
                }
            }
        }
    }
}

TEST(Quantize, AuxiliaryFields) {
    const int64_t n = 1024;
    const auto x = random_floats(n, 5, -3.0f, 2.0f);
    std::vector<block_q8_1> q1(n / 32);
    dtype_quantize_row(dtype::Q8_1, x.data(), q1.data(), n);
    for (const auto& b : q1) {
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += b.qs[j];
        // s is d * sum rounded to f16 once, with d the unrounded f32 scale.
        EXPECT_NEAR(fp16_to_fp32(b.s), fp16_to_fp32(b.d) * sum, std::fabs(fp16_to_fp32(b.d) * sum) * 2e-3 + 1e-6);
    }
    std::vector<block_q8_K> qk(n / 256);
    dtype_quantize_row(dtype::Q8_K, x.data(), qk.data(), n);
    for (const auto& b : qk)
        for (int g = 0; g < 16; g++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += b.qs[16 * g + j];
            EXPECT_EQ(b.bsums[g], sum);
        }
}

// The SIMD quantizers must write the same bytes as the scalar reference,
// including the round-half-away-from-zero ties.
TEST(Quantize, SimdMatchesScalar) {
    for (dtype t : {dtype::Q8_0, dtype::Q8_1}) {
        const int64_t n = 32 * 64;
        auto x = random_floats(n, 9, -4.0f, 4.0f);
        // Block 0: amax 127 makes d = 1, so the halves below are exact ties.
        for (int j = 0; j < 32; j++) x[j] = (j % 2 ? -1.0f : 1.0f) * (j + 0.5f);
        x[31] = 127.0f;
        std::vector<uint8_t> a(dtype_row_size(t, n)), b(a.size(), 0xAA);
        quant_quantize_ref(t, x.data(), a.data(), n);
        if (!quant_quantize_simd(t, x.data(), b.data(), n)) GTEST_SKIP() << "no SIMD quantizer in this build";
        ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size()), 0) << dtype_name(t);
        const auto* blk = (const int8_t*)(a.data() + (t == dtype::Q8_0 ? 2 : 4));
        EXPECT_EQ(blk[0], 1);    // 0.5 -> 1
        EXPECT_EQ(blk[1], -2);   // -1.5 -> -2
        EXPECT_EQ(blk[2], 3);    // 2.5 -> 3
    }
}

TEST(Quantize, UnsupportedCombosThrow) {
    std::vector<float> x(256, 1.0f);
    std::vector<uint8_t> buf(1024);
    EXPECT_THROW(dtype_quantize_row(dtype::Q4_K, x.data(), buf.data(), 256), zk::error);
    EXPECT_THROW(dtype_quantize_row(dtype::Q6_K, x.data(), buf.data(), 256), zk::error);
    EXPECT_THROW(dtype_quantize_row(dtype::Q8_0, x.data(), buf.data(), 33), zk::error);
    EXPECT_THROW(dtype_dequantize_row(dtype::Q4_K, buf.data(), x.data(), 128), zk::error);
    EXPECT_THROW(dtype_quantize_row(dtype::Q5_0, x.data(), buf.data(), 256), zk::error);
    // A known type zack does not compute with: the message names it.
    try {
        dtype_dequantize_row((dtype)16, buf.data(), x.data(), 256);
        ADD_FAILURE() << "IQ2_XXS dequantized";
    } catch (const zk::error& e) {
        EXPECT_NE(std::string(e.what()).find("IQ2_XXS"), std::string::npos) << e.what();
    }
    try {
        dtype_vec_dot_type((dtype)23);
        ADD_FAILURE() << "IQ4_XS has a dot type";
    } catch (const zk::error& e) {
        EXPECT_NE(std::string(e.what()).find("IQ4_XS"), std::string::npos) << e.what();
    }
    EXPECT_THROW(dtype_vec_dot_type(dtype::Q8_1), zk::error);
    EXPECT_THROW(dtype_vec_dot_type(dtype::Q8_K), zk::error);
    EXPECT_THROW(dtype_vec_dot(dtype::Q8_K, buf.data(), buf.data(), 256), zk::error);
    EXPECT_THROW(dtype_vec_dot(dtype::Q4_0, buf.data(), buf.data(), 48), zk::error);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q4_0), dtype::Q8_0);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q4_1), dtype::Q8_1);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q8_0), dtype::Q8_0);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q4_K), dtype::Q8_K);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q6_K), dtype::Q8_K);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q5_0), dtype::Q8_0);
    EXPECT_EQ(dtype_vec_dot_type(dtype::IQ4_NL), dtype::Q8_0);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q5_1), dtype::Q8_1);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q2_K), dtype::Q8_K);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q3_K), dtype::Q8_K);
    EXPECT_EQ(dtype_vec_dot_type(dtype::Q5_K), dtype::Q8_K);
    EXPECT_EQ(dtype_vec_dot_type(dtype::BF16), dtype::F32);
}

// ---------------------------------------------------------------- dot products

// dot(w, a) against the double dot of the dequantized operands. Tolerance:
// 1e-5 of sum |w'||a'| (float accumulation) plus, for Q4_1 and Q5_1, the f16
// rounding of the activation block sums s that multiply the weight mins.
TEST(VecDot, MatchesDequantizedDot) {
    for (dtype t : quant_weight_types()) {
        const dtype at = dtype_vec_dot_type(t);
        for (int64_t n : {256, 512, 1536, 4096}) {
            for (uint32_t seed = 1; seed <= 3; seed++) {
                const auto wrow = random_row(t, n, seed);
                const auto x = random_floats(n, 100 + seed, -2.0f, 2.0f);
                std::vector<uint8_t> arow(dtype_row_size(at, n));
                dtype_quantize_row(at, x.data(), arow.data(), n);
                const auto w = dequant(t, wrow, n);
                const auto a = dequant(at, arow, n);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < n; i++) {
                    ref += (double)w[i] * a[i];
                    mag += std::fabs((double)w[i] * a[i]);
                }
                double tol = 1e-5 * mag + 1e-30;
                if (t == dtype::Q4_1 || t == dtype::Q5_1) {
                    const size_t bs = dtype_get_traits(t).type_size;
                    for (int64_t b = 0; b < n / 32; b++) {
                        // m sits after d in both layouts
                        const uint16_t m = t == dtype::Q4_1 ? ((const block_q4_1*)(wrow.data() + b * bs))->m
                                                            : ((const block_q5_1*)(wrow.data() + b * bs))->m;
                        double s = 0;
                        for (int j = 0; j < 32; j++) s += a[32 * b + j];
                        tol += std::fabs(fp16_to_fp32(m) * s) * std::ldexp(1.0, -10);
                    }
                }
                const float simd = dtype_vec_dot(t, wrow.data(), arow.data(), n);
                const float scalar = quant_dot_ref(t, wrow.data(), arow.data(), n);
                ASSERT_NEAR(simd, ref, tol) << dtype_name(t) << " n " << n << " seed " << seed;
                ASSERT_NEAR(scalar, ref, tol) << dtype_name(t) << " n " << n << " seed " << seed;
                // SIMD and scalar differ only in float summation order.
                ASSERT_NEAR(simd, scalar, 2e-6 * mag + 1e-30) << dtype_name(t) << " n " << n;
            }
        }
    }
}

// The tiled kernel must give, for every (row, token), exactly the single dot.
TEST(VecDot, TileEqualsSingleDots) {
    const int64_t n = 512;
    for (dtype t : quant_weight_types()) {
        const dtype at = dtype_vec_dot_type(t);
        const size_t ws = dtype_row_size(t, n), as = dtype_row_size(at, n);
        std::vector<uint8_t> w, a;
        for (int r = 0; r < k_tile_rows; r++) {
            const auto row = random_row(t, n, 40 + r);
            w.insert(w.end(), row.begin(), row.end());
        }
        for (int k = 0; k < k_tile_toks; k++) {
            const auto x = random_floats(n, 60 + k);
            std::vector<uint8_t> row(as);
            dtype_quantize_row(at, x.data(), row.data(), n);
            a.insert(a.end(), row.begin(), row.end());
        }
        for (int nr = 1; nr <= k_tile_rows; nr++)
            for (int nt = 1; nt <= k_tile_toks; nt++) {
                float y[k_tile_toks][7];
                quant_dot_tile(t, n, w.data(), ws, nr, a.data(), as, nt, &y[0][0], 7);
                for (int k = 0; k < nt; k++)
                    for (int r = 0; r < nr; r++)
                        ASSERT_EQ(y[k][r], dtype_vec_dot(t, w.data() + r * ws, a.data() + k * as, n))
                            << dtype_name(t) << " tile " << nr << "x" << nt << " at " << r << "," << k;
            }
    }
}

TEST(VecDot, ReportsSimdCoverage) {
    for (dtype t : quant_weight_types())
        std::printf("  %-5s dot: %s\n", dtype_name(t), quant_has_simd(t) ? "SIMD" : "scalar");
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    std::printf("  int8 dots use AVX512-VNNI\n");
#elif defined(__AVXVNNI__)
    std::printf("  int8 dots use AVX-VNNI\n");
#endif
}
