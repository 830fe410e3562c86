// Appending tokens to a device copy of the KV cache (kernels/cuda/kv_append.cu)
// against kv_cache::append on the CPU (engine/kv_quant.h's quantizers), at
// every key x value layout pair (16-bit rows, 8-bit, 4- and 2-bit KIVI per
// side; a block with a KIVI side keeps the newest tokens in a residual window,
// its 8-bit side too), f16 and f32 rows, odd ranks (a partial last code byte):
// after the same appends, in batches that cross group flushes, every byte the
// cache uses (the arrays of the CPU's attn_kv_view at the extents
// cuda_kv_side_extent_of gives) is equal, and so are n_quant and the group
// table. Tolerance: none (bit-exact).
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/kv_cache.h"
#include "kernels/cuda/kv_append.h"
#include "kernels/cuda/kv_head.h"
#include "tests/simt/attention_decode_fixture.h"
#include "tests/simt/cuda_test_util.h"

using namespace zk;
using namespace zk::cuda;
using namespace zk::cuda_test;

namespace {

// A device cache block: each side's arrays at capacity, as its CPU layout
// allocates them, and the host-side bookkeeping of kv_cache::append with the
// kernels doing the data.
struct device_block {
    kv_cache_params p;
    int r_k, r_v, residual = 0;
    bool windowed;
    int64_t cap, max_groups = 0, n_used = 0, n_quant = 0, n_groups = 0;
    std::vector<int32_t> group_start{0};
    device_pool pool;
    cuda_kv_side_store k, v;
    void* scratch = nullptr;

    device_block(const kv_cache& c)
        : p(c.params()),
          r_k(c.view(0, 0).r_k),
          r_v(c.view(0, 0).r_v),
          windowed(kv_cache_windowed(c.params())),
          cap(c.capacity()) {
        if (windowed) {
            residual = kv_cache_residual(p, cap);
            max_groups = cap / p.group;
        }
        k = make_side(c.layout_k(0, 0), true, r_k);
        v = make_side(c.layout_v(0, 0), false, r_v);
        const size_t es = p.type == dtype::F32 ? 4 : 2;
        if (windowed) scratch = dptr_addr(pool.zeros<uint8_t>((size_t)residual * std::max(r_k, r_v) * es, "shift"));
    }

    cuda_kv_side_store make_side(kv_layout_id layout, bool keys, int r) {
        cuda_kv_side_store d;
        d.layout = layout;
        d.keys = keys;
        d.windowed = windowed;
        d.r = r;
        const int64_t rows = layout == KV_LAYOUT_ROWS ? cap : (windowed ? residual : 0);
        if (rows > 0) {
            if (p.type == dtype::F32)
                d.rows32 = pool.zeros<float>((size_t)rows * r, "rows");
            else
                d.rows16 = pool.zeros<uint16_t>((size_t)rows * r, "rows");
        }
        if (layout == KV_LAYOUT_Q8) {
            d.codes = pool.zeros<uint8_t>((size_t)cap * r, "codes");
            d.scale = pool.zeros<uint16_t>((size_t)cap * kv_n_blocks(r, KV_Q8_BLOCK), "scales");
        } else if (layout == KV_LAYOUT_Q4 || layout == KV_LAYOUT_Q2) {
            d.codes = pool.zeros<uint8_t>((size_t)cap * kv_kivi_row_bytes(layout == KV_LAYOUT_Q4 ? 4 : 2, r), "codes");
            const int64_t ns = keys ? max_groups * r : cap * kv_n_blocks(r, KV_Q4_VBLOCK);
            d.scale = pool.zeros<uint16_t>((size_t)ns, "scales");
            d.min = pool.zeros<uint16_t>((size_t)(max_groups * KV_GRID_STEPS), "steps");
        }
        return d;
    }

    // n new rows (device f32, row stride `stride`), in as few launches as the
    // flushes allow
    void append(dptr<const float> K, dptr<const float> V, int64_t stride, int64_t n) {
        const bool at_once = !windowed && (k.layout != KV_LAYOUT_ROWS || v.layout != KV_LAYOUT_ROWS);
        int64_t t = 0;
        while (t < n) {
            int64_t m = n - t;
            if (windowed) m = std::min<int64_t>(m, residual - (n_used - n_quant));
            cuda_rows kr{K + t * stride, dptr<const uint16_t>(), stride, m, r_k};
            cuda_rows vr{V + t * stride, dptr<const uint16_t>(), stride, m, r_v};
            cuda_kv_side_append(k, kr, n_used, n_used - n_quant, nullptr);
            cuda_kv_side_append(v, vr, n_used, n_used - n_quant, nullptr);
            n_used += m;
            t += m;
            if (at_once) n_quant = n_used;
            if (windowed && n_used - n_quant == residual) flush();
        }
    }

    // the residual window's oldest group becomes group n_groups
    void flush() {
        const int G = p.group;
        const int64_t rest = n_used - n_quant - G;
        cuda_kv_side_flush(k, n_groups, n_quant, G, rest, scratch, nullptr);
        cuda_kv_side_flush(v, n_groups, n_quant, G, rest, scratch, nullptr);
        n_groups++;
        n_quant += G;
        group_start.push_back((int32_t)n_quant);
    }
};

// The first `bytes` bytes of device array d equal those at host address h.
template <class T>
void expect_bytes(device_pool&, dptr<T> d, const void* h, size_t bytes, const char* what) {
    if (bytes == 0) return;
    ASSERT_TRUE(d && h) << what;
    std::vector<uint8_t> got(bytes);
    cuda_copy_to_host(got.data(), (const void*)dptr_addr(d), bytes);
    size_t i = 0;
    while (i < bytes && got[i] == ((const uint8_t*)h)[i]) i++;
    ASSERT_EQ(i, bytes) << what << ": first difference at byte " << i << " of " << bytes;
}

void expect_side(device_pool& pool, const cuda_kv_side_store& d, const attn_kv_view& view, bool keys,
                 const std::string& what) {
    const attn_side_view& s = keys ? view.k : view.v;
    const cuda_kv_side_extent e = cuda_kv_side_extent_of(view, keys);
    const size_t es = view.type == dtype::F32 ? 4 : 2;
    if (d.rows32) expect_bytes(pool, d.rows32, s.rows, (size_t)e.rows * es, (what + " rows").c_str());
    if (d.rows16) expect_bytes(pool, d.rows16, s.rows, (size_t)e.rows * es, (what + " rows").c_str());
    expect_bytes(pool, d.codes, s.codes, (size_t)e.codes, (what + " codes").c_str());
    expect_bytes(pool, d.scale, s.scale, (size_t)e.scale * 2, (what + " scales").c_str());
    expect_bytes(pool, d.min, s.min, (size_t)e.min * 2, (what + " mins").c_str());
}

struct append_case {
    dtype type;
    int r_k, r_v;
};

class CudaKvAppend : public ::testing::TestWithParam<layout> {};

TEST_P(CudaKvAppend, SameBytesAsTheCpuCache) {
    const layout lay = GetParam();
    for (const append_case ac : {append_case{dtype::F16, 36, 40}, append_case{dtype::F32, 64, 4},
                                 append_case{dtype::F16, 37, 5}, append_case{dtype::F16, 3, 70}}) {
        const std::string what = lay.name() + " " + dtype_name(ac.type) + " r_k " + std::to_string(ac.r_k) +
                                 " r_v " + std::to_string(ac.r_v);
        kv_cache_params p;
        p.bits_k = {lay.bits_k};
        p.bits_v = {lay.bits_v};
        p.type = ac.type;
        p.group = 16;
        p.residual = lay.kivi() ? 48 : 0;
        const int64_t cap = 256, D = 72;
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
        const attn_kv_view view = c.view(0, 0);
        ASSERT_EQ(db.n_used, view.n_slots) << what;
        const int64_t nq = lay.kivi() ? view.n_groups * p.group : (lay.bits_k != 16 || lay.bits_v != 16 ? done : 0);
        ASSERT_EQ(db.n_quant, nq) << what;
        if (lay.bits_k != 16) {
            ASSERT_EQ(view.k.n_quant, db.n_quant) << what;
        }
        if (lay.kivi()) {
            ASSERT_GT(view.n_groups, 3) << what;
            ASSERT_EQ(db.n_groups, view.n_groups) << what;
            for (int64_t i = 0; i <= view.n_groups; i++) ASSERT_EQ(db.group_start[i], view.group_start[i]) << what;
        }
        expect_side(pool, db.k, view, true, what + " keys");
        expect_side(pool, db.v, view, false, what + " values");
    }
}

INSTANTIATE_TEST_SUITE_P(KeyValue, CudaKvAppend, ::testing::ValuesIn(all_layout_pairs()),
                         [](const ::testing::TestParamInfo<layout>& i) { return i.param.name(); });

}  // namespace
