// Experiment (not built by CMake, not product code): how many 256-bit vector
// operations of each kind a thread of this machine completes per clock, alone
// and with the second vCPU busy, to say what bounds the K-quant decode
// mat-vecs here (bench/RESULTS.md, 2026-12-05, late night). The tile kernels'
// inner step is a vpmaddubsw and a vpaddw (32 multiply-adds); a Q4_K block
// of 8 rows x 64 weights takes 2 of them, a Q6_K one of 8 x 16 takes 4/4 plus
// 2 vpmaddwd for its scales. (This VM reports CPU family 23 model 1, which
// is also the generic "EPYC" model a hypervisor shows: the probe measures
// what the model number cannot say.)
//
// Each probe runs six independent accumulator chains in registers, per
// thread, THREADS threads at once; a chain's own latency (one or two clocks,
// four or five for the FMA) would allow six chains more than this machine
// measures, so the rates are throughputs. The clock is measured the same way:
// four dependent scalar adds an iteration (one a clock on x86 cores).
//
//   c++ -O2 -mavx2 -mfma -std=c++17 -pthread bench/experiments/vector_pipes.cpp -o /tmp/vector_pipes
//   /tmp/vector_pipes [THREADS]
#include <immintrin.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Scalar adds a second, one dependent chain: the clock.
double clock_hz(long iters) {
    long x = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < iters; i++) __asm__ volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
    return iters * 4.0 / seconds_since(t0);
}

// Six chains s_k = op(s_k, a_k, b): six distinct inputs a_k (so no operation
// is shared between chains), all in registers (13 of the 16 ymm registers),
// hidden from the compiler each iteration so nothing is hoisted. Returns
// operations a second.
template <class Op>
double rate(long iters, Op op) {
    __m256i b = _mm256_set1_epi8(5);
    __m256i a0 = _mm256_set1_epi8(1), a1 = _mm256_set1_epi8(2), a2 = _mm256_set1_epi8(3);
    __m256i a3 = _mm256_set1_epi8(4), a4 = _mm256_set1_epi8(6), a5 = _mm256_set1_epi8(7);
    __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0, s4 = s0, s5 = s0;
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < iters; i++) {
        s0 = op(s0, a0, b), s1 = op(s1, a1, b), s2 = op(s2, a2, b);
        s3 = op(s3, a3, b), s4 = op(s4, a4, b), s5 = op(s5, a5, b);
        __asm__ volatile("" : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5));
    }
    const double dt = seconds_since(t0);
    const __m256i t = _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(s0, s1), _mm256_xor_si256(s2, s3)),
                                       _mm256_xor_si256(s4, s5));
    volatile int sink = _mm256_extract_epi32(t, 0);
    (void)sink;
    return iters * 6.0 / dt;
}

struct result {
    double hz, maddubs, madd, fma, xor_and, add_srl;
};

result probe() {
    result r;
    r.hz = clock_hz(300000000);
    const long n = 100000000;
    // vpmaddubsw + vpaddw: the tile kernels' inner step
    r.maddubs = rate(n, [](__m256i s, __m256i a, __m256i b) { return _mm256_add_epi16(s, _mm256_maddubs_epi16(a, b)); });
    r.madd = rate(n, [](__m256i s, __m256i a, __m256i b) { return _mm256_add_epi32(s, _mm256_madd_epi16(a, b)); });
    r.fma = rate(n, [](__m256i s, __m256i a, __m256i b) {
        return _mm256_castps_si256(
            _mm256_fmadd_ps(_mm256_castsi256_ps(a), _mm256_castsi256_ps(b), _mm256_castsi256_ps(s)));
    });
    r.xor_and = rate(n, [](__m256i s, __m256i a, __m256i b) { return _mm256_and_si256(_mm256_xor_si256(s, a), b); });
    r.add_srl = rate(n, [](__m256i s, __m256i a, __m256i) { return _mm256_srli_epi16(_mm256_add_epi16(s, a), 1); });
    return r;
}

}  // namespace

int main(int argc, char** argv) {
    const int T = argc > 1 ? std::atoi(argv[1]) : 1;
    std::printf("| threads | clock GHz | maddubs+add /clock | madd+add /clock | fma /clock | xor+and /clock | add+srl /clock |\n");
    std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
    for (int round = 0; round < 3; round++) {
        std::vector<result> r(T);
        std::vector<std::thread> th;
        for (int t = 0; t < T; t++) th.emplace_back([&r, t] { r[t] = probe(); });
        for (auto& x : th) x.join();
        // operations a clock of each thread, summed over the threads (whether the
        // two vCPUs share a core is what the 1- and 2-thread rows compare)
        result s{};
        for (const result& x : r) {
            s.hz += x.hz / T;
            s.maddubs += x.maddubs / x.hz;
            s.madd += x.madd / x.hz;
            s.fma += x.fma / x.hz;
            s.xor_and += x.xor_and / x.hz;
            s.add_srl += x.add_srl / x.hz;
        }
        std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f |\n", T, s.hz / 1e9, s.maddubs, s.madd, s.fma,
                    s.xor_and, s.add_srl);
    }
}
