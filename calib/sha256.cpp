#include "calib/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ggml-like/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define ZK_SHA256_X86 1
#endif

namespace zk {

namespace {

// First 32 bits of the fractional parts of the cube roots of the first 64 primes.
constexpr uint32_t k_round[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

// The compression function in plain C++: n blocks of 64 bytes into h[8].
void blocks_portable(uint32_t* h_, const uint8_t* p, size_t n) {
    for (; n > 0; n--, p += 64) {
        uint32_t w[64];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
        for (int i = 16; i < 64; i++) {
            const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
            const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
        for (int i = 0; i < 64; i++) {
            const uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
            const uint32_t ch = (e & f) ^ (~e & g);
            const uint32_t t1 = h + S1 + ch + k_round[i] + w[i];
            const uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
            const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
            const uint32_t t2 = S0 + maj;
            h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
        }
        h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
    }
}

#ifdef ZK_SHA256_X86
// The same on the SHA extensions. sha256rnds2 does two rounds on a state split
// in two registers, {F, E, B, A} and {H, G, D, C} (lane 0 first), with W + K of
// the two rounds in the low lanes of its third operand; sha256msg1 / msg2 give
// the next four schedule words from the previous sixteen:
//   W[t..t+3] = msg2(msg1(W[t-16..], W[t-12..]) + W[t-7..t-4], W[t-4..t-1]).
__attribute__((target("sha,sse4.1,ssse3"))) void blocks_shani(uint32_t* h, const uint8_t* p, size_t n) {
    // big-endian words: bytes reversed within each 32-bit lane
    const __m128i bswap = _mm_setr_epi8(3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8, 15, 14, 13, 12);
    const __m128i abcd = _mm_loadu_si128((const __m128i*)h), efgh = _mm_loadu_si128((const __m128i*)(h + 4));
    const __m128i badc = _mm_shuffle_epi32(abcd, 0xB1), hgfe = _mm_shuffle_epi32(efgh, 0x1B);
    __m128i s0 = _mm_alignr_epi8(badc, hgfe, 8);     // {f, e, b, a}
    __m128i s1 = _mm_blend_epi16(hgfe, badc, 0xF0);  // {h, g, d, c}
    for (; n > 0; n--, p += 64) {
        const __m128i save0 = s0, save1 = s1;
        __m128i m[4];
        for (int i = 0; i < 4; i++) m[i] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i*)(p + 16 * i)), bswap);
        for (int i = 0; i < 16; i++) {
            __m128i& w = m[i & 3];  // W[4i .. 4i + 3]
            if (i >= 4) {
                // m[i & 3] holds W[4i - 16 ..]; the others W[4i - 12 ..], W[4i - 8 ..], W[4i - 4 ..]
                const __m128i w12 = m[(i + 1) & 3], w8 = m[(i + 2) & 3], w4 = m[(i + 3) & 3];
                const __m128i t = _mm_add_epi32(_mm_sha256msg1_epu32(w, w12), _mm_alignr_epi8(w4, w8, 4));
                w = _mm_sha256msg2_epu32(t, w4);
            }
            __m128i wk = _mm_add_epi32(w, _mm_loadu_si128((const __m128i*)(k_round + 4 * i)));
            s1 = _mm_sha256rnds2_epu32(s1, s0, wk);  // rounds 4i, 4i + 1: s1 becomes {F, E, B, A}
            wk = _mm_shuffle_epi32(wk, 0x0E);
            s0 = _mm_sha256rnds2_epu32(s0, s1, wk);  // rounds 4i + 2, 4i + 3
        }
        s0 = _mm_add_epi32(s0, save0);
        s1 = _mm_add_epi32(s1, save1);
    }
    const __m128i abef = _mm_shuffle_epi32(s0, 0x1B), ghcd = _mm_shuffle_epi32(s1, 0xB1);  // {a,b,e,f}, {g,h,c,d}
    _mm_storeu_si128((__m128i*)h, _mm_blend_epi16(abef, ghcd, 0xF0));
    _mm_storeu_si128((__m128i*)(h + 4), _mm_alignr_epi8(ghcd, abef, 8));
}
#endif

}  // namespace

bool sha256_cpu_has_shani() {
#ifdef ZK_SHA256_X86
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || __get_cpuid_max(0, nullptr) < 7) return false;
    const bool sse41 = (c >> 19) & 1u, ssse3 = (c >> 9) & 1u;
    unsigned b7 = 0, c7 = 0, d7 = 0;
    __cpuid_count(7, 0, a, b7, c7, d7);
    return sse41 && ssse3 && ((b7 >> 29) & 1u);
#else
    return false;
#endif
}

sha256::sha256(bool shani) : shani_(shani && sha256_cpu_has_shani()) {
    // First 32 bits of the fractional parts of the square roots of the first 8 primes.
    const uint32_t init[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                              0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    std::memcpy(h_, init, sizeof h_);
}

void sha256::blocks(const uint8_t* p, size_t n) {
#ifdef ZK_SHA256_X86
    if (shani_) return blocks_shani(h_, p, n);
#endif
    blocks_portable(h_, p, n);
}

void sha256::update(const void* data, size_t n) {
    const uint8_t* p = (const uint8_t*)data;
    total_ += n;
    if (buf_len_) {
        const size_t take = std::min(n, 64 - buf_len_);
        std::memcpy(buf_ + buf_len_, p, take);
        buf_len_ += take;
        p += take;
        n -= take;
        if (buf_len_ < 64) return;
        blocks(buf_, 1);
        buf_len_ = 0;
    }
    blocks(p, n / 64);
    p += n / 64 * 64;
    n %= 64;
    std::memcpy(buf_, p, n);
    buf_len_ = n;
}

std::string sha256::final_hex() {
    // Padding: 0x80, zeros, then the message length in bits as a big-endian u64.
    const uint64_t bits = total_ * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (buf_len_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    update(len, 8);
    ZK_ASSERT(buf_len_ == 0);
    static const char* hex = "0123456789abcdef";
    std::string out;
    for (uint32_t v : h_)
        for (int s = 28; s >= 0; s -= 4) out += hex[(v >> s) & 15];
    return out;
}

std::string sha256_hex(const void* data, size_t n) {
    sha256 h;
    h.update(data, n);
    return h.final_hex();
}

std::string sha256_file_hex(const std::string& path) {
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) ZK_THROW("%s: cannot open for hashing: %s", path.c_str(), std::strerror(errno));
    sha256 h;
    std::vector<uint8_t> buf(1 << 20);
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), n);
    const bool bad = std::ferror(f);
    std::fclose(f);
    if (bad) ZK_THROW("%s: read error while hashing", path.c_str());
    return h.final_hex();
}

}  // namespace zk
