// Experiment (not built by CMake, not product code): would Q6_K weights
// repacked at load time to one byte a code decode faster than the packed 6-bit
// layout on an AVX2 machine without VNNI? (bench/RESULTS.md, 2026-12-05 night.)
// The 2026-12-05 afternoon entry read the Q6_K mat-vec as bound by its
// unpacking (17 vector operations for 4 maddubs); one byte a code needs none,
// for 29% more bytes (274 against 212 a row and block).
//
// Both kernels here are the AVX2 policy of ggml-like/quant_tile_k.cpp for one
// token and 8-row groups (maddubs pairs, two chunks an int16 sum, the -32
// offset through the group sums), over random codes (the scales' values do
// not change the time); 8 matrices of [ROWS x COLS] in turn so that the
// weights come from DRAM, the row groups split over THREADS threads.
//
//   c++ -O2 -mavx2 -mfma -mf16c -std=c++17 bench/experiments/q6k_bytes.cpp -o /tmp/q6k_bytes -lpthread
//   /tmp/q6k_bytes 1536 8960 2 [PF]   # ROWS COLS THREADS (ffn_down of Qwen2.5-Coder-1.5B)
// PF: how far ahead (bytes) each block's lines are prefetched into L2; -1 (the
// default) 4 blocks of the kernel's own layout, 0 none.
#include <immintrin.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

namespace {

// quant_pack.h's block_q6_Kp (8 rows) and the byte-code alternative
struct blk6 {
    uint8_t ql[32][8][4];
    uint8_t qh[16][8][4];
    int8_t sc[16][8];
    uint16_t d[8];
    uint8_t pad[16];
};
struct blkb {
    uint8_t qs[64][8][4];  // codes 0..63, element 16n + 4j + b of row r at qs[4n + j][r][b]
    int8_t sc[16][8];
    uint16_t d[8];
};
// quant_pack.h's block_q8_Kp
struct act {
    int8_t qs[256];
    float d;
    int16_t s32[8];
    int16_t s16[16];
    int32_t n16[16];
    uint8_t pad[12];
};

__m256i bcast(const void* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
__m256i scale_pairs(const int8_t* p) {  // (sc, sc) int16 pairs a row
    const __m256i x = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p));
    return _mm256_blend_epi16(x, _mm256_slli_epi32(x, 16), 0xAA);
}
__m256i group_pairs(const int8_t* a, const int8_t* b) {
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i*)a), _mm_loadl_epi64((const __m128i*)b)));
}
long prefetch_ahead = -1;  // PF
template <class B>
void prefetch(const B* b) {
    if (prefetch_ahead == 0) return;
    const char* p = (const char*)b + (prefetch_ahead < 0 ? 4 * (long)sizeof(B) : prefetch_ahead);
    for (size_t k = 0; k < sizeof(B); k += 64) _mm_prefetch(p + k, _MM_HINT_T1);
}

// the -32 offset of the codes and the block's scale, as tile_q6_K
template <class B>
__m256 finish(const B& p, const act& x, __m256i isum, __m256 acc) {
    for (int q = 0; q < 8; q++)
        isum = _mm256_sub_epi32(
            isum, _mm256_slli_epi32(_mm256_madd_epi16(group_pairs(p.sc[2 * q], p.sc[2 * q + 1]), bcast(x.s16 + 2 * q)), 5));
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p.d));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, _mm256_set1_ps(x.d)), acc);
}

__attribute__((noinline)) __m256 dot_6bit(int nb, const blk6* w, const act* x) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x03), m2s2 = _mm256_set1_epi8(0x0C),
                  m2s4 = _mm256_set1_epi8(0x30);
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const blk6& p = w[ib];
        prefetch(w + ib);
        __m256i isum = _mm256_setzero_si256();
        for (int n = 0; n < 16; n++) {
            const __m256i h = _mm256_loadu_si256((const __m256i*)p.qh[n]);
            const __m256i l0 = _mm256_loadu_si256((const __m256i*)p.ql[2 * n]);
            const __m256i l1 = _mm256_loadu_si256((const __m256i*)p.ql[2 * n + 1]);
            const __m256i c0 = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            const __m256i c1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                               _mm256_slli_epi16(_mm256_and_si256(h, m2s2), 2));
            const __m256i c2 = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_and_si256(h, m2s4));
            const __m256i c3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                               _mm256_and_si256(_mm256_srli_epi16(h, 2), m2s4));
            const __m256i sc = scale_pairs(p.sc[n]);
            const int8_t* xq = x[ib].qs + 16 * n;
            const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(c0, bcast(xq)), _mm256_maddubs_epi16(c1, bcast(xq + 4)));
            const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(c2, bcast(xq + 8)), _mm256_maddubs_epi16(c3, bcast(xq + 12)));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(_mm256_madd_epi16(s0, sc), _mm256_madd_epi16(s1, sc)));
        }
        acc = finish(p, x[ib], isum, acc);
    }
    return acc;
}

__attribute__((noinline)) __m256 dot_bytes(int nb, const blkb* w, const act* x) {
    __m256 acc = _mm256_setzero_ps();
    for (int ib = 0; ib < nb; ib++) {
        const blkb& p = w[ib];
        prefetch(w + ib);
        __m256i isum = _mm256_setzero_si256();
        for (int n = 0; n < 16; n++) {
            const __m256i sc = scale_pairs(p.sc[n]);
            const int8_t* xq = x[ib].qs + 16 * n;
            auto code = [&](int j) { return _mm256_loadu_si256((const __m256i*)p.qs[4 * n + j]); };
            const __m256i s0 = _mm256_add_epi16(_mm256_maddubs_epi16(code(0), bcast(xq)), _mm256_maddubs_epi16(code(1), bcast(xq + 4)));
            const __m256i s1 = _mm256_add_epi16(_mm256_maddubs_epi16(code(2), bcast(xq + 8)), _mm256_maddubs_epi16(code(3), bcast(xq + 12)));
            isum = _mm256_add_epi32(isum, _mm256_add_epi32(_mm256_madd_epi16(s0, sc), _mm256_madd_epi16(s1, sc)));
        }
        acc = finish(p, x[ib], isum, acc);
    }
    return acc;
}

template <class B>
void randomize(std::vector<B>& v, std::mt19937& g, uint8_t mask) {
    for (B& b : v) {
        for (uint8_t* q = (uint8_t*)&b; q < (uint8_t*)&b + sizeof b; q++) *q = (uint8_t)(g() & mask);
        std::memset(b.d, 0, sizeof b.d);
    }
}

}  // namespace

int main(int argc, char** argv) {
    const int rows = argc > 1 ? std::atoi(argv[1]) : 1536, cols = argc > 2 ? std::atoi(argv[2]) : 8960;
    const int nth = argc > 3 ? std::atoi(argv[3]) : 2;
    prefetch_ahead = argc > 4 ? std::atol(argv[4]) : -1;
    if (rows <= 0 || rows % 8 || cols <= 0 || cols % 256 || nth <= 0) {
        std::fprintf(stderr, "q6k_bytes: ROWS a multiple of 8, COLS of 256, THREADS > 0\n");
        return 2;
    }
    const int nb = cols / 256, ng = rows / 8, n_mats = 8;
    const size_t per_mat = (size_t)ng * nb;
    std::mt19937 g(1);
    // room past the last matrix for the prefetches (up to 64 KiB ahead)
    std::vector<blk6> w6(per_mat * n_mats + 64 * 1024 / sizeof(blk6) + 8);
    std::vector<blkb> wb(per_mat * n_mats + 64 * 1024 / sizeof(blkb) + 8);
    randomize(w6, g, 0xFF);
    randomize(wb, g, 0x3F);
    std::vector<act> x(nb);
    for (act& a : x) {
        for (int i = 0; i < 256; i++) a.qs[i] = (int8_t)g();
        a.d = 1.0f;
    }
    float sink = 0;
    for (int round = 0; round < 6; round++)
        for (int bytes = 0; bytes < 2; bytes++) {
            const int iters = 40;
            const auto t0 = std::chrono::steady_clock::now();
            for (int it = 0; it < iters; it++) {
                const size_t m = (size_t)(it % n_mats) * per_mat;
                std::vector<float> part(nth);
                std::vector<std::thread> th;
                for (int t = 0; t < nth; t++)
                    th.emplace_back([&, t] {
                        float s = 0;
                        for (int gr = t; gr < ng; gr += nth) {
                            const size_t o = m + (size_t)gr * nb;
                            s += _mm256_cvtss_f32(bytes ? dot_bytes(nb, &wb[o], x.data()) : dot_6bit(nb, &w6[o], x.data()));
                        }
                        part[t] = s;
                    });
                for (auto& t : th) t.join();
                for (float p : part) sink += p;
            }
            const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / iters;
            const double b = (double)per_mat * (bytes ? sizeof(blkb) : sizeof(blk6));
            std::printf("%-6s %8.0f us  %5.2f GB/s  %5.2f G multiply-adds/s\n", bytes ? "bytes" : "6-bit", us, b / us / 1e3,
                        (double)rows * cols / us / 1e3);
        }
    return sink == 12345.0f;  // keeps the sums live
}
