// Appending tokens to a device copy of the KV cache (kernels/cuda/kv_append.cu)
// against kv_cache::append on the CPU (engine/kv_quant.h's quantizers): after
// the same appends, in batches that cross 4-bit group flushes, every byte the
// cache uses is equal: f16/f32 rows, 8-bit codes and scales, 4-bit key codes
// with their per-(group, channel) scales and mins, value codes with their
// per-token scales and mins, the residual window. Tolerance: none (bit-exact).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/kv_cache.h"
#include "kernels/cuda/kv_append.h"
#include "tests/simt/cuda_test_util.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

// The host-side bookkeeping of a device cache block, as kv_cache::append does
// it, with the kernels doing the data.
struct device_block {
    kv_cache_params p;
    int r_k, r_v, residual;
    int64_t cap, n_used = 0, n_quant = 0, n_groups = 0;
    device_pool pool;
    dptr<float> k32, v32;
    dptr<uint16_t> k16, v16;
    dptr<int8_t> kq8, vq8;
    dptr<uint8_t> kq4, vq4;
    dptr<uint16_t> ks, km, vs, vm;
    dptr<float> tmp32;
    dptr<uint16_t> tmp16;

    device_block(const kv_cache& c) : p(c.params()), r_k(c.block(0, 0).r_k), r_v(c.block(0, 0).r_v), cap(c.capacity()) {
        residual = p.bits == 4 ? (int)(c.block(0, 0).k.size() / ((p.type == dtype::F32 ? 4 : 2) * r_k)) : 0;
        const int64_t rows = p.bits == 16 ? cap : residual;
        if (p.bits != 8) {
            if (p.type == dtype::F32)
                k32 = pool.zeros<float>(rows * r_k, "k rows"), v32 = pool.zeros<float>(rows * r_v, "v rows"),
                tmp32 = pool.zeros<float>(rows * std::max(r_k, r_v), "shift");
            else
                k16 = pool.zeros<uint16_t>(rows * r_k, "k rows"), v16 = pool.zeros<uint16_t>(rows * r_v, "v rows"),
                tmp16 = pool.zeros<uint16_t>(rows * std::max(r_k, r_v), "shift");
        }
        if (p.bits == 8) {
            kq8 = pool.zeros<int8_t>(cap * r_k, "k codes"), vq8 = pool.zeros<int8_t>(cap * r_v, "v codes");
            ks = pool.zeros<uint16_t>(cap * ((r_k + 31) / 32), "k scales");
            vs = pool.zeros<uint16_t>(cap * ((r_v + 31) / 32), "v scales");
        }
        if (p.bits == 4) {
            const int64_t mg = cap / p.group;
            kq4 = pool.zeros<uint8_t>(cap * ((r_k + 1) / 2), "k codes"), vq4 = pool.zeros<uint8_t>(cap * ((r_v + 1) / 2), "v codes");
            ks = pool.zeros<uint16_t>(mg * r_k, "k scales"), km = pool.zeros<uint16_t>(mg * r_k, "k mins");
            vs = pool.zeros<uint16_t>(cap * ((r_v + 31) / 32), "v scales"), vm = pool.zeros<uint16_t>(cap * ((r_v + 31) / 32), "v mins");
        }
    }

    cuda_rows rows_of(dptr<float> f32, dptr<uint16_t> f16, int64_t off, int64_t n, int r) const {
        cuda_rows s;
        if (f32) s.f32 = dptr<const float>(f32 + off * r);
        else s.f16 = dptr<const uint16_t>(f16 + off * r);
        s.stride = r, s.n = n, s.r = r;
        return s;
    }

    // n new rows (device f32, row stride `stride`), in as few launches as the
    // flushes allow
    void append(dptr<const float> K, dptr<const float> V, int64_t stride, int64_t n) {
        int64_t t = 0;
        while (t < n) {
            int64_t m = n - t;
            if (p.bits == 4) m = std::min<int64_t>(m, residual - (n_used - n_quant));
            cuda_rows kr{K + t * stride, dptr<const uint16_t>(), stride, m, r_k};
            cuda_rows vr{V + t * stride, dptr<const uint16_t>(), stride, m, r_v};
            if (p.bits == 16) {
                cuda_kv_store_rows(kr, k32, k16, n_used, nullptr);
                cuda_kv_store_rows(vr, v32, v16, n_used, nullptr);
            } else if (p.bits == 8) {
                cuda_kv_quantize_q8(kr, kq8, ks, n_used, nullptr);
                cuda_kv_quantize_q8(vr, vq8, vs, n_used, nullptr);
            } else {
                cuda_kv_store_rows(kr, k32, k16, n_used - n_quant, nullptr);
                cuda_kv_store_rows(vr, v32, v16, n_used - n_quant, nullptr);
            }
            n_used += m;
            t += m;
            if (p.bits == 8) n_quant = n_used;
            if (p.bits == 4 && n_used - n_quant == residual) flush();
        }
    }

    // the residual window's oldest group becomes group n_groups
    void flush() {
        const int G = p.group;
        const int64_t g = n_groups;
        cuda_kv_quantize_q4_keys(rows_of(k32, k16, 0, G, r_k), kq4, ks + g * r_k, km + g * r_k, n_quant, nullptr);
        cuda_kv_quantize_q4_values(rows_of(v32, v16, 0, G, r_v), vq4, vs, vm, n_quant, nullptr);
        n_groups++;
        n_quant += G;
        const int64_t rest = n_used - n_quant;
        const size_t es = p.type == dtype::F32 ? 4 : 2;
        for (int kv = 0; kv < 2; kv++) {
            const int r = kv ? r_v : r_k;
            char* base = kv ? (k32 ? (char*)&*v32 : (char*)&*v16) : (k32 ? (char*)&*k32 : (char*)&*k16);
            char* tmp = k32 ? (char*)&*tmp32 : (char*)&*tmp16;
            if (rest == 0) continue;
            cuda_copy_on_device(tmp, base + (size_t)G * r * es, (size_t)rest * r * es);
            cuda_copy_on_device(base, tmp, (size_t)rest * r * es);
        }
    }
};

template <class T, class U>
void expect_bytes(device_pool& pool, dptr<T> d, const std::vector<U>& h, size_t bytes, const char* what) {
    if (bytes == 0) return;
    std::vector<uint8_t> got(bytes);
    cuda_copy_to_host(got.data(), (const void*)&*d, bytes);
    ASSERT_EQ(std::memcmp(got.data(), h.data(), bytes), 0) << what;
}

struct append_case {
    int bits;
    dtype type;
    int r_k, r_v;
};

class CudaKvAppend : public ::testing::TestWithParam<append_case> {};

TEST_P(CudaKvAppend, SameBytesAsTheCpuCache) {
    const append_case ac = GetParam();
    kv_cache_params p;
    p.bits = ac.bits;
    p.type = ac.type;
    p.group = 16;
    p.residual = ac.bits == 4 ? 48 : 0;
    const int64_t cap = 256, D = 64;
    kv_cache c(1, 1, cap, p, {ac.r_k}, {ac.r_v});
    device_block db(c);
    std::mt19937 g(17);
    std::normal_distribution<float> N(0, 2);
    std::vector<float> K((size_t)cap * D), V((size_t)cap * D);
    for (auto& x : K) x = N(g);
    for (auto& x : V) x = N(g) * 0.3f + 1.0f;
    K[5 * D + 3] = 40.0f;  // an outlier widens one group's grid
    std::vector<int32_t> pos(cap);
    for (int i = 0; i < cap; i++) pos[i] = i;
    device_pool pool;
    const dptr<const float> dK = pool.up(K, "K"), dV = pool.up(V, "V");
    const int64_t batches[] = {70, 1, 1, 33, 5, 90, 7};  // crosses several flushes
    int64_t done = 0;
    for (int64_t n : batches) {
        c.append(0, 0, n, K.data() + done * D, D, V.data() + done * D, D, pos.data() + done);
        db.append(dK + done * D, dV + done * D, D, n);
        done += n;
    }
    const kv_block& b = c.block(0, 0);
    ASSERT_EQ(db.n_used, b.n_used);
    ASSERT_EQ(db.n_quant, b.n_quant);
    ASSERT_EQ(db.n_groups, b.n_groups);
    const size_t es = ac.type == dtype::F32 ? 4 : 2, nf = (size_t)(b.n_used - b.n_quant), nq = (size_t)b.n_quant;
    if (ac.bits != 8) {
        if (db.k32) {
            expect_bytes(pool, db.k32, b.k, nf * ac.r_k * es, "k rows");
            expect_bytes(pool, db.v32, b.v, nf * ac.r_v * es, "v rows");
        } else {
            expect_bytes(pool, db.k16, b.k, nf * ac.r_k * es, "k rows");
            expect_bytes(pool, db.v16, b.v, nf * ac.r_v * es, "v rows");
        }
    }
    if (ac.bits == 8) {
        expect_bytes(pool, db.kq8, b.kq, nq * ac.r_k, "k codes");
        expect_bytes(pool, db.vq8, b.vq, nq * ac.r_v, "v codes");
        expect_bytes(pool, db.ks, b.ks, nq * ((ac.r_k + 31) / 32) * 2, "k scales");
        expect_bytes(pool, db.vs, b.vs, nq * ((ac.r_v + 31) / 32) * 2, "v scales");
    }
    if (ac.bits == 4) {
        ASSERT_GT(b.n_groups, 3);
        expect_bytes(pool, db.kq4, b.kq, nq * ((ac.r_k + 1) / 2), "k codes");
        expect_bytes(pool, db.vq4, b.vq, nq * ((ac.r_v + 1) / 2), "v codes");
        expect_bytes(pool, db.ks, b.ks, (size_t)b.n_groups * ac.r_k * 2, "k scales");
        expect_bytes(pool, db.km, b.km, (size_t)b.n_groups * ac.r_k * 2, "k mins");
        expect_bytes(pool, db.vs, b.vs, nq * ((ac.r_v + 31) / 32) * 2, "v scales");
        expect_bytes(pool, db.vm, b.vm, nq * ((ac.r_v + 31) / 32) * 2, "v mins");
    }
}

INSTANTIATE_TEST_SUITE_P(Layouts, CudaKvAppend,
                         ::testing::Values(append_case{16, dtype::F16, 36, 20}, append_case{16, dtype::F32, 4, 64},
                                           append_case{8, dtype::F16, 36, 40}, append_case{8, dtype::F16, 64, 4},
                                           append_case{4, dtype::F16, 36, 40}, append_case{4, dtype::F32, 64, 64},
                                           append_case{4, dtype::F16, 37, 5}),
                         [](const ::testing::TestParamInfo<append_case>& i) {
                             return "b" + std::to_string(i.param.bits) + "_" + dtype_name(i.param.type) + "_rk" +
                                    std::to_string(i.param.r_k) + "_rv" + std::to_string(i.param.r_v);
                         });

}  // namespace
