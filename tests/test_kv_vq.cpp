// Vector-coded values (KV_LAYOUT_VQ, engine/kv_vq.h): the code packing, the
// coding against a book (a row made of centroids decodes to itself), the cache
// layout (window, codes, compaction, exact byte accounting), the attention
// kernel's histogram path against its float reference and against attention
// over the decoded rows, k-means training (calib/codebook.h) with its gains,
// plan files with value precisions 1 and 0, and the parameters refused. Both
// value codes (engine/kv_vq.h): 4 x 64 books (and smaller) and 8 x 256.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "calib/codebook.h"
#include "calib/plan.h"
#include "engine/kv_cache.h"
#include "engine/kv_vq.h"
#include "ggml-like/dtype.h"
#include "ggml-like/error.h"
#include "kernels/attention.h"
#include "tests/kv_test_data.h"

using namespace zk;

namespace {

// Random books for n heads of d channels: enc ~ N(0, 1), gains in [0.9, 1.3];
// int8: with the int8 decoding books (the kernel's integer value sums) as a model has them.
struct test_books {
    std::vector<float> enc, gain, dec, dec8_scale;
    std::vector<int8_t> dec8;
    kv_vq_books b;
    test_books(int n, int d, int c, int K, uint32_t seed, bool int8 = false) {
        std::mt19937 g(seed);
        std::normal_distribution<float> N(0, 1);
        std::uniform_real_distribution<float> U(0.9f, 1.3f);
        const size_t per = (size_t)d * K;
        enc.resize(n * per), gain.resize((size_t)n * d), dec.resize(enc.size());
        dec8.resize(int8 ? enc.size() : 0), dec8_scale.resize(int8 ? (size_t)n * (d / c) : 0);
        for (float& x : enc) x = N(g);
        for (float& x : gain) x = U(g);
        b.c = c, b.K = K, b.d = d;
        for (int h = 0; h < n; h++) {
            kvq_vq_decoding_book(c, K, d, enc.data() + h * per, gain.data() + (size_t)h * d, dec.data() + h * per);
            b.heads.push_back(kv_vq_book{enc.data() + h * per, dec.data() + h * per});
            if (int8) {
                kvq_vq_int8_book(c, K, d, dec.data() + h * per, dec8.data() + h * per, dec8_scale.data() + h * (d / c));
                b.heads.back().dec8 = dec8.data() + h * per;
                b.heads.back().dec8_scale = dec8_scale.data() + h * (d / c);
            }
        }
    }
};

// A row of r channels whose groups are exactly the centroids `codes` (of enc), times s.
std::vector<float> row_of(const kv_vq_books& b, int h, const std::vector<int>& codes, int r, float s) {
    std::vector<float> x(r);
    for (int q = 0; q < r / b.c; q++)
        for (int j = 0; j < b.c; j++) x[q * b.c + j] = s * b.heads[h].enc[((size_t)q * b.K + codes[q]) * b.c + j];
    return x;
}

}  // namespace

// kvq_vq_nearest, the encoder's search and k-means' assignment, on rows that are
// not near any centroid: the index it returns is a nearest centroid (its
// distance, in double, within float rounding of the least), and among exact
// duplicates the first. Shapes of the SIMD path (c 4 or 8, K a multiple of 8:
// the 4 x 64 and 8 x 256 books) and of the scalar one.
TEST(KvVq, NearestIsTheLeastDistanceFirstOfEquals) {
    std::mt19937 g(11);
    std::normal_distribution<float> N(0, 1);
    for (const auto& shape : {std::pair{4, 64}, {8, 256}, {4, 8}, {8, 16}, {2, 64}, {3, 4}}) {
        const int c = shape.first, K = shape.second;  // named: lambdas capture them (C++17)
        std::vector<float> e((size_t)K * c);
        for (float& v : e) v = N(g);
        // centroid 1 repeated at K-1 and (where K >= 16) at K-7: K-7 is in 1's lane
        // of the SIMD search (k mod 8), K-1 in another; a row nearest to them gets 1
        const int dup_lane = K >= 16 ? K - 7 : 1, dup_other = K - 1;
        for (int k : {dup_lane, dup_other}) std::copy_n(e.begin() + c, c, e.begin() + (size_t)k * c);
        auto dist = [&](const float* y, int k) {
            double s = 0;
            for (int j = 0; j < c; j++) s += ((double)y[j] - e[(size_t)k * c + j]) * ((double)y[j] - e[(size_t)k * c + j]);
            return s;
        };
        for (int trial = 0; trial < 500; trial++) {
            std::vector<float> y(c);
            for (float& v : y) v = 1.5f * N(g);
            if (trial % 10 == 0)  // next to the duplicated centroid
                for (int j = 0; j < c; j++) y[j] = e[(size_t)c + j] + 0.01f * N(g);
            const int k = kvq_vq_nearest(y.data(), e.data(), K, c);
            ASSERT_GE(k, 0) << "c " << c << " K " << K;
            ASSERT_TRUE(k != dup_other && (k != dup_lane || dup_lane == 1))
                << "c " << c << " K " << K << ": " << k << ", the later of equal centroids";
            double least = INFINITY;
            for (int i = 0; i < K; i++) least = std::min(least, dist(y.data(), i));
            EXPECT_LE(dist(y.data(), k), least * (1 + 1e-5) + 1e-9) << "c " << c << " K " << K << " trial " << trial;
        }
    }
}

TEST(KvVq, CodesPackAndDecodeToTheirCentroids) {
    // every code width 1..8, groups whose codes straddle bytes, and ranks below d
    for (int K : {2, 4, 8, 16, 32, 64, 128, 256}) {
        const int c = std::max(2, K / 32), d = 32 * c;
        test_books tb(1, d, c, K, 7 + K);
        const kv_vq_book& h = tb.b.heads[0];
        std::mt19937 g(K);
        std::normal_distribution<float> N(0, 1);
        for (int trial = 0; trial < 20; trial++) {
            const int r = c * (1 + (int)(g() % (d / c)));
            // rows near centroids (so that the nearest one is clear), at a random scale
            std::vector<int> near(r / c);
            for (int& x : near) x = (int)(g() % K);
            std::vector<float> x = row_of(tb.b, 0, near, r, 0.1f + (float)(g() % 100));
            for (float& v : x) v *= 1.0f + 0.01f * N(g);
            std::vector<uint8_t> packed((size_t)kv_vq_row_bytes(r / c, tb.b.bits()) + KV_VQ_PAD, 0xAB);
            uint16_t scale = 0;
            kvq_vq_encode_row(tb.b, h, x.data(), r, packed.data(), &scale);
            // the scale: the RMS over d channels (the rank's channels only), rounded to f16
            double ss = 0;
            for (float v : x) ss += (double)v * v;
            const float s = fp16_to_fp32(scale);
            EXPECT_NEAR(s, std::sqrt(ss / d), 1e-3 * std::sqrt(ss / d));
            // each code: the centroid nearest to x / s, by brute force
            for (int q = 0; q < r / c; q++) {
                int best = 0;
                double bd = 1e300;
                for (int k = 0; k < K; k++) {
                    double dd = 0;
                    for (int j = 0; j < c; j++) {
                        const double e = x[q * c + j] / s - h.enc[((size_t)q * K + k) * c + j];
                        dd += e * e;
                    }
                    if (dd < bd) bd = dd, best = k;
                }
                ASSERT_EQ(kv_vq_code(packed.data(), q, tb.b.bits()), best) << "K " << K << " group " << q;
            }
            // rows anywhere: the chosen centroid is as near as the nearest (the SIMD search of
            // 8-channel books sums in another order: equal within float rounding)
            std::vector<float> z(r);
            for (float& v : z) v = N(g);
            std::vector<uint8_t> pz(packed.size());
            uint16_t sz = 0;
            kvq_vq_encode_row(tb.b, h, z.data(), r, pz.data(), &sz);
            const float s2 = fp16_to_fp32(sz);
            for (int q = 0; q < r / c; q++) {
                auto dist = [&](int k) {
                    double dd = 0;
                    for (int j = 0; j < c; j++) {
                        const double e = z[q * c + j] / s2 - h.enc[((size_t)q * K + k) * c + j];
                        dd += e * e;
                    }
                    return dd;
                };
                double bd = 1e300;
                for (int k = 0; k < K; k++) bd = std::min(bd, dist(k));
                ASSERT_LE(dist(kv_vq_code(pz.data(), q, tb.b.bits())), bd * (1 + 1e-5) + 1e-9) << "K " << K;
            }
            std::vector<float> y(r);
            kvq_vq_decode_row(tb.b, h, packed.data(), scale, r, y.data());
            for (int i = 0; i < r; i++) {
                const int code = kv_vq_code(packed.data(), i / c, tb.b.bits());
                ASSERT_EQ(y[i], s * h.dec[((size_t)(i / c) * K + code) * c + i % c]);
            }
        }
    }
}

TEST(KvVq, CacheKeepsWindowExactAndCodesTheRest) {
    const int L = 1, KV = 2, D = 64, n = 300;
    // head 0 at value code 1 (4 x 64 books), head 1 at code 0 (8 x 256) and rank 48
    test_books tb(L * KV, D, 4, 64, 3), tb0(L * KV, D, 8, 256, 4);
    kv_cache_params p;
    p.bits = 4;
    p.bits_k = {4, 2};
    p.bits_v = {1, 0};
    p.vq[1] = &tb.b;
    p.vq[0] = &tb0.b;
    const std::vector<int> rk(2, D), rv = {D, 48};
    kv_cache c(L, KV, 512, p, rk, rv);
    EXPECT_EQ(c.layout_v(0, 0), KV_LAYOUT_VQ);
    EXPECT_EQ(c.layout_v(0, 1), KV_LAYOUT_VQ);
    EXPECT_EQ(c.bytes_allocated(), c.bytes_for_capacity(c.capacity()));
    const std::vector<float> k = zk_test::make_rows(n, D, 1), v = zk_test::make_rows(n, D, 2);
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = t;
    for (int h = 0; h < KV; h++) c.append(0, h, n, k.data(), D, v.data(), D, pos.data());
    for (int h = 0; h < KV; h++) {
        const kv_vq_books& books = h == 0 ? tb.b : tb0.b;
        const kv_block& b = c.block(0, h);
        ASSERT_GT(b.n_quant, 0);
        ASSERT_LT(b.n_quant, n);
        std::vector<float> kr(D), vr(D), want(D);
        std::vector<uint8_t> packed(64);
        for (int64_t s = 0; s < n; s++) {
            c.read_slot(0, h, s, kr.data(), vr.data());
            const float* x = v.data() + s * D;
            if (s >= b.n_quant) {  // the residual window: f16 rows
                for (int i = 0; i < b.r_v; i++) ASSERT_NEAR(vr[i], x[i], 2e-3f * std::fabs(x[i]) + 1e-3f);
                continue;
            }
            // coded slots read back as the encoder's decoding of the f16 row the window held
            std::vector<float> x16(b.r_v);
            for (int i = 0; i < b.r_v; i++) x16[i] = fp16_to_fp32(fp32_to_fp16(x[i]));
            uint16_t sc = 0;
            kvq_vq_encode_row(books, books.heads[h], x16.data(), b.r_v, packed.data(), &sc);
            kvq_vq_decode_row(books, books.heads[h], packed.data(), sc, b.r_v, want.data());
            for (int i = 0; i < b.r_v; i++) ASSERT_EQ(vr[i], want[i]) << "slot " << s << " channel " << i;
        }
    }
}

TEST(KvVq, CompactionMovesCodes) {
    const int D = 32, n = 256;
    test_books tb(1, D, 4, 16, 5);
    kv_cache_params p;
    p.bits = 16;
    p.bits_k = {16};
    p.bits_v = {1};
    p.vq[1] = &tb.b;
    p.evicting = true;
    p.group = 16;
    p.residual = 32;
    kv_cache c(1, 1, 320, p, {D}, {D});
    const std::vector<float> k = zk_test::make_rows(n, D, 8), v = zk_test::make_rows(n, D, 9);
    std::vector<int32_t> pos(n);
    for (int t = 0; t < n; t++) pos[t] = t;
    c.append(0, 0, n, k.data(), D, v.data(), D, pos.data());
    std::vector<std::vector<float>> before(n, std::vector<float>(D));
    std::vector<float> kr(D);
    for (int s = 0; s < n; s++) c.read_slot(0, 0, s, kr.data(), before[s].data());
    std::vector<uint8_t> keep(n);
    for (int s = 0; s < n; s++) keep[s] = (s % 3 != 1);
    c.compact(0, 0, keep.data());
    int w = 0;
    std::vector<float> after(D);
    for (int s = 0; s < n; s++) {
        if (!keep[s]) continue;
        c.read_slot(0, 0, w, kr.data(), after.data());
        for (int i = 0; i < D; i++) ASSERT_EQ(after[i], before[s][i]) << "slot " << s << " -> " << w;
        w++;
    }
    EXPECT_EQ(c.block(0, 0).n_used, w);
}

// The histogram path (ranges of at least K slots) and the per-slot path
// against the float reference: the same sums in another order, relative L2
// error < 1e-5; and the reference against double-precision attention over the
// decoded rows (float rounding only, < 1e-4).
TEST(KvVq, KernelMatchesReferenceAndDecodedRows) {
    struct shape {
        int c, K, code;
    };
    for (const shape sh : {shape{4, 16, 1}, shape{4, 64, 1}, shape{8, 256, 0}})
    for (int r : {64, 44, 48, 40})  // 44: an odd number of 4-channel groups; 40: of 8-channel ones
    for (const bool int8 : {false, true}) {  // 8 x 256 books with int8 copies: the integer value sums
        if (r % sh.c || (int8 && sh.K != 256)) continue;
        // G 3 and 6: the 4 x 64 and 8 x 256 register paths; 9: the histogram, its heads spanning two
        // vectors; r 40 also with G 6: an odd number of 8-channel groups in the integer sums, which
        // take groups two at a time where the build has AVX-512VL, the last one alone
        for (const int G : r == 64 ? std::vector<int>{3} : r == 40 ? std::vector<int>{9, 6} : std::vector<int>{6}) {
            const int K = sh.K, D = 64, n = 700;
            const bool integer = int8 && G <= 8;  // (the histogram sums in float)
            test_books tb(1, D, sh.c, K, 11 + K, int8);
            kv_cache_params p;
            p.bits = 16;
            p.bits_k = {16};  // exact scores: 4-bit keys would add the int8 query's rounding
            p.bits_v = {sh.code};
            p.vq[sh.code] = &tb.b;
            kv_cache c(1, 1, 1024, p, {D}, {r});
            const std::vector<float> k = zk_test::make_rows(n, D, 21), v = zk_test::make_rows(n, D, 22);
            std::vector<int32_t> pos(n);
            for (int t = 0; t < n; t++) pos[t] = t;
            c.append(0, 0, n, k.data(), D, v.data(), D, pos.data());
            const attn_kv_view kv = c.view(0, 0);
            ASSERT_GT(kv.v.n_quant, K);
            std::mt19937 g(r + K);
            std::normal_distribution<float> N(0, 1);
            std::vector<float> q((size_t)G * D);
            for (float& x : q) x = 0.3f * N(g);
            const int32_t qpos = n - 1;
            const float scale = 1.0f / 8;
            auto run = [&](bool ref, int parts) {
                std::vector<float> m(parts * G), l(parts * G), acc((size_t)parts * G * r);
                std::vector<float> scratch(kernel_attention_scratch(G, n, D, r, 0));
                std::vector<attn_partial> ps(parts);
                for (int pi = 0; pi < parts; pi++) {
                    ps[pi] = attn_partial{m.data() + pi * G, l.data() + pi * G, acc.data() + (size_t)pi * G * r};
                    attn_q_view qv{q.data(), 0, D, G, 1, &qpos, scale};
                    const int64_t s0 = (int64_t)n * pi / parts, s1 = (int64_t)n * (pi + 1) / parts;
                    (ref ? kernel_attention_range_ref : kernel_attention_range)(kv, s0, s1, qv, ps[pi], scratch.data());
                }
                std::vector<float> out((size_t)G * r);
                kernel_attention_merge(ps.data(), parts, 1, G, r, out.data(), 0, r);
                return out;
            };
            const std::vector<float> ref = run(true, 1);
            auto rel = [&](const std::vector<float>& a) {
                double num = 0, den = 0;
                for (size_t i = 0; i < a.size(); i++) num += (a[i] - ref[i]) * (a[i] - ref[i]), den += ref[i] * ref[i];
                return std::sqrt(num / den);
            };
            // registers or histogram, and ranges shorter than K; the integer sums round each
            // chunk's weights to 1/254 of its largest and the centroids to 1/254 of their group's
            const double tol = integer ? 1e-2 : 1e-5;
            const double e1 = rel(run(false, 1)), e64 = rel(run(false, 64));
            EXPECT_LT(e1, tol) << "r " << r << " K " << K << " int8 " << int8;
            EXPECT_LT(e64, tol) << "r " << r << " K " << K << " int8 " << int8;
            if (integer) {
                EXPECT_GT(e1, 1e-6) << "r " << r << ": the integer path ran (its rounding shows)";
                std::printf("[ measured ] 8 x 256 codes, r %d, G %d, integer value sums: %.2e (one range), %.2e "
                            "(64 ranges) of the float reference\n", r, G, e1, e64);
            }
            // the reference against attention over the rows the cache reads back
            std::vector<float> Kd((size_t)n * D), Vd((size_t)n * r), want((size_t)G * r);
            for (int s = 0; s < n; s++) c.read_slot(0, 0, s, Kd.data() + (size_t)s * D, Vd.data() + (size_t)s * r);
            zk_test::ref_attention(q.data(), G, Kd.data(), Vd.data(), pos.data(), n, D, r, qpos, scale, want.data());
            double num = 0, den = 0;
            for (size_t i = 0; i < want.size(); i++) num += (want[i] - ref[i]) * (want[i] - ref[i]), den += want[i] * want[i];
            EXPECT_LT(std::sqrt(num / den), 1e-4) << "r " << r << " K " << K;
        }
    }
}

TEST(KvVq, RefusesWhatItCannotCode) {
    const int D = 64;
    test_books tb(1, D, 4, 64, 1);
    auto err = [&](kv_cache_params p, int rv) -> std::string {
        try {
            kv_cache c(1, 1, 256, p, {D}, {rv});
        } catch (const zk::error& e) {
            return e.what();
        }
        return "";
    };
    kv_cache_params p;
    p.bits_k = {4};
    p.bits_v = {1};
    EXPECT_NE(err(p, D).find("codebooks"), std::string::npos) << err(p, D);  // no books
    p.vq[1] = &tb.b;
    EXPECT_EQ(err(p, D), "");
    kv_cache_params p0 = p;  // value code 0 needs its own books
    p0.bits_v = {0};
    EXPECT_NE(err(p0, D).find("value precision 0"), std::string::npos) << err(p0, D);
    p0.vq[0] = &tb.b;
    EXPECT_EQ(err(p0, D), "");
    EXPECT_NE(err(p, 30).find("multiple of 4"), std::string::npos) << err(p, 30);  // a rank the codes cannot cover
    kv_cache_params pk = p;
    pk.bits_k = {1};  // keys are never vector-coded
    EXPECT_NE(err(pk, D).find("key precision"), std::string::npos) << err(pk, D);
    pk.bits_k = {0};
    EXPECT_NE(err(pk, D).find("key precision"), std::string::npos) << err(pk, D);
    kv_cache_params pb = p;
    pb.bits = 1;
    pb.bits_k.clear(), pb.bits_v.clear();
    EXPECT_NE(err(pb, D).find("kv.bits must be 16, 8, 4 or 2"), std::string::npos) << err(pb, D);
    pb.bits = 0;
    EXPECT_NE(err(pb, D).find("kv.bits must be 16, 8, 4 or 2"), std::string::npos) << err(pb, D);
    kv_cache_params pg = p;
    pg.gear = true;
    EXPECT_NE(err(pg, D).find("kv.gear"), std::string::npos) << err(pg, D);
    // books the engine cannot read: K not a power of two, more than 64 centroids a channel
    EXPECT_THROW(kvq_vq_check(4, 48, 64), zk::error);
    EXPECT_THROW(kvq_vq_check(1, 128, 64), zk::error);
    EXPECT_THROW(kvq_vq_check(3, 64, 64), zk::error);
}

namespace {

// One (layer, KV head) of D channels whose value sampler holds rows [n x D]
// (every row kept), with an identity V rotation: what calib_train_codebooks reads.
struct one_head_rows {
    model_hparams hp;
    value_sampler vs;
    zack_calibration c;
    static model_hparams shape(int D) {
        model_hparams h;
        h.n_layer = 1, h.n_head_kv = 1, h.n_head = 1, h.head_dim = D, h.n_embd = D;
        return h;
    }
    one_head_rows(int D, const std::vector<float>& rows)
        : hp(shape(D)), vs(hp, (int64_t)(rows.size() / D), 1) {
        const int n = (int)(rows.size() / D);
        std::vector<int32_t> pos(n);
        for (int t = 0; t < n; t++) pos[t] = t;
        vs.on_qkv(0, n, pos.data(), nullptr, nullptr, rows.data());
        c.n_layer = 1, c.n_kv = 1, c.d = D;
        c.rv.assign((size_t)D * D, 0.0);
        for (int j = 0; j < D; j++) c.rv[(size_t)j * D + j] = 1.0;  // identity rotation
    }
};

}  // namespace

// k-means on rows drawn around a known set of centres: the trained book codes
// held-out rows of the same source with less error than the 2-bit per-token
// grid would (< 0.1 of their energy), and the gains are those of the training
// rows (sum x^2 / sum x_hat x per channel, at least 1: the codes shrink).
TEST(KvVq, TrainsBooksAndGains) {
    const int D = 32, C = 4, K = 16, n = 4000;
    std::mt19937 g(5);
    std::normal_distribution<float> N(0, 1);
    std::vector<float> centres((size_t)K * D);
    for (float& x : centres) x = N(g);
    auto draw = [&](int m) {
        std::vector<float> rows((size_t)m * D);
        for (int t = 0; t < m; t++) {
            const float s = 0.5f + (float)(g() % 100) / 50.0f;
            const float* ce = centres.data() + (size_t)(g() % K) * D;
            for (int j = 0; j < D; j++) rows[(size_t)t * D + j] = s * (ce[j] + 0.1f * N(g));
        }
        return rows;
    };
    const std::vector<float> train = draw(n);
    one_head_rows h(D, train);
    ASSERT_EQ(h.vs.n_rows(0), n);
    zack_calibration& c = h.c;
    const value_sampler& vs = h.vs;
    vq_train_params vp;
    vp.c = C, vp.K = K, vp.max_rows = n;  // holdout 8: rows 7, 15, ... measure the books
    const vq_train_report rep = calib_train_codebooks(c, 1, vs, vp);
    EXPECT_EQ(rep.train_rows, n - n / 8);
    EXPECT_EQ(rep.heldout_rows, n / 8);
    ASSERT_EQ(c.vq[1].enc.size(), (size_t)D * K);
    EXPECT_TRUE(c.vq[0].enc.empty());
    std::vector<float> dec;
    const kv_vq_books b = calib_codebooks_view(c, 1, dec);
    const std::vector<float> test = draw(500);
    double err = 0, energy = 0;
    std::vector<float> y(D);
    std::vector<uint8_t> packed(32);
    for (int t = 0; t < 500; t++) {
        const float* x = test.data() + (size_t)t * D;
        uint16_t sc;
        kvq_vq_encode_row(b, b.heads[0], x, D, packed.data(), &sc);
        kvq_vq_decode_row(b, b.heads[0], packed.data(), sc, D, y.data());
        for (int j = 0; j < D; j++) err += (y[j] - x[j]) * (y[j] - x[j]), energy += (double)x[j] * x[j];
    }
    EXPECT_LT(err / energy, 0.1);
    // the gains, recomputed from their definition over the training rows; the
    // report's row errors, from theirs over each part
    std::vector<double> xx(D), yx(D);
    for (int t = 0; t < n; t++) {
        if (t % 8 == 7) continue;
        calib_vq_roundtrip(b, b.heads[0], train.data() + (size_t)t * D, y.data());
        for (int j = 0; j < D; j++) xx[j] += (double)train[t * D + j] * train[t * D + j], yx[j] += (double)y[j] * train[t * D + j];
    }
    for (int j = 0; j < D; j++) {
        EXPECT_NEAR(c.vq[1].gain[j], xx[j] / yx[j], 1e-3 * xx[j] / yx[j]) << j;
        EXPECT_GT(c.vq[1].gain[j], 0.99f) << j;
    }
    double e[2] = {0, 0}, x2[2] = {0, 0};
    for (int t = 0; t < n; t++) {
        calib_vq_roundtrip(b, b.heads[0], train.data() + (size_t)t * D, y.data());
        for (int j = 0; j < D; j++) {
            const double x = train[t * D + j], d = x - (double)y[j] * c.vq[1].gain[j];
            e[t % 8 == 7] += d * d, x2[t % 8 == 7] += x * x;
        }
    }
    EXPECT_NEAR(rep.train_err, e[0] / x2[0], 1e-6);
    EXPECT_NEAR(rep.heldout_err, e[1] / x2[1], 1e-6);
    // held-out rows of this source code about as well as the training ones and the fresh test rows
    EXPECT_LT(rep.heldout_err, 1.5 * rep.train_err);
    EXPECT_NEAR(rep.heldout_err, err / energy, 0.5 * err / energy);
}

// Too few rows to hold any out: all of them train (k-means needs 4K), and the
// report says nothing was held out; one row fewer is refused.
TEST(KvVq, HoldsOutNoRowsWhereTrainingWouldStarve) {
    const int D = 8, C = 4, K = 16;
    for (int n : {64, 72, 63}) {
        std::mt19937 g(9);
        std::normal_distribution<float> N(0, 1);
        std::vector<float> rows((size_t)n * D);
        for (float& x : rows) x = N(g);
        one_head_rows h(D, rows);
        zack_calibration& c = h.c;
        const value_sampler& vs = h.vs;
        vq_train_params vp;
        vp.c = C, vp.K = K, vp.max_rows = n;
        if (n < 4 * K) {
            EXPECT_THROW(calib_train_codebooks(c, 1, vs, vp), zk::error) << n;
            continue;
        }
        const vq_train_report r = calib_train_codebooks(c, 1, vs, vp);
        // 72 rows: 9 held out leave 63 < 64, so none are
        EXPECT_EQ(r.train_rows, n) << n;
        EXPECT_EQ(r.heldout_rows, 0) << n;
        EXPECT_EQ(r.heldout_err, -1.0) << n;
        EXPECT_GT(r.train_err, 0.0) << n;
    }
}

TEST(KvVq, PlanFilesCarryValueCodes) {
    kv_plan p;
    p.n_layer = 1, p.n_kv = 2, p.head_dim = 128, p.bits = 4;
    p.bits_k = {4, 2}, p.bits_v = {1, 0};
    p.ranks_k = {128, 128}, p.ranks_v = {128, 128}, p.kbasis = {0, 0};
    const kv_plan q = kv_plan::from_json(p.to_json(), "test");
    EXPECT_EQ(q.bits_v, p.bits_v);
    EXPECT_NE(q.describe().find("vector-coded 4x64 x1 vector-coded 8x256 x1"), std::string::npos) << q.describe();
    // 128 channels, 32 codes of 6 bits and an f16 scale: 26 bytes a token; 16 codes of 8 bits: 18
    EXPECT_DOUBLE_EQ(plan_side_bytes(1, false, 128), 26.0);
    EXPECT_DOUBLE_EQ(plan_side_bytes(0, false, 128), 18.0);
    EXPECT_THROW(plan_side_bytes(1, true, 128), zk::error);
    EXPECT_THROW(plan_side_bytes(0, true, 128), zk::error);
    nlohmann::json j = p.to_json();
    j["bits_k"] = {1, 4};
    try {
        kv_plan::from_json(j, "plan.json");
        ADD_FAILURE() << "vector-coded keys accepted";
    } catch (const zk::error& e) {
        EXPECT_NE(std::string(e.what()).find("plan.json: plan key precision of head 0 is 1"), std::string::npos)
            << e.what();
    }
}
