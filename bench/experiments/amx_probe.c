// Measured, not built (bench/RESULTS.md, 2026-12-06 "softmax in 512-bit"):
// can this VM run AMX (Linux asks a process to request the tile state,
// arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA), and at what int8 rate?
// Four independent 16x16 accumulator tiles, each tdpbusd 16 x 16 x 64 MACs.
//   gcc -O2 -mamx-tile -mamx-int8 bench/experiments/amx_probe.c -o /tmp/amx && /tmp/amx
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static double seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(void) {
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) {
        printf("AMX: the kernel refused the tile state\n");
        return 1;
    }
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    static int8_t a[16 * 64], b[16 * 64];
    static int32_t d[16 * 16];
    memset(a, 1, sizeof a);
    memset(b, 1, sizeof b);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a, 64);
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b, 64);
    const long n = 20000000;
    const double t0 = seconds();
    for (long i = 0; i < n; i++) {
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    const double t = seconds() - t0;
    _tile_stored(0, d, 64);
    _tile_release();
    printf("AMX: %.2f ns a tdpbusd, %.0f int8 MACs a ns (one core); check %d == %ld\n", t / (4.0 * n) * 1e9,
           16384.0 * 4 * n / t / 1e9, d[0], 64L * n);
    return 0;
}
