// Measured, not built (bench/RESULTS.md, 2026-12-06 "softmax in 512-bit"):
// can a compute-bound phase (decode attention) hide the next weights' DRAM
// reads by prefetching them? Two threads model a layer of decode: phase A,
// ~300 us of dependent FMAs (the attention's compute) issuing prefetcht1 for
// PF bytes spread evenly over it, each thread the start of the region it reads
// next; phase B, each thread streams its half of a 37 MiB region (a layer of
// the 1.5B's weights) as the mat-vecs do. If the prefetched lines survive (in
// L2, or in L3 after L2 evicts them), B shortens by about PF / bandwidth.
//   gcc -O2 -march=native -pthread bench/experiments/prefetch_overlap.c -o /tmp/po
//   for pf in 0 1 2 3 4; do /tmp/po $pf; done      (PF in MiB)
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { NT = 2, LAYERS = 56 };
static const size_t k_weights = (size_t)1 << 30, k_layer = (size_t)37 << 20;
static char* weights;
static size_t pf_bytes;
static pthread_barrier_t barrier;
static double phase_a[NT], phase_b[NT];
static volatile float sink[NT * 16];

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* layer_loop(void* arg) {
    const int t = (int)(long)arg;
    size_t off = 0;
    __m256 acc = _mm256_set1_ps(1.0f);
    const __m256 m = _mm256_set1_ps(0.999999f);
    __m256i x = _mm256_setzero_si256();
    double ta = 0, tb = 0;
    for (int l = 0; l < LAYERS; l++) {
        pthread_barrier_wait(&barrier);
        const double t0 = seconds();
        const char* mine = weights + off + k_layer / NT * t;  // what this thread streams next
        const size_t lines = pf_bytes / NT / 64;
        const int iters = 200000, every = lines ? (int)(iters / lines) : 0;
        size_t line = 0;
        int count = 0;
        for (int i = 0; i < iters; i++) {
            acc = _mm256_fmadd_ps(acc, m, m);
            if (lines && --count <= 0 && line < lines) {
                count = every > 0 ? every : 1;
                _mm_prefetch(mine + 64 * line++, _MM_HINT_T1);
            }
        }
        pthread_barrier_wait(&barrier);
        const double t1 = seconds();
        const __m256i* p = (const __m256i*)mine;
        for (size_t i = 0; i < k_layer / NT / 32; i += 2) {
            _mm_prefetch((const char*)(p + i) + 4096, _MM_HINT_T1);
            x = _mm256_add_epi32(x, _mm256_add_epi32(_mm256_load_si256(p + i), _mm256_load_si256(p + i + 1)));
        }
        pthread_barrier_wait(&barrier);
        ta += t1 - t0, tb += seconds() - t1;
        off = off + 2 * k_layer > k_weights ? 0 : off + k_layer;
    }
    float a[8];
    _mm256_storeu_ps(a, _mm256_add_ps(acc, _mm256_castsi256_ps(x)));
    sink[16 * t] = a[0];
    phase_a[t] = ta, phase_b[t] = tb;
    return NULL;
}

int main(int argc, char** argv) {
    pf_bytes = (size_t)(atof(argc > 1 ? argv[1] : "0") * (1 << 20));
    weights = aligned_alloc(4096, k_weights);
    memset(weights, 1, k_weights);
    pthread_barrier_init(&barrier, NULL, NT);
    for (int rep = 0; rep < 3; rep++) {
        pthread_t th[NT];
        for (long t = 0; t < NT; t++) pthread_create(&th[t], NULL, layer_loop, (void*)t);
        for (int t = 0; t < NT; t++) pthread_join(th[t], NULL);
        printf("prefetch %.1f MiB: compute %.1f us, stream %.1f us, layer %.1f us\n", pf_bytes / 1048576.0,
               phase_a[0] / LAYERS * 1e6, phase_b[0] / LAYERS * 1e6, (phase_a[0] + phase_b[0]) / LAYERS * 1e6);
    }
    return 0;
}
