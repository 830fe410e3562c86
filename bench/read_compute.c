// Why a decode mat-vec falls short of bench/read_bandwidth.c: a stream read with
// arithmetic between its blocks. T threads each read their share of a buffer in
// blocks of 2304 bytes (36 lines, about one packed Q4_K block), doing FMAS
// multiply-adds a line, and software-prefetch each block PF bytes ahead (T1)
// either all at the top of the block ("burst", as the packed kernels did) or a
// line at a time between the arithmetic ("spread", as they do now:
// ggml-like/quant_tile_k.cpp). Huge pages, as zack's packed weights; best of 5.
// Prints GB/s and ns a block a thread. On the 2026-12-06 Xeon (bench/RESULTS.md)
// memory time and compute time added in the burst form and overlapped spread.
//   gcc -O2 -mavx2 -mfma -pthread bench/read_compute.c -o /tmp/read_compute
//   /tmp/read_compute THREADS MiB FMAS PF burst|spread
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { BLOCK = 2304 };
static char* buf;
static size_t n;
static int T, FMAS, PF, SPREAD;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static void* work(void* arg) {
    const long i = (long)arg;
    const size_t b = n / T * i, e = n / T * (i + 1);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, c[8];
    for (int k = 0; k < 8; k++) c[k] = _mm256_set1_ps(1.0f + k * 1e-3f);
    const __m256 m = _mm256_set1_ps(0.9999f);
    for (size_t j = b; j + BLOCK <= e; j += BLOCK) {
        if (PF && !SPREAD)
            for (int k = 0; k < BLOCK; k += 64) _mm_prefetch(buf + j + PF + k, _MM_HINT_T1);
        for (int k = 0; k < BLOCK; k += 64) {  // the block's loads, a line at a time
            s0 = _mm256_add_ps(s0, _mm256_load_ps((const float*)(buf + j + k)));
            s1 = _mm256_add_ps(s1, _mm256_load_ps((const float*)(buf + j + k + 32)));
            if (SPREAD) {
                if (PF) _mm_prefetch(buf + j + PF + k, _MM_HINT_T1);
                for (int r = 0; r < FMAS; r++) c[(k / 64 + r) & 7] = _mm256_fmadd_ps(c[(k / 64 + r) & 7], m, s0);
            }
        }
        if (!SPREAD)  // the same multiply-adds after the loads
            for (int k = 0; k < BLOCK; k += 64)
                for (int r = 0; r < FMAS; r++) c[(k / 64 + r) & 7] = _mm256_fmadd_ps(c[(k / 64 + r) & 7], m, s0);
    }
    for (int k = 1; k < 8; k++) c[0] = _mm256_add_ps(c[0], c[k]);
    float o[8];
    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_add_ps(s0, s1), c[0]));
    return (void*)(long)(o[0] > 1e30f);
}

int main(int argc, char** argv) {
    if (argc != 6 || (strcmp(argv[5], "burst") != 0 && strcmp(argv[5], "spread") != 0)) {
        fprintf(stderr, "read_compute: usage: read_compute THREADS MiB FMAS PF burst|spread\n");
        return 2;
    }
    T = atoi(argv[1]);
    const long mib = atol(argv[2]);
    FMAS = atoi(argv[3]);
    PF = atoi(argv[4]);
    SPREAD = strcmp(argv[5], "spread") == 0;
    if (T < 1 || T > 64 || mib < 1 || mib > (1L << 20) || FMAS < 0 || FMAS > 64 || PF < 0 || PF > (1 << 20)) {
        fprintf(stderr, "read_compute: THREADS 1..64, MiB 1..1048576, FMAS 0..64, PF 0..1048576 bytes\n");
        return 2;
    }
    n = (size_t)mib << 20;
    const size_t align = (size_t)2 << 20, bytes = (n + PF + align - 1) / align * align;  // PF past the end stays readable
    buf = aligned_alloc(align, bytes);
    if (!buf) { fprintf(stderr, "read_compute: cannot allocate %ld MiB\n", mib); return 1; }
    madvise(buf, bytes, MADV_HUGEPAGE);  // before the first touch
    memset(buf, 1, bytes);
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        pthread_t th[64];
        const double t0 = now();
        for (long i = 0; i < T; i++) pthread_create(&th[i], 0, work, (void*)i);
        for (int i = 0; i < T; i++) pthread_join(th[i], 0);
        const double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%d threads, %d FMAs a line, prefetch %d bytes ahead, %s: %.1f GB/s, %.1f ns a block a thread\n", T, FMAS,
           PF, SPREAD ? "spread" : "burst", (double)n / best / 1e9, best / (double)(n / T / BLOCK) * 1e9);
    return 0;
}
