// Unit tests of the calibration building blocks: SHA-256 against the FIPS
// 180-4 / NIST example vectors, the LAPACK eigen wrapper against a matrix built
// from a known spectrum, rank selection on hand-computed spectra, the V-O
// folding identity, and the projector distance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "calib/compare.h"
#include "calib/eigen.h"
#include "calib/fold.h"
#include "calib/ranks.h"
#include "calib/sha256.h"
#include "ggml-like/error.h"

using namespace zk;

namespace {

// A random orthogonal matrix [n x n] from Gram-Schmidt on Gaussian columns.
std::vector<double> random_orthogonal(int n, std::mt19937_64& rng) {
    std::normal_distribution<double> N(0, 1);
    std::vector<double> q((size_t)n * n);
    for (auto& x : q) x = N(rng);
    for (int j = 0; j < n; j++) {
        for (int p = 0; p < j; p++) {
            double dot = 0;
            for (int i = 0; i < n; i++) dot += q[i * n + j] * q[i * n + p];
            for (int i = 0; i < n; i++) q[i * n + j] -= dot * q[i * n + p];
        }
        double nrm = 0;
        for (int i = 0; i < n; i++) nrm += q[i * n + j] * q[i * n + j];
        nrm = std::sqrt(nrm);
        for (int i = 0; i < n; i++) q[i * n + j] /= nrm;
    }
    return q;
}

zack_spectra one_head(std::vector<double> k, std::vector<double> v) {
    zack_spectra s;
    s.n_layer = 1;
    s.n_kv = 1;
    s.d = (int)k.size();
    s.sigma_k = std::move(k);
    s.sigma_v = std::move(v);
    return s;
}

}  // namespace

TEST(Sha256, NistVectors) {
    EXPECT_EQ(sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    EXPECT_EQ(sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";  // 448 bits
    EXPECT_EQ(sha256_hex(two.data(), two.size()), "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    // One million 'a', fed in uneven pieces to exercise the buffering.
    sha256 h;
    const std::string a(1000, 'a');
    for (int i = 0; i < 1000; i++) h.update(a.data(), i % 2 ? 1000 : 0), h.update(a.data(), i % 2 ? 0 : 1000);
    EXPECT_EQ(h.final_hex(), "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// The SHA-NI blocks against the portable ones: every length 0..300 (the padding's
// boundaries at 55/56/64 bytes), pieces that straddle the buffer, and 1 MiB.
TEST(Sha256, ShaniMatchesPortable) {
    if (!sha256_cpu_has_shani()) GTEST_SKIP() << "this CPU has no SHA extensions: only the portable code runs here";
    std::mt19937_64 rng(11);
    std::vector<uint8_t> d((1 << 20) + 7);
    for (auto& b : d) b = (uint8_t)rng();
    for (size_t n = 0; n <= 300; n++) {
        sha256 a(true), b(false);
        a.update(d.data(), n), b.update(d.data(), n);
        ASSERT_EQ(a.final_hex(), b.final_hex()) << n << " bytes";
    }
    sha256 a(true), b(false);
    for (size_t o = 0; o < d.size();) {
        const size_t k = std::min<size_t>(d.size() - o, 1 + rng() % 5000);
        a.update(d.data() + o, k), b.update(d.data() + o, k);
        o += k;
    }
    EXPECT_EQ(a.final_hex(), b.final_hex());
}

TEST(Eigen, ReconstructsKnownSpectrum) {
    std::mt19937_64 rng(7);
    const int n = 24;
    const std::vector<double> U = random_orthogonal(n, rng);
    std::vector<double> lam(n);
    for (int j = 0; j < n; j++) lam[j] = std::pow(0.7, j) * 10 + (j == n - 1 ? 0 : 0);  // distinct, descending
    std::vector<double> C((size_t)n * n, 0.0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++)
            for (int c = 0; c < n; c++) C[i * n + j] += U[i * n + c] * lam[c] * U[j * n + c];
    std::vector<double> vals, vecs;
    eigen_sym_desc(n, C.data(), vals, vecs);
    for (int j = 0; j < n; j++) EXPECT_NEAR(vals[j], lam[j], 1e-10 * lam[0]) << j;
    for (int a = 0; a < n; a++)
        for (int b = 0; b < n; b++) {
            double dot = 0, rec = 0;
            for (int i = 0; i < n; i++) dot += vecs[i * n + a] * vecs[i * n + b];
            for (int c = 0; c < n; c++) rec += vecs[a * n + c] * vals[c] * vecs[b * n + c];
            EXPECT_NEAR(dot, a == b ? 1.0 : 0.0, 1e-12);
            EXPECT_NEAR(rec, C[a * n + b], 1e-10 * lam[0]);
        }
    // Each eigenvector equals the planted one up to sign; the sign rule makes the
    // largest-magnitude component positive.
    for (int j = 0; j < n; j++) {
        double dot = 0;
        int imax = 0;
        for (int i = 0; i < n; i++) {
            dot += vecs[i * n + j] * U[i * n + j];
            if (std::fabs(vecs[i * n + j]) > std::fabs(vecs[imax * n + j])) imax = i;
        }
        EXPECT_NEAR(std::fabs(dot), 1.0, 1e-9);
        EXPECT_GT(vecs[imax * n + j], 0);
    }
}

TEST(Eigen, DiagonalAndRejectsNan) {
    const double C[9] = {1, 0, 0, 0, 3, 0, 0, 0, 2};
    std::vector<double> vals, vecs;
    eigen_sym_desc(3, C, vals, vecs);
    EXPECT_DOUBLE_EQ(vals[0], 3);
    EXPECT_DOUBLE_EQ(vals[1], 2);
    EXPECT_DOUBLE_EQ(vals[2], 1);
    EXPECT_DOUBLE_EQ(vecs[1 * 3 + 0], 1);  // direction 0 is e_1
    const double bad[4] = {1, NAN, NAN, 1};
    EXPECT_THROW(eigen_sym_desc(2, bad, vals, vecs), zk::error);
}

// cholesky_upper: R^T R gives back a random Gram matrix, R is upper triangular
// with a positive diagonal; a Gram matrix of fewer vectors than its size has no
// factor (the sensitivity pass then keeps the matrix itself).
TEST(Eigen, CholeskyUpper) {
    const int n = 7;
    std::mt19937 rng(5);
    std::normal_distribution<double> g(0.0, 1.0);
    for (int k : {12, 3}) {  // vectors in the Gram matrix
        std::vector<double> W((size_t)k * n), A((size_t)n * n, 0.0), R;
        for (double& x : W) x = g(rng);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                for (int e = 0; e < k; e++) A[i * n + j] += W[e * n + i] * W[e * n + j];
        const bool ok = cholesky_upper(n, A.data(), R);
        if (k < n) {
            EXPECT_FALSE(ok);
            continue;
        }
        ASSERT_TRUE(ok);
        for (int i = 0; i < n; i++) {
            EXPECT_GT(R[i * n + i], 0.0);
            for (int j = 0; j < i; j++) EXPECT_EQ(R[i * n + j], 0.0) << i << " " << j;
            for (int j = 0; j < n; j++) {
                double s = 0;
                for (int e = 0; e < n; e++) s += R[e * n + i] * R[e * n + j];
                EXPECT_NEAR(s, A[i * n + j], 1e-12 * (1 + std::fabs(A[i * n + j]))) << i << " " << j;
            }
        }
    }
}

TEST(Ranks, RankForEpsByHand) {
    // sigma = 8 4 2 1 1 (sum 16). Tails: r=4 -> 1, r=3 -> 2, r=2 -> 4, r=1 -> 8.
    const double s[5] = {8, 4, 2, 1, 1};
    EXPECT_EQ(rank_for_eps(s, 5, 0.0), 5);
    EXPECT_EQ(rank_for_eps(s, 5, 0.0624), 5);  // budget 0.998 < 1
    EXPECT_EQ(rank_for_eps(s, 5, 0.0625), 4);  // budget 1
    EXPECT_EQ(rank_for_eps(s, 5, 0.125), 3);   // budget 2
    EXPECT_EQ(rank_for_eps(s, 5, 0.2), 3);     // budget 3.2 < 4
    EXPECT_EQ(rank_for_eps(s, 5, 0.25), 2);    // budget 4
    EXPECT_EQ(rank_for_eps(s, 5, 0.5), 1);     // budget 8
    EXPECT_EQ(rank_for_eps(s, 5, 0.99), 1);
    const double z[3] = {5, 0, 0};  // zero directions go at eps = 0 already
    EXPECT_EQ(rank_for_eps(z, 3, 0.0), 1);
    EXPECT_EQ(rank_align_up(0, 4, 64), 4);
    EXPECT_EQ(rank_align_up(5, 4, 64), 8);
    EXPECT_EQ(rank_align_up(8, 4, 64), 8);
    EXPECT_EQ(rank_align_up(63, 4, 64), 64);
    EXPECT_EQ(rank_align_up(61, 16, 70), 64);
    EXPECT_EQ(rank_align_up(69, 16, 70), 70);  // capped at d
}

TEST(Ranks, FromEpsTwoLayersByHand) {
    // d = 8, 2 layers x 1 KV head. Layer 0 K: geometric 128..1 (sum 255),
    // layer 0 V: flat 1s (sum 8); layer 1 K: 10,10,0.. ; layer 1 V: 4,2,1,1,0,0,0,0 (sum 8).
    zack_spectra s;
    s.n_layer = 2;
    s.n_kv = 1;
    s.d = 8;
    s.sigma_k = {128, 64, 32, 16, 8, 4, 2, 1, 10, 10, 0, 0, 0, 0, 0, 0};
    s.sigma_v = {1, 1, 1, 1, 1, 1, 1, 1, 4, 2, 1, 1, 0, 0, 0, 0};
    // eps = 0.1: K0 budget 25.5: drop 1+2+4+8 = 15 (next 16 -> 31 > 25.5): r = 4.
    // V0 budget 0.8: r = 8. K1: budget 2: zeros only, r = 2. V1 budget 0.8: r = 4.
    zack_ranks r = ranks_from_eps(s, 0.1, 1);
    EXPECT_EQ(r.k, (std::vector<int>{4, 2}));
    EXPECT_EQ(r.v, (std::vector<int>{8, 4}));
    EXPECT_DOUBLE_EQ(r.rate, 1.0 - (4 + 2 + 8 + 4) / 32.0);
    // Align 4: 4,4 / 8,4.
    r = ranks_from_eps(s, 0.1, 4);
    EXPECT_EQ(r.k, (std::vector<int>{4, 4}));
    EXPECT_EQ(r.v, (std::vector<int>{8, 4}));
    EXPECT_DOUBLE_EQ(r.rate, 1.0 - 20 / 32.0);
    // eps = 0.3: K0 budget 76.5: drop 31 (+32 = 63 ok, +64 no): r = 2. V0 budget 2.4: r = 6.
    // K1: budget 6: r = 2. V1 budget 2.4: drop 0,0,0,0,1,1 -> 2 <= 2.4, +2 = 4 no: r = 2.
    r = ranks_from_eps(s, 0.3, 1);
    EXPECT_EQ(r.k, (std::vector<int>{2, 2}));
    EXPECT_EQ(r.v, (std::vector<int>{6, 2}));
    EXPECT_THROW(ranks_from_eps(s, 1.0, 1), zk::error);
    EXPECT_THROW(ranks_from_eps(s, -0.1, 1), zk::error);
    EXPECT_THROW(ranks_from_eps(s, 0.1, 0), zk::error);
    EXPECT_THROW(ranks_from_eps(s, 0.1, 9), zk::error);
}

TEST(Ranks, RateIsMonotoneAndBisectionHitsTarget) {
    std::mt19937_64 rng(3);
    std::uniform_real_distribution<double> U(0.2, 1.0);
    zack_spectra s;
    s.n_layer = 6;
    s.n_kv = 3;
    s.d = 64;
    for (int h = 0; h < s.n_layer * s.n_kv; h++) {
        // Decaying spectra with a per-head decay rate: heads differ, as in real models.
        const double decay = 0.8 + 0.19 * U(rng);
        double x = 10 * U(rng);
        for (int j = 0; j < s.d; j++, x *= decay) s.sigma_k.push_back(x);
        x = 10 * U(rng);
        const double dv = 0.8 + 0.19 * U(rng);
        for (int j = 0; j < s.d; j++, x *= dv) s.sigma_v.push_back(x);
    }
    const int align = 4;
    double prev = -1;
    for (double eps = 0; eps < 1; eps += 0.01) {
        const double rate = ranks_from_eps(s, eps, align).rate;
        EXPECT_GE(rate, prev) << eps;
        prev = rate;
    }
    const double step = (double)align / (2.0 * s.d * s.n_layer * s.n_kv);
    for (double target : {0.0, 0.1, 0.25, 0.33, 0.5, 0.6, 0.75, 0.9, 0.9375}) {
        const zack_ranks r = ranks_for_rate(s, target, align);
        EXPECT_GE(r.rate, target - 1e-12) << target;
        EXPECT_LE(r.rate, target + step + 1e-12) << target;
        for (size_t i = 0; i < r.k.size(); i++) {
            EXPECT_EQ(r.k[i] % align, 0);
            EXPECT_EQ(r.v[i] % align, 0);
            EXPECT_GE(r.k[i], align);
            EXPECT_LE(r.k[i], s.d);
        }
        // The ranks are those of the reported eps.
        const zack_ranks again = ranks_from_eps(s, r.eps, align);
        EXPECT_EQ(again.k, r.k);
        EXPECT_EQ(again.v, r.v);
    }
    EXPECT_THROW(ranks_for_rate(s, 0.95, align), zk::error);  // above 1 - 4/64
    EXPECT_THROW(ranks_for_rate(s, 1.0, align), zk::error);
    EXPECT_THROW(ranks_for_rate(s, -0.01, align), zk::error);
    EXPECT_THROW(ranks_for_rate(s, NAN, align), zk::error);
}

TEST(Ranks, UniformMode) {
    zack_spectra s = one_head(std::vector<double>(64, 1.0), std::vector<double>(64, 1.0));
    s.n_layer = 1;
    zack_ranks r = ranks_for_rate(s, 0.5, 4, true);
    EXPECT_EQ(r.k[0], 32);
    EXPECT_EQ(r.v[0], 32);
    EXPECT_DOUBLE_EQ(r.rate, 0.5);
    r = ranks_for_rate(s, 0.3, 4, true);  // 1 - r/64 >= 0.3 -> r <= 44.8 -> 44
    EXPECT_EQ(r.k[0], 44);
    EXPECT_EQ(r.eps, -1);
    r = ranks_for_rate(s, 0.0, 4, true);
    EXPECT_EQ(r.k[0], 64);
    r = ranks_for_rate(s, 0.9375, 4, true);
    EXPECT_EQ(r.k[0], 4);
}

TEST(Fold, AttentionUnchangedAtFullRankAndTruncatesCleanly) {
    // Tiny attention layer: E = 16, 2 KV heads of d = 8, 4 query heads (group 2).
    std::mt19937_64 rng(11);
    std::normal_distribution<double> N(0, 1);
    const int E = 16, KV = 2, H = 4, D = 8, G = H / KV, T = 5;
    std::vector<float> wv((size_t)KV * D * E), wo((size_t)E * H * D), bv((size_t)KV * D), x((size_t)T * E);
    for (auto* v : {&wv, &wo, &bv, &x})
        for (auto& e : *v) e = (float)N(rng);
    std::vector<double> rv;
    for (int g = 0; g < KV; g++) {
        auto q = random_orthogonal(D, rng);
        rv.insert(rv.end(), q.begin(), q.end());
    }
    // Fixed attention weights per query head (softmax output stand-in) [H x T x T].
    std::vector<double> A((size_t)H * T * T);
    for (auto& a : A) a = std::fabs(N(rng));

    // out[t] = sum_i W_o[:, i] (sum_s A_i[t][s] v_{g(i)}(s)), v = W_v x + b_v; at rank r
    // only the first r components of each (rotated) value are used.
    auto run = [&](const std::vector<float>& WV, const std::vector<float>& B, const std::vector<float>& WO, int r) {
        std::vector<double> v((size_t)T * KV * D, 0.0), out((size_t)T * E, 0.0);
        for (int t = 0; t < T; t++)
            for (int row = 0; row < KV * D; row++) {
                double acc = B[row];
                for (int e = 0; e < E; e++) acc += (double)WV[(size_t)row * E + e] * x[(size_t)t * E + e];
                v[(size_t)t * KV * D + row] = acc;
            }
        for (int i = 0; i < H; i++)
            for (int t = 0; t < T; t++) {
                std::vector<double> o(D, 0.0);
                for (int s2 = 0; s2 < T; s2++)
                    for (int c = 0; c < r; c++) o[c] += A[((size_t)i * T + t) * T + s2] * v[(size_t)s2 * KV * D + (i / G) * D + c];
                for (int e = 0; e < E; e++)
                    for (int c = 0; c < r; c++) out[(size_t)t * E + e] += (double)WO[(size_t)e * H * D + i * D + c] * o[c];
            }
        return out;
    };
    const std::vector<double> ref = run(wv, bv, wo, D);
    std::vector<float> fv = wv, fb = bv, fo = wo;
    fold_wv(fv.data(), fb.data(), rv.data(), KV, D, E);
    fold_wo(fo.data(), rv.data(), H, KV, D, E);
    const std::vector<double> got = run(fv, fb, fo, D);
    double scale = 0;
    for (double r0 : ref) scale = std::max(scale, std::fabs(r0));
    for (size_t i = 0; i < ref.size(); i++) EXPECT_NEAR(got[i], ref[i], 1e-5 * scale) << i;
    // Folded v is R^T v: component j is v . direction j.
    for (int g = 0; g < KV; g++)
        for (int j = 0; j < D; j++)
            for (int e = 0; e < E; e++) {
                double want = 0;
                for (int i = 0; i < D; i++) want += rv[(size_t)g * D * D + i * D + j] * wv[((size_t)g * D + i) * E + e];
                EXPECT_NEAR(fv[((size_t)g * D + j) * E + e], want, 1e-5);
            }
    // At rank r the folded model equals projecting each value onto the first r
    // directions: truncating with the identity rotation and no fold gives the same only
    // when R = I, so compare against the explicit projection instead.
    const int r = 3;
    std::vector<float> pv = wv, pb = bv;  // W_v,g <- P W_v,g with P = R_r R_r^T
    for (int g = 0; g < KV; g++) {
        const double* R = rv.data() + (size_t)g * D * D;
        for (int e = 0; e <= E; e++) {
            std::vector<double> col(D), proj(D, 0.0);
            for (int i = 0; i < D; i++) col[i] = e < E ? wv[((size_t)g * D + i) * E + e] : bv[(size_t)g * D + i];
            for (int a = 0; a < D; a++)
                for (int c = 0; c < r; c++)
                    for (int b = 0; b < D; b++) proj[a] += R[a * D + c] * R[b * D + c] * col[b];
            for (int i = 0; i < D; i++) (e < E ? pv[((size_t)g * D + i) * E + e] : pb[(size_t)g * D + i]) = (float)proj[i];
        }
    }
    const std::vector<double> ref_r = run(pv, pb, wo, D);
    const std::vector<double> got_r = run(fv, fb, fo, r);
    for (size_t i = 0; i < ref_r.size(); i++) EXPECT_NEAR(got_r[i], ref_r[i], 1e-5 * scale) << i;
}

TEST(Fold, OutputTypes) {
    EXPECT_EQ(fold_output_type(dtype::Q4_1, 576), dtype::Q8_0);
    EXPECT_EQ(fold_output_type(dtype::Q4_0, 576), dtype::Q8_0);
    EXPECT_EQ(fold_output_type(dtype::Q4_K, 576), dtype::Q8_0);
    EXPECT_EQ(fold_output_type(dtype::Q8_0, 576), dtype::Q8_0);
    EXPECT_EQ(fold_output_type(dtype::F16, 576), dtype::F16);
    EXPECT_EQ(fold_output_type(dtype::BF16, 576), dtype::BF16);
    EXPECT_EQ(fold_output_type(dtype::F32, 576), dtype::F32);
    EXPECT_EQ(fold_output_type(dtype::Q4_0, 80), dtype::F16);
    for (dtype t : {dtype::Q5_0, dtype::Q5_1, dtype::IQ4_NL, dtype::Q2_K, dtype::Q3_K, dtype::Q5_K, dtype::Q6_K}) {
        EXPECT_EQ(fold_output_type(t, 896), dtype::Q8_0) << dtype_name(t);
        EXPECT_EQ(fold_output_type(t, 80), dtype::F16) << dtype_name(t);
    }
    EXPECT_THROW(fold_output_type(dtype::Q8_K, 256), zk::error);
}

TEST(Compare, ProjectorDistance) {
    std::mt19937_64 rng(5);
    const int d = 16;
    const auto R = random_orthogonal(d, rng);
    EXPECT_EQ(compare_projector_distance(R.data(), R.data(), d, 5), 0.0);
    // Flipping signs and swapping two columns inside the kept block changes nothing.
    std::vector<double> S = R;
    for (int i = 0; i < d; i++) {
        S[i * d + 0] = -R[i * d + 0];
        std::swap(S[i * d + 1], S[i * d + 2]);
    }
    EXPECT_NEAR(compare_projector_distance(R.data(), S.data(), d, 5), 0.0, 1e-12);
    // Swapping a kept and a dropped direction: ||P_a - P_b||^2 = 2, over 2r.
    S = R;
    for (int i = 0; i < d; i++) std::swap(S[i * d + 0], S[i * d + 10]);
    EXPECT_NEAR(compare_projector_distance(R.data(), S.data(), d, 4), std::sqrt(2.0 / 8.0), 1e-12);
}
