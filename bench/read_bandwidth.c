// The machine's read bandwidth, for the decode bound (weights bytes / bandwidth):
// T threads each sum their share of a buffer (2 GiB, or MiB from the second
// argument: a model's weight bytes, which this machine's 480 MiB L3 may partly
// hold between tokens) with AVX2 loads; best of 5. The buffer asks for
// transparent huge pages as zack's packed weights do (engine/model.cpp), or
// keeps 4 KiB pages with `4k` as the third argument.
//   gcc -O2 -mavx2 -pthread bench/read_bandwidth.c -o /tmp/read_bandwidth && /tmp/read_bandwidth 2 [MiB] [huge|4k]
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static float* buf; static size_t n; static int T;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static void* work(void* a) {
    long i = (long)a; size_t b = n / T * i, e = n / T * (i + 1);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t j = b; j < e; j += 32) {
        s0 = _mm256_add_ps(s0, _mm256_load_ps(buf + j)); s1 = _mm256_add_ps(s1, _mm256_load_ps(buf + j + 8));
        s2 = _mm256_add_ps(s2, _mm256_load_ps(buf + j + 16)); s3 = _mm256_add_ps(s3, _mm256_load_ps(buf + j + 24));
    }
    float o[8]; _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return (void*)(long)(o[0] > 1e30);
}
int main(int argc, char** argv) {
    T = argc > 1 ? atoi(argv[1]) : 2;
    const long mib = argc > 2 ? atol(argv[2]) : 2048;
    const char* pages = argc > 3 ? argv[3] : "huge";
    const int huge = strcmp(pages, "huge") == 0;
    if (T < 1 || T > 64 || mib < 1 || mib > (1L << 20) || (!huge && strcmp(pages, "4k") != 0)) {
        fprintf(stderr, "read_bandwidth: usage: read_bandwidth [THREADS 1..64] [MiB 1..1048576] [huge|4k], got %s %s %s\n",
                argc > 1 ? argv[1] : "-", argc > 2 ? argv[2] : "-", pages);
        return 2;
    }
    n = (size_t)mib << 18;  // floats
    n = n / (32 * (size_t)T) * 32 * T;
    const size_t align = huge ? (size_t)2 << 20 : 64;
    buf = aligned_alloc(align, (n * 4 + align - 1) / align * align);
    if (!buf || n == 0) { fprintf(stderr, "read_bandwidth: cannot allocate %ld MiB\n", mib); return 1; }
    if (huge) madvise(buf, n * 4 / align * align, MADV_HUGEPAGE);  /* before the first touch */
    memset(buf, 1, n * 4);
    double best = 0;
    for (int r = 0; r < 5; r++) {
        pthread_t th[64]; double t0 = now();
        for (long i = 0; i < T; i++) pthread_create(&th[i], 0, work, (void*)i);
        for (int i = 0; i < T; i++) pthread_join(th[i], 0);
        double gbs = n * 4 / (now() - t0) / 1e9; if (gbs > best) best = gbs;
    }
    printf("%d threads: %.1f GB/s read (best of 5, %zu MiB, %s pages)\n", T, best, n >> 18, huge ? "huge" : "4 KiB");
}
