// The packed layouts (Q4_K, Q6_K, Q8_0, Q5_0) and their kernels
// (ggml-like/quant_pack.h, quant_tile_k.cpp).
//
// References: the GGUF blocks themselves (packing then unpacking gives the same
// bytes), the Q8_K and Q8_0 quantizers (the packed activations carry the same
// int8 values and scale, and their group sums), quant_dot_ref on the GGUF blocks (the
// packed scalar dot computes the same integer sums in the same float order, so
// it is bit-identical), and the packed scalar dot for the SIMD tiles (they
// differ only in float summation order: tolerance 2e-6 of sum |w_i a_i|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "ggml-like/error.h"
#include "ggml-like/quant_pack.h"
#include "ggml-like/quant_ref.h"
#include "tests/quant_random.h"

using namespace zk;

namespace {

const dtype k_types[] = {dtype::Q4_K, dtype::Q6_K, dtype::Q8_0, dtype::Q5_0};

std::vector<float> random_floats(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v((size_t)n);
    for (auto& x : v) x = u(rng);
    return v;
}

// Random rows (tests/quant_random.h); Q8_0 also gets some -128 codes, which
// its quantizer never writes but a GGUF may hold (the packed code is 0).
std::vector<uint8_t> random_rows(dtype t, int64_t n_rows, int64_t n_cols, uint32_t seed) {
    auto w = quant_random_rows(t, n_rows, n_cols, seed);
    if (t == dtype::Q8_0)
        for (size_t b = 0; b < w.size() / sizeof(block_q8_0); b += 3) ((block_q8_0*)w.data())[b].qs[b % 32] = -128;
    return w;
}

// A 32-byte aligned buffer (the packed kernels' contract).
struct aligned_buf {
    void* p;
    explicit aligned_buf(size_t n) : p(std::aligned_alloc(64, (n + 63) / 64 * 64 + 64)) {}
    ~aligned_buf() { std::free(p); }
    uint8_t* data() const { return (uint8_t*)p; }
};

std::vector<uint8_t> quantize_acts(dtype t, const std::vector<float>& x, int64_t n_tok, int64_t n_cols) {
    const size_t as = quant_pack_act_row_size(t, n_cols);
    std::vector<uint8_t> a(as * n_tok);
    for (int64_t t0 = 0; t0 < n_tok; t0++) quant_pack_quantize(t, x.data() + t0 * n_cols, a.data() + t0 * as, n_cols);
    return a;
}

// Activation i of a packed activation row, dequantized.
double act_value(dtype t, const void* a, int64_t i) {
    if (quant_pack_act_kind(t) == 0) {
        const block_q8_Kp* b = (const block_q8_Kp*)a + i / 256;
        return (double)b->qs[i % 256] * b->d;
    }
    const block_q8_0pa* b = (const block_q8_0pa*)a + i / 32;
    return (double)b->qs[i % 32] * b->d;
}

// sum_i |w_i| |a_i| of one row and one token, from the dequantized operands.
double magnitude(dtype t, const uint8_t* wrow, const void* a, int64_t n_cols) {
    std::vector<float> w((size_t)n_cols);
    dtype_dequantize_row(t, wrow, w.data(), n_cols);
    double m = 0;
    for (int64_t i = 0; i < n_cols; i++) m += std::fabs((double)w[i] * act_value(t, a, i));
    return m;
}

}  // namespace

TEST(QuantPack, PackThenUnpackGivesTheSameBlocksAndFloats) {
    for (dtype t : k_types)
        for (int64_t n_rows : {1, 8, 13, 37}) {
            const int64_t n_cols = 768;
            const auto w = random_rows(t, n_rows, n_cols, 11 + (uint32_t)n_rows);
            aligned_buf p(quant_pack_size(t, n_rows, n_cols));
            const int64_t groups = (n_rows + k_pack_rows - 1) / k_pack_rows;
            EXPECT_EQ(quant_pack_size(t, n_rows, n_cols),
                      (size_t)groups * (size_t)(n_cols / quant_pack_block_elems(t)) * quant_pack_block_bytes(t));
            // in two calls, as threads would
            quant_pack_groups(t, w.data(), n_rows, n_cols, 0, groups / 2, p.data());
            quant_pack_groups(t, w.data(), n_rows, n_cols, groups / 2, groups, p.data());
            const size_t row = dtype_row_size(t, n_cols);
            std::vector<uint8_t> back(row);
            std::vector<float> want((size_t)n_cols), got((size_t)n_cols);
            for (int64_t r = 0; r < n_rows; r++) {
                quant_unpack_row(t, p.data(), n_cols, r, back.data());
                ASSERT_EQ(std::memcmp(back.data(), w.data() + r * row, row), 0)
                    << dtype_name(t) << " rows " << n_rows << " row " << r;
                // the floats of a row read from the packed copy (the embedding of a
                // table tied to a packed output matrix): the GGUF row's, bit for bit
                dtype_dequantize_row(t, w.data() + r * row, want.data(), n_cols);
                std::fill(got.begin(), got.end(), -1.0f);
                quant_pack_dequantize_row(t, p.data(), n_cols, r, got.data());
                ASSERT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * (size_t)n_cols), 0)
                    << dtype_name(t) << " rows " << n_rows << " row " << r << " dequantized";
            }
        }
}

TEST(QuantPack, BadArgumentsThrow) {
    std::vector<uint8_t> buf(1 << 16);
    EXPECT_THROW(quant_pack_block_bytes(dtype::Q4_0), zk::error);
    EXPECT_THROW(quant_pack_groups(dtype::Q4_0, buf.data(), 8, 256, 0, 1, buf.data()), zk::error);
    EXPECT_THROW(quant_pack_groups(dtype::Q4_K, buf.data(), 8, 128, 0, 1, buf.data()), zk::error);
    EXPECT_THROW(quant_pack_groups(dtype::Q8_0, buf.data(), 8, 96, 0, 1, buf.data()), zk::error);
    EXPECT_FALSE(quant_pack_supported(dtype::Q8_0, 96));
    EXPECT_FALSE(quant_pack_supported(dtype::Q4_0, 256));
    std::vector<float> row(256);
    EXPECT_THROW(quant_pack_dequantize_row(dtype::Q4_0, buf.data(), 256, 0, row.data()), zk::error);
    std::vector<float> x(300);
    EXPECT_THROW(quant_pack_quantize(dtype::Q4_K, x.data(), buf.data(), 300), zk::error);
    EXPECT_THROW(quant_pack_quantize(dtype::Q8_0, x.data(), buf.data(), 300), zk::error);
}

// The packed activations hold Q8_K's values and scale, and their group sums;
// the SIMD quantizer writes the reference's bytes, ties and extremes included.
TEST(QuantPack, ActivationsAreQ8KWithSums) {
    const int64_t n = 256 * 6;
    auto x = random_floats(n, 3, -3.0f, 3.0f);
    for (int j = 0; j < 256; j++) x[256 + j] = 0.0f;              // block 1: all zero
    x[512 + 7] = -5.0f, x[512 + 100] = 5.0f;                       // block 2: tie, the first (negative) wins
    x[768 + 9] = 4.0f, x[768 + 200] = -4.0f;                       // block 3: tie, the first (positive) wins
    // block 4: scale 1 (max -128), the others exact halves: round to even, 127.5 clamps to 127
    x[1024] = -128.0f;
    for (int j = 1; j < 256; j++) x[1024 + j] = (float)(j - 128) + 0.5f;
    std::vector<uint8_t> ref(quant_pack_act_row_size(dtype::Q4_K, n)), got(ref.size(), 0xAA);
    quant_pack_quantize_ref(dtype::Q4_K, x.data(), ref.data(), n);
    quant_pack_quantize(dtype::Q4_K, x.data(), got.data(), n);
    ASSERT_EQ(std::memcmp(ref.data(), got.data(), ref.size()), 0);
    std::vector<block_q8_K> k(n / 256);
    quant_quantize_ref(dtype::Q8_K, x.data(), k.data(), n);
    const auto* b = (const block_q8_Kp*)got.data();
    for (int64_t ib = 0; ib < n / 256; ib++) {
        ASSERT_EQ(std::memcmp(b[ib].qs, k[ib].qs, 256), 0) << "block " << ib;
        ASSERT_EQ(b[ib].d, k[ib].d) << "block " << ib;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int j = 0; j < 16; j++) s += b[ib].qs[16 * g + j];
            ASSERT_EQ(b[ib].s16[g], s);
            ASSERT_EQ(b[ib].n16[g], -32 * s);
        }
        for (int q = 0; q < 8; q++) ASSERT_EQ(b[ib].s32[q], b[ib].s16[2 * q] + b[ib].s16[2 * q + 1]);
    }
    EXPECT_EQ(b[2].qs[7], -128);
    EXPECT_EQ(b[2].qs[100], 127);
    EXPECT_EQ(b[3].qs[9], -128);
    EXPECT_EQ(b[1].d, 0.0f);
    EXPECT_EQ(b[4].qs[1], -126);  // -126.5
    EXPECT_EQ(b[4].qs[2], -126);  // -125.5
    EXPECT_EQ(b[4].qs[255], 127);
}

// The activations of the packed Q8_0 / Q5_0 kernels hold Q8_0's values and
// scale (so the reference dots' arithmetic), and -16 and -128 times the sums.
TEST(QuantPack, ActivationsAreQ8_0WithSums) {
    const int64_t n = 32 * 13;  // not a multiple of 256: a partial last chunk
    auto x = random_floats(n, 4, -3.0f, 3.0f);
    for (int j = 0; j < 32; j++) x[64 + j] = 0.0f;  // block 2: all zero
    for (dtype t : {dtype::Q8_0, dtype::Q5_0}) {
        ASSERT_EQ(quant_pack_act_kind(t), 1);
        std::vector<uint8_t> ref(quant_pack_act_row_size(t, n)), got(ref.size(), 0xAA);
        ASSERT_EQ(ref.size(), (size_t)(n / 32) * sizeof(block_q8_0pa));
        quant_pack_quantize_ref(t, x.data(), ref.data(), n);
        quant_pack_quantize(t, x.data(), got.data(), n);
        ASSERT_EQ(std::memcmp(ref.data(), got.data(), ref.size()), 0) << dtype_name(t);
        std::vector<block_q8_0> q(n / 32);
        quant_quantize_ref(dtype::Q8_0, x.data(), q.data(), n);
        const auto* b = (const block_q8_0pa*)got.data();
        for (int64_t ib = 0; ib < n / 32; ib++) {
            ASSERT_EQ(std::memcmp(b[ib].qs, q[ib].qs, 32), 0) << "block " << ib;
            ASSERT_EQ(b[ib].d, fp16_to_fp32(q[ib].d)) << "block " << ib;
            int s = 0;
            for (int j = 0; j < 32; j++) s += q[ib].qs[j];
            ASSERT_EQ(b[ib].n16, -16 * s);
            ASSERT_EQ(b[ib].n128, -128 * s);
        }
        EXPECT_EQ(b[2].d, 0.0f);
    }
}

// The packed scalar dot is quant_dot_ref on the GGUF row, bit for bit.
TEST(QuantPack, ScalarDotEqualsGgufReference) {
    for (dtype t : k_types) {
        const int64_t n_rows = 11, n_cols = 512;
        const auto w = random_rows(t, n_rows, n_cols, 21);
        aligned_buf p(quant_pack_size(t, n_rows, n_cols));
        quant_pack_groups(t, w.data(), n_rows, n_cols, 0, (n_rows + k_pack_rows - 1) / k_pack_rows, p.data());
        const auto x = random_floats(n_cols, 22, -2.0f, 2.0f);
        const auto a = quantize_acts(t, x, 1, n_cols);
        // the reference's activations: Q8_K for the K-quants, Q8_0 for Q8_0 / Q5_0
        const dtype at = dtype_vec_dot_type(t);
        std::vector<uint8_t> k(dtype_row_size(at, n_cols));
        quant_quantize_ref(at, x.data(), k.data(), n_cols);
        const size_t gb = quant_pack_size(t, k_pack_rows, n_cols), row = dtype_row_size(t, n_cols);
        for (int64_t r = 0; r < n_rows; r++)
            ASSERT_EQ(quant_pack_dot_ref(t, n_cols, p.data() + (r / k_pack_rows) * gb, (int)(r % k_pack_rows), a.data()),
                      quant_dot_ref(t, w.data() + r * row, k.data(), n_cols))
                << dtype_name(t) << " row " << r;
    }
}

// Every tile shape against the packed scalar dot; and each output is the same
// number whatever the tile (tokens alone vs four together, rows cut short).
TEST(QuantPack, TilesMatchScalarAndEachOther) {
    for (dtype t : k_types)
        for (int64_t n_cols : {256, 1536}) {
            const int64_t n_rows = k_pack_rows, n_tok = k_pack_toks;
            const auto w = random_rows(t, n_rows, n_cols, 31 + (uint32_t)n_cols);
            aligned_buf p(quant_pack_size(t, n_rows, n_cols));
            quant_pack_groups(t, w.data(), n_rows, n_cols, 0, 1, p.data());
            const auto a = quantize_acts(t, random_floats(n_tok * n_cols, 32, -2.0f, 2.0f), n_tok, n_cols);
            const size_t as = quant_pack_act_row_size(t, n_cols), row = dtype_row_size(t, n_cols);
            float single[k_pack_toks][k_pack_rows];
            for (int k = 0; k < n_tok; k++) {
                quant_pack_tile(t, n_cols, p.data(), k_pack_rows, a.data() + k * as, as, 1, single[k], 0, nullptr);
                // the decode path's prefetches (here of the group itself) change no output
                float pf[k_pack_rows];
                quant_pack_tile(t, n_cols, p.data(), k_pack_rows, a.data() + k * as, as, 1, pf, 0, p.data());
                ASSERT_EQ(std::memcmp(pf, single[k], sizeof pf), 0) << dtype_name(t) << " token " << k;
            }
            for (int k = 0; k < n_tok; k++)
                for (int r = 0; r < k_pack_rows; r++) {
                    const uint8_t* ak = a.data() + k * as;
                    const float ref = quant_pack_dot_ref(t, n_cols, p.data(), r, ak);
                    ASSERT_NEAR(single[k][r], ref, 2e-6 * magnitude(t, w.data() + r * row, ak, n_cols))
                        << dtype_name(t) << " n_cols " << n_cols << " row " << r << " token " << k;
                }
            for (int nr = 1; nr <= k_pack_rows; nr++)
                for (int nt = 1; nt <= k_pack_toks; nt++)
                    for (int k0 = 0; k0 + nt <= n_tok; k0++) {
                        float y[k_pack_toks][k_pack_rows + 3];
                        for (auto& yy : y)
                            for (float& v : yy) v = -7.0f;
                        quant_pack_tile(t, n_cols, p.data(), nr, a.data() + k0 * as, as, nt, &y[0][0], k_pack_rows + 3,
                                        nullptr);
                        for (int k = 0; k < k_pack_toks; k++)
                            for (int r = 0; r < k_pack_rows + 3; r++) {
                                if (k < nt && r < nr)
                                    ASSERT_EQ(y[k][r], single[k0 + k][r])
                                        << dtype_name(t) << " tile " << nr << "x" << nt << " at " << r << "," << k;
                                else
                                    ASSERT_EQ(y[k][r], -7.0f) << "wrote outside the tile at " << r << "," << k;
                            }
                    }
        }
}

TEST(QuantPack, ReportsSimdCoverage) {
    for (dtype t : k_types)
        std::printf("  %-5s packed kernel: %s\n", dtype_name(t), quant_pack_supported(t, 256) ? "SIMD" : "none (row kernels)");
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    std::printf("  4-byte dots use AVX512-VNNI\n");
#elif defined(__AVXVNNI__)
    std::printf("  4-byte dots use AVX-VNNI\n");
#else
    std::printf("  4-byte dots use AVX2 maddubs with int16 sums\n");
#endif
}
