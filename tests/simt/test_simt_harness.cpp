// The SIMT harness itself (tests/simt/simt.h): that it runs CUDA code with the
// semantics kernels rely on (thread and block indices, barriers, warp
// collectives in lockstep, shared memory, atomics, f16 conversions), and that
// each check it promises fires on a kernel that breaks the rule, naming the
// block, thread and line. The kernels here are tiny CUDA programs written for
// the test; kernels/cuda's own kernels are tested in test_simt_kernels_*.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "ggml-like/dtype.h"
#include "kernels/cuda/cuda_common.cuh"
#include "kernels/cuda/cuda_device.h"
#include "kernels/cuda/kv_read.cuh"

using namespace zk::cuda;

namespace {

// Runs f and returns the violation's text ("" when none was thrown).
template <class F>
std::string violation_of(F f) {
    try {
        f();
    } catch (const simt::violation& e) {
        return e.what();
    }
    return "";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << "in: " << (text)

// ---------------------------------------------------------------- indices

__global__ void k_ids(dptr<int> out) {
    const int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int nt = blockDim.x * blockDim.y * blockDim.z;
    const int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    out[b * nt + t] = b * 100000 + t;
}

TEST(SimtHarness, ThreadAndBlockIndicesCoverTheGrid) {
    const dim3 grid(3, 2, 2), block(40, 3, 1);  // 120 threads: the last warp has 24 lanes
    const int n = 12 * 120;
    device_array<int> out((size_t)n, "ids");
    ZK_LAUNCH(k_ids, grid, block, 0, nullptr, out.ptr());
    const std::vector<int> h = out.download();
    for (int b = 0; b < 12; b++)
        for (int t = 0; t < 120; t++) ASSERT_EQ(h[b * 120 + t], b * 100000 + t);
}

// ---------------------------------------------------------------- barriers, reductions

__global__ void k_block_sum(dptr<const float> x, dptr<float> out, int n) {
    ZK_SHARED(float, red, 32);
    float v = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
    v = block_sum(v, red);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
}

TEST(SimtHarness, BlockReductionOverAThousandThreads) {
    const int n = 3000, nb = 3;
    std::vector<float> h((size_t)n * nb);
    double want[nb] = {};
    for (int i = 0; i < n * nb; i++) h[i] = (float)((i * 37) % 101) - 50.0f, want[i / n] += h[i];
    device_array<float> x(h, "x"), out(nb, "out");
    ZK_LAUNCH(k_block_sum, dim3(nb), dim3(1024), 0, nullptr, x.cptr(), out.ptr(), n);
    const std::vector<float> o = out.download();
    for (int b = 0; b < nb; b++) EXPECT_EQ(o[b], (float)want[b]);  // small integers: exact in any order
}

// Each phase reads what the neighbour wrote in the one before: only a real
// barrier gives the right answer.
__global__ void k_phases(dptr<int> out, int rounds) {
    ZK_SHARED(int, a, 256);
    const int t = threadIdx.x, n = blockDim.x;
    a[t] = t;
    __syncthreads();
    for (int r = 0; r < rounds; r++) {
        const int v = a[(t + 1) % n];
        __syncthreads();
        a[t] = v + 1;
        __syncthreads();
    }
    out[t] = a[t];
}

TEST(SimtHarness, BarriersSeparatePhases) {
    device_array<int> out(256, "out");
    ZK_LAUNCH(k_phases, dim3(1), dim3(256), 0, nullptr, out.ptr(), 100);
    const std::vector<int> h = out.download();
    for (int t = 0; t < 256; t++) EXPECT_EQ(h[t], (t + 100) % 256 + 100);
}

// ---------------------------------------------------------------- warp collectives

__global__ void k_warp(dptr<int> out) {
    const int t = threadIdx.x, lane = t % 32;
    int o = 0;
    out[t * 8 + o++] = __shfl_xor_sync(k_full_mask, t * 3, 5);
    out[t * 8 + o++] = __shfl_sync(k_full_mask, t, 7, 16);
    out[t * 8 + o++] = __shfl_down_sync(k_full_mask, t, 3, 8);
    out[t * 8 + o++] = __shfl_up_sync(k_full_mask, t, 2);
    out[t * 8 + o++] = (int)__ballot_sync(k_full_mask, lane % 3 == 0);
    out[t * 8 + o++] = __any_sync(k_full_mask, t == 40);
    out[t * 8 + o++] = __all_sync(k_full_mask, lane < 32);
    out[t * 8 + o++] = (int)warp_sum((float)lane, 8);
}

TEST(SimtHarness, WarpCollectivesFollowCudaSemantics) {
    device_array<int> out(64 * 8, "out");
    ZK_LAUNCH(k_warp, dim3(1), dim3(64), 0, nullptr, out.ptr());
    const std::vector<int> h = out.download();
    unsigned ballot = 0;
    for (int l = 0; l < 32; l++)
        if (l % 3 == 0) ballot |= 1u << l;
    for (int t = 0; t < 64; t++) {
        const int lane = t % 32, w = t / 32 * 32;
        const int* r = &h[t * 8];
        EXPECT_EQ(r[0], (w + (lane ^ 5)) * 3);
        EXPECT_EQ(r[1], w + (lane & ~15) + 7);
        EXPECT_EQ(r[2], lane % 8 + 3 < 8 ? t + 3 : t);  // beyond the 8-lane segment: own value
        EXPECT_EQ(r[3], lane >= 2 ? t - 2 : t);
        EXPECT_EQ((unsigned)r[4], ballot);
        EXPECT_EQ(r[5], t / 32 == 1 ? 1 : 0);
        EXPECT_EQ(r[6], 1);
        const int seg = lane & ~7;
        EXPECT_EQ(r[7], 8 * seg + 28);
    }
}

// Lane 0 writes, __syncwarp, lane 5 reads: ordered by the warp barrier.
__global__ void k_syncwarp_orders(dptr<int> out) {
    ZK_SHARED(int, s, 32);
    if (threadIdx.x == 0) s[0] = 42;
    __syncwarp();
    if (threadIdx.x == 5) out[0] = s[0];
}

TEST(SimtHarness, SyncwarpOrdersSharedAccessesOfItsLanes) {
    device_array<int> out(1, "out");
    EXPECT_EQ(violation_of([&] { ZK_LAUNCH(k_syncwarp_orders, dim3(1), dim3(32), 0, nullptr, out.ptr()); }), "");
    EXPECT_EQ(out.download()[0], 42);
}

// ---------------------------------------------------------------- atomics, stacks

__global__ void k_atomics(dptr<int> count, dptr<float> fsum) {
    ZK_SHARED(int, local, 1);
    if (threadIdx.x == 0) local[0] = 0;
    __syncthreads();
    atomicAdd(&local[0], 1);
    atomicAdd(&fsum[0], 0.5f);
    __syncthreads();
    if (threadIdx.x == 0) atomicAdd(&count[0], (int)local[0]);
}

TEST(SimtHarness, AtomicsOnGlobalAndSharedMemory) {
    device_array<int> count(1, "count");
    device_array<float> fsum(1, "fsum");
    EXPECT_EQ(violation_of([&] { ZK_LAUNCH(k_atomics, dim3(5), dim3(96), 0, nullptr, count.ptr(), fsum.ptr()); }), "");
    EXPECT_EQ(count.download()[0], 5 * 96);
    EXPECT_EQ(fsum.download()[0], 5 * 96 * 0.5f);
}

__global__ void k_big_locals(dptr<float> out) {
    float a[2048];  // 8 KiB of "registers" per thread: the fiber stacks hold it
    for (int i = 0; i < 2048; i++) a[i] = (float)(i + threadIdx.x);
    float s = 0;
    for (int i = 0; i < 2048; i += 7) s += a[i];
    out[threadIdx.x] = s;
}

TEST(SimtHarness, LargeThreadLocalArrays) {
    device_array<float> out(256, "out");
    ZK_LAUNCH(k_big_locals, dim3(1), dim3(256), 0, nullptr, out.ptr());
    const std::vector<float> h = out.download();
    double want = 0;
    for (int i = 0; i < 2048; i += 7) want += i;
    EXPECT_EQ(h[3], (float)(want + 3.0 * 293));
}

// ---------------------------------------------------------------- f16

TEST(SimtHarness, HalfConversionsMatchTheCpuBitForBit) {
    for (uint32_t h = 0; h < 65536; h++) {
        const float a = __half2float(__ushort_as_half((unsigned short)h)), b = zk::fp16_to_fp32((uint16_t)h);
        if (std::isnan(b)) {
            ASSERT_TRUE(std::isnan(a)) << h;
            continue;
        }
        ASSERT_EQ(simt::to_bits(a), simt::to_bits(b)) << h;
    }
    std::mt19937 rng(7);
    std::vector<float> xs = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, 1e-8f, -3e-5f, 6.1035156e-5f, 5.9604645e-8f,
                             2.9802322e-8f, 2.9802326e-8f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, INFINITY};
    for (int i = 0; i < 200000; i++) {
        uint32_t u = rng();
        float f;
        std::memcpy(&f, &u, 4);
        if (std::isfinite(f) && std::fabs(f) < 1e6f) xs.push_back(f);
        xs.push_back(std::ldexp((float)(rng() % 4096) / 4096.0f, (int)(rng() % 40) - 30));
    }
    for (float f : xs) ASSERT_EQ(__half_as_ushort(__float2half_rn(f)), zk::fp32_to_fp16(f)) << f;
}

// ---------------------------------------------------------------- byte permutes, KIVI codes as floats

__global__ void k_byte_perm(dptr<unsigned> out) {
    const unsigned x = 0x03020100u, y = 0x07060504u;
    out[0] = __byte_perm(x, y, 0x5140u);
    out[1] = __byte_perm(x, y, 0x7654u);
    out[2] = __byte_perm(x, y, 0x0123u);
    out[3] = __byte_perm(x, y, 0x2637u);
}

TEST(SimtHarness, BytePermFollowsCuda) {
    device_array<unsigned> out(4, "out");
    ZK_LAUNCH(k_byte_perm, dim3(1), dim3(1), 0, nullptr, out.ptr());
    const std::vector<unsigned> h = out.download();
    EXPECT_EQ(h[0], 0x05010400u);
    EXPECT_EQ(h[1], 0x07060504u);
    EXPECT_EQ(h[2], 0x00010203u);
    EXPECT_EQ(h[3], 0x02060307u);
}

// kv_read.cuh's codes as floats without conversions: out[c] = kv_code_f(c),
// then the 8 nibbles and 8 crumbs of word w, the folded grid (s, m), the 4
// nibbles of w's low half.
__global__ void k_code_floats(uint32_t w, float s, float m, dptr<float> out) {
    for (uint32_t c = 0; c < 128; c++) out[c] = kv_code_f(c);
    for (int b = 0; b < 4; b++) out[128 + b] = kv_byte_f(w & 0x7F7F7F7Fu, b);
    float f[8];
    kv_nibbles_f<8>(w, f);
    for (int j = 0; j < 8; j++) out[132 + j] = f[j];
    kv_crumbs_f<8>(w, f);
    for (int j = 0; j < 8; j++) out[140 + j] = f[j];
    kv_grid_fold(s, m, out[148], out[149]);
    float f4[4];
    kv_nibbles_f<4>(w & 0xFFFFu, f4);
    for (int j = 0; j < 4; j++) out[150 + j] = f4[j];
}

TEST(SimtHarness, KiviCodesAsFloatsAreExact) {
    device_array<float> out(154, "out");
    const uint32_t w = 0xC3A5F01Eu;
    const float s = 0.0371f, m = -0.2913f;
    ZK_LAUNCH(k_code_floats, dim3(1), dim3(1), 0, nullptr, w, s, m, out.ptr());
    const std::vector<float> h = out.download();
    for (int c = 0; c < 128; c++) EXPECT_EQ(h[c], 0.5f + (float)c / 256.0f) << c;
    for (int b = 0; b < 4; b++) EXPECT_EQ(h[128 + b], 0.5f + (float)((w >> (8 * b)) & 0x7Fu) / 256.0f) << b;
    for (int j = 0; j < 8; j++) EXPECT_EQ(h[132 + j], 0.5f + (float)((w >> (4 * j)) & 15u) / 256.0f) << j;
    for (int j = 0; j < 8; j++) EXPECT_EQ(h[140 + j], 0.5f + (float)((w >> (2 * j)) & 3u) / 256.0f) << j;
    for (int j = 0; j < 4; j++) EXPECT_EQ(h[150 + j], h[132 + j]) << j;  // a 16-bit word's four
    // S f + M against s code + m: within a few ulps of the grid's range
    for (int code = 0; code < 16; code++) {
        const float x = std::fma(h[148], h[code], h[149]), want = s * (float)code + m;
        EXPECT_NEAR(x, want, 8 * 16 * s * 1.2e-7) << code;
    }
}

// ---------------------------------------------------------------- checks that must fire

__global__ void k_read_n_plus_one(dptr<const float> x, dptr<float> y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i % n] = x[i];  // off by one: i == n reads past x
}

TEST(SimtHarnessChecks, OutOfBoundsGlobalReadNamesBufferThreadAndLine) {
    device_array<float> x(100, "x"), y(100, "y");
    const std::string v = violation_of([&] { ZK_LAUNCH(k_read_n_plus_one, dim3(4), dim3(32), 0, nullptr, x.cptr(), y.ptr(), 100); });
    EXPECT_HAS(v, "out-of-bounds access to buffer 'x'");
    EXPECT_HAS(v, "byte offset 400");
    EXPECT_HAS(v, "block (3,0,0) thread (4,0,0)");
    EXPECT_HAS(v, "test_simt_harness.cpp:");
}

__global__ void k_write_into_neighbour(dptr<float> a, int n) { a[n + threadIdx.x] = 1.0f; }

TEST(SimtHarnessChecks, AccessLandingInAnotherBufferIsStillOutOfBounds) {
    // two buffers, the second right after the first in memory or not: a
    // pointer of the first never reaches the second
    device_array<float> a(64, "a"), b(64, "b");
    const std::string v = violation_of([&] { ZK_LAUNCH(k_write_into_neighbour, dim3(1), dim3(32), 0, nullptr, a.ptr(), 64); });
    EXPECT_HAS(v, "out-of-bounds access to buffer 'a'");
}

__global__ void k_misaligned(dptr<unsigned char> bytes, dptr<float> out) {
    dptr<float> f = dptr<float>(dptr<void>(bytes + 2));
    out[0] = f[0];
}

TEST(SimtHarnessChecks, MisalignedNullAndFreedPointers) {
    device_array<unsigned char> bytes(64, "bytes");
    device_array<float> out(4, "out");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_misaligned, dim3(1), dim3(1), 0, nullptr, bytes.ptr(), out.ptr()); }),
               "misaligned access to buffer 'bytes'");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_write_into_neighbour, dim3(1), dim3(1), 0, nullptr, dptr<float>(), 0); }),
               "null device pointer");
    float* raw = (float*)cuda_malloc(64, "gone");
    const dptr<float> stale(raw);
    cuda_free(raw);
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_write_into_neighbour, dim3(1), dim3(1), 0, nullptr, stale, 0); }),
               "freed buffer 'gone'");
    EXPECT_HAS(violation_of([&] { float host[4]; dptr<float> p(host); (void)p; }), "not in any device buffer");
}

__global__ void k_uninitialized_shared(dptr<float> out) {
    ZK_SHARED(float, s, 64);
    if (threadIdx.x < 32) s[threadIdx.x] = 1.0f;  // the upper half is never written
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

TEST(SimtHarnessChecks, SharedReadBeforeAnyWrite) {
    device_array<float> out(64, "out");
    const std::string v = violation_of([&] { ZK_LAUNCH(k_uninitialized_shared, dim3(1), dim3(64), 0, nullptr, out.ptr()); });
    // the last thread to reach the barrier goes on first: thread 63, byte 252
    EXPECT_HAS(v, "thread (63,0,0)");
    EXPECT_HAS(v, "shared 's' byte 252: read before any write");
}

// The classic bug: a tile loaded and used by neighbours without a barrier.
__global__ void k_missing_barrier(dptr<const float> x, dptr<float> out, int sync) {
    ZK_SHARED(float, tile, 128);
    tile[threadIdx.x] = x[threadIdx.x];
    if (sync) __syncthreads();
    out[threadIdx.x] = tile[(threadIdx.x + 1) % 128];
}

TEST(SimtHarnessChecks, MissingBarrierBetweenWriteAndNeighbourRead) {
    std::vector<float> h(128);
    for (int i = 0; i < 128; i++) h[i] = (float)i;
    device_array<float> x(h, "x"), out(128, "out");
    EXPECT_EQ(violation_of([&] { ZK_LAUNCH(k_missing_barrier, dim3(1), dim3(128), 0, nullptr, x.cptr(), out.ptr(), 1); }), "");
    const std::string v = violation_of([&] { ZK_LAUNCH(k_missing_barrier, dim3(1), dim3(128), 0, nullptr, x.cptr(), out.ptr(), 0); });
    // with the fibers run in order, thread 0 reads tile[1] before thread 1
    // wrote it: never written
    EXPECT_HAS(v, "shared 'tile'");
    EXPECT_TRUE(v.find("read before any write") != std::string::npos || v.find("missing barrier") != std::string::npos) << v;
}

// Read the neighbour's value, then overwrite one's own without a barrier: the
// neighbour may not have read it yet (the fibers run thread 1 after thread 0
// overwrote index 0... so the write-after-read check must see it).
__global__ void k_write_after_read(dptr<float> out) {
    ZK_SHARED(float, s, 64);
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    const float v = s[(threadIdx.x + 63) % 64];
    s[threadIdx.x] = v * 2;  // missing __syncthreads before this
    out[threadIdx.x] = v;
}

TEST(SimtHarnessChecks, MissingBarrierBeforeOverwritingWhatOthersRead) {
    device_array<float> out(64, "out");
    const std::string v = violation_of([&] { ZK_LAUNCH(k_write_after_read, dim3(1), dim3(64), 0, nullptr, out.ptr()); });
    EXPECT_TRUE(v.find("other threads read in the same phase") != std::string::npos ||
                v.find("in the same phase (no __syncthreads") != std::string::npos)
        << v;
}

__global__ void k_write_race(dptr<float> out) {
    ZK_SHARED(float, s, 1);
    s[0] = (float)threadIdx.x;  // every thread, one phase
    __syncthreads();
    out[threadIdx.x] = s[0];
}

TEST(SimtHarnessChecks, WriteWriteRaceInOnePhase) {
    device_array<float> out(64, "out");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_write_race, dim3(1), dim3(64), 0, nullptr, out.ptr()); }),
               "write conflicts with thread 0's write");
}

__global__ void k_divergent_barrier(dptr<float> out) {
    if (threadIdx.x < 16) {
        __syncthreads();
        out[threadIdx.x] = 1;
    }
}

__global__ void k_early_exit_then_barrier(dptr<float> out, int n) {
    if ((int)threadIdx.x >= n) return;
    __syncthreads();
    out[threadIdx.x] = 1;
}

__global__ void k_two_barriers(dptr<float> out) {
    if (threadIdx.x % 2) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}

TEST(SimtHarnessChecks, DivergentBarriers) {
    device_array<float> out(64, "out");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_divergent_barrier, dim3(1), dim3(64), 0, nullptr, out.ptr()); }),
               "barrier in divergent code");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_early_exit_then_barrier, dim3(1), dim3(64), 0, nullptr, out.ptr(), 40); }),
               "barrier in divergent code");
    EXPECT_EQ(violation_of([&] { ZK_LAUNCH(k_early_exit_then_barrier, dim3(1), dim3(64), 0, nullptr, out.ptr(), 64); }), "");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_two_barriers, dim3(1), dim3(64), 0, nullptr, out.ptr()); }),
               "threads wait at different __syncthreads");
}

__global__ void k_deadlock(dptr<float> out) {
    float v = 1;
    if (threadIdx.x == 3)
        __syncthreads();
    else
        v = __shfl_xor_sync(k_full_mask, v, 1);
    out[threadIdx.x] = v;
}

__global__ void k_divergent_shuffles(dptr<float> out) {
    float v = 1;
    if (threadIdx.x < 16)
        v = __shfl_xor_sync(k_full_mask, v, 1);
    else
        v = __shfl_down_sync(k_full_mask, v, 1);
    out[threadIdx.x] = v;
}

__global__ void k_partial_mask(dptr<float> out) {
    float v = (float)threadIdx.x;
    if (threadIdx.x < 16) v = __shfl_sync(0x0000ffffu, v, 20);  // lane 20 is not in the mask
    out[threadIdx.x] = v;
}

__global__ void k_not_in_mask(dptr<float> out) {
    out[threadIdx.x] = __shfl_sync(0x1u, 1.0f, 0);  // every lane calls with a mask naming lane 0 only
}

TEST(SimtHarnessChecks, WarpCollectiveMisuse) {
    device_array<float> out(32, "out");
    const std::string d = violation_of([&] { ZK_LAUNCH(k_deadlock, dim3(1), dim3(32), 0, nullptr, out.ptr()); });
    EXPECT_HAS(d, "deadlock");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_divergent_shuffles, dim3(1), dim3(32), 0, nullptr, out.ptr()); }),
               "divergent warp collective");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_partial_mask, dim3(1), dim3(32), 0, nullptr, out.ptr()); }),
               "not in the mask");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_not_in_mask, dim3(1), dim3(32), 0, nullptr, out.ptr()); }),
               "called by a lane not in its mask");
}

__global__ void k_dynamic(dptr<float> out, int n) {
    ZK_SHARED_DYNAMIC(smem);
    sptr<float> a = smem_take<float>(smem, n);
    sptr<int> b = smem_take<int>(smem, 4);
    a[threadIdx.x] = 2.0f;
    if (threadIdx.x < 4) b[threadIdx.x] = 3;
    __syncthreads();
    out[threadIdx.x] = a[threadIdx.x] + (float)b[threadIdx.x % 4];
    if (threadIdx.x == 0) out[0] = (float)b[n];  // past the carved array b (still inside the dynamic region)
}

__global__ void k_dynamic_optin(dptr<float> out, int n) {
    ZK_SHARED_DYNAMIC(smem);
    sptr<float> a = smem_take<float>(smem, n);
    a[threadIdx.x * (n / 32)] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = a[threadIdx.x * (n / 32)];
}

TEST(SimtHarnessChecks, DynamicSharedMemoryBoundsAndOptIn) {
    device_array<float> out(64, "out");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_dynamic, dim3(1), dim3(64), 64 * 4 + 64, nullptr, out.ptr(), 64); }),
               "out-of-bounds shared access to 'smem'");
    const int big = 16 * 1024;  // 64 KiB of floats
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_dynamic_optin, dim3(1), dim3(32), big * 4, nullptr, out.ptr(), big); }),
               "without cudaFuncSetAttribute opt-in");
    ZK_SET_MAX_DYNAMIC_SMEM(k_dynamic_optin, big * 4);
    EXPECT_EQ(violation_of([&] { ZK_LAUNCH(k_dynamic_optin, dim3(1), dim3(32), big * 4, nullptr, out.ptr(), big); }), "");
}

TEST(SimtHarnessChecks, BadLaunchConfiguration) {
    device_array<float> out(64, "out");
    EXPECT_HAS(violation_of([&] { ZK_LAUNCH(k_write_race, dim3(1), dim3(2048), 0, nullptr, out.ptr()); }),
               "block of 2048 threads");
}

}  // namespace
