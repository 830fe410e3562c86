// Key bases (calib/keybasis.h) and the square SVD (calib/eigen.h): A B^T = I,
// the score basis is at least as good as PCA for the score error it targets
// at every rank, the pairs basis keeps whole RoPE pairs, ordered by energy.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "calib/eigen.h"
#include "calib/keybasis.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace {

using mat = std::vector<double>;

mat matmul(int n, const mat& a, const mat& b, bool ta = false, bool tb = false) {
    mat c((size_t)n * n, 0.0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = 0;
            for (int k = 0; k < n; k++) s += (ta ? a[k * n + i] : a[i * n + k]) * (tb ? b[j * n + k] : b[k * n + j]);
            c[i * n + j] = s;
        }
    return c;
}

// A random SPD matrix with a spread spectrum: M M^T / n + small ridge.
mat random_spd(int n, std::mt19937& rng, double spread) {
    std::normal_distribution<double> g(0.0, 1.0);
    mat m((size_t)n * n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) m[i * n + j] = g(rng) * std::pow(spread, -double(j) / n);
    mat c = matmul(n, m, m, false, true);
    for (int i = 0; i < n; i++) c[i * n + i] += 1e-3;
    return c;
}

// E (q^T (I - A_r B_r^T) k)^2 for independent q ~ C_q, k ~ C_k: tr(M^T C_q M C_k) with M = I - A_r B_r^T.
double score_error(int n, const mat& Cq, const mat& Ck, const mat& A, const mat& B, int r) {
    mat M((size_t)n * n, 0.0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double s = i == j ? 1.0 : 0.0;
            for (int c = 0; c < r; c++) s -= A[i * n + c] * B[j * n + c];
            M[i * n + j] = s;
        }
    const mat t = matmul(n, matmul(n, M, Cq, true, false), matmul(n, M, Ck), false, false);
    double tr = 0;
    for (int i = 0; i < n; i++) tr += t[i * n + i];
    return tr;
}

TEST(Svd, Reconstructs) {
    std::mt19937 rng(5);
    std::normal_distribution<double> g(0.0, 1.0);
    const int n = 12;
    mat w((size_t)n * n);
    for (double& x : w) x = g(rng);
    mat U, S, V;
    zk::svd_square_desc(n, w.data(), U, S, V);
    for (int j = 1; j < n; j++) EXPECT_GE(S[j - 1], S[j]);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double r = 0, uu = 0, vv = 0;
            for (int k = 0; k < n; k++) {
                r += U[i * n + k] * S[k] * V[j * n + k];
                uu += U[k * n + i] * U[k * n + j];
                vv += V[k * n + i] * V[k * n + j];
            }
            EXPECT_NEAR(r, w[i * n + j], 1e-10);
            EXPECT_NEAR(uu, i == j, 1e-10);
            EXPECT_NEAR(vv, i == j, 1e-10);
        }
}

TEST(KeyBasis, ScoreIsExactAtFullRankAndBeatsPca) {
    std::mt19937 rng(11);
    const int n = 16;
    for (int trial = 0; trial < 4; trial++) {
        // Queries and keys with different dominant directions: PCA of C_q + C_k keeps
        // directions of one side that cannot change a score.
        const mat Cq = random_spd(n, rng, 50.0), Ck = random_spd(n, rng, 50.0);
        mat A, B, sv;
        zk::keybasis_score(n, Cq.data(), Ck.data(), A, B, sv);
        const mat ab = matmul(n, A, B, false, true);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) EXPECT_NEAR(ab[i * n + j], i == j ? 1.0 : 0.0, 1e-6);
        for (int j = 1; j < n; j++) EXPECT_GE(sv[j - 1], sv[j]);
        mat sum(Cq);
        for (size_t i = 0; i < sum.size(); i++) sum[i] += Ck[i];
        mat lam, R;
        zk::eigen_sym_desc(n, sum.data(), lam, R);
        for (int r = 1; r < n; r++) {
            const double e_score = score_error(n, Cq, Ck, A, B, r);
            const double e_pca = score_error(n, Cq, Ck, R, R, r);
            EXPECT_LE(e_score, e_pca * (1 + 1e-6) + 1e-12) << "trial " << trial << " rank " << r;
        }
        EXPECT_NEAR(score_error(n, Cq, Ck, A, B, n), 0.0, 1e-6 * score_error(n, Cq, Ck, A, B, 0));
    }
}

TEST(KeyBasis, PairsKeepWholePairsByEnergy) {
    std::mt19937 rng(3);
    const int n = 12;
    const mat Cq = random_spd(n, rng, 20.0), Ck = random_spd(n, rng, 20.0);
    for (zk::rope_style st : {zk::rope_style::NEOX, zk::rope_style::NORM}) {
        zk::rope_params rp;
        rp.n_dims = 8;  // channels 8..11 do not rotate
        rp.style = st;
        mat P, e;
        zk::keybasis_pairs(n, rp, Cq.data(), Ck.data(), P, e);
        std::vector<int> chan(n, -1);
        for (int j = 0; j < n; j++) {
            int ones = 0;
            for (int i = 0; i < n; i++) {
                EXPECT_TRUE(P[i * n + j] == 0.0 || P[i * n + j] == 1.0);
                if (P[i * n + j] == 1.0) ones++, chan[j] = i;
            }
            EXPECT_EQ(ones, 1);
        }
        for (int j = 1; j < n; j++) EXPECT_GE(e[j - 1], e[j] - 1e-12);
        // a rotated channel's partner directly follows it
        for (int j = 0; j < n;) {
            const int c = chan[j];
            if (c >= rp.n_dims) { j++; continue; }
            const int partner = st == zk::rope_style::NEOX ? (c < 4 ? c + 4 : c - 4) : (c ^ 1);
            ASSERT_LT(j + 1, n);
            EXPECT_EQ(chan[j + 1], partner);
            j += 2;
        }
    }
    EXPECT_THROW(zk::key_basis_from_name("svd"), zk::error);
    EXPECT_EQ(zk::key_basis_from_name("pairs"), zk::key_basis::PAIRS);
}

// The quantization scores sqrt(p^T Cq p) x p^T Cw p, and the order they give:
// descending, ties in direction order; a permutation of 0 .. n-1.
TEST(KeyBasis, QuantOrderByQueryRmsTimesWithinGroupVariance) {
    std::mt19937 rng(9);
    const int n = 10;
    // the identity basis with diagonal statistics: the order by hand
    mat I((size_t)n * n, 0.0), Cq((size_t)n * n, 0.0), Cw((size_t)n * n, 0.0);
    const double q[n] = {4, 1, 9, 16, 1, 0, 25, 1, 4, 1};   // query energy (sqrt: 2 1 3 4 1 0 5 1 2 1)
    const double w[n] = {1, 8, 1, 0.5, 2, 100, 0.2, 3, 1, 2};  // within-group variance
    for (int i = 0; i < n; i++) I[i * n + i] = 1, Cq[i * n + i] = q[i], Cw[i * n + i] = w[i];
    // scores 2 8 3 2 2 0 1 3 2 2: 1, then 2 and 7, then 0 3 4 8 9 (ties by index), 6, 5
    std::vector<double> score;
    std::vector<int32_t> order;
    zk::keybasis_quant_scores(n, I.data(), Cq.data(), Cw.data(), score);
    for (int i = 0; i < n; i++) EXPECT_DOUBLE_EQ(score[i], std::sqrt(q[i]) * w[i]) << i;
    zk::zack_key_order(n, score.data(), order);
    EXPECT_EQ(order, (std::vector<int32_t>{1, 2, 7, 0, 3, 4, 8, 9, 6, 5}));
    // a rotated basis: the same scores from p^T C p, checked against explicit products
    const mat C1 = random_spd(n, rng, 30.0), C2 = random_spd(n, rng, 30.0);
    mat P, lam;
    zk::eigen_sym_desc(n, C1.data(), lam, P);  // an orthonormal basis, column j = direction j
    zk::keybasis_quant_scores(n, P.data(), C1.data(), C2.data(), score);
    zk::zack_key_order(n, score.data(), order);
    std::vector<int> seen(n, 0);
    for (int j : order) ASSERT_TRUE(j >= 0 && j < n && !seen[j]++);
    auto by_hand = [&](int j) {
        double a = 0, b = 0;
        for (int x = 0; x < n; x++)
            for (int y = 0; y < n; y++) {
                a += P[x * n + j] * C1[x * n + y] * P[y * n + j];
                b += P[x * n + j] * C2[x * n + y] * P[y * n + j];
            }
        return std::sqrt(a) * b;
    };
    for (int j = 0; j < n; j++) EXPECT_NEAR(score[j], by_hand(j), 1e-9 * by_hand(j)) << j;
    for (int i = 0; i + 1 < n; i++) EXPECT_GE(score[order[i]], score[order[i + 1]]) << i;
}

// The quantization pair (keybasis_quant_pair): A B^T = I; the keys' within-group
// scatter is the identity along it (B^T C_w B = I: one unit a direction, no
// cross terms; to 1e-5, the whitening's ridge) and C_q^1/2 diagonal (A^T C_q^1/2 A); the proxy is
// sqrt(a^T C_q a) x b^T C_w b, descending. With diagonal statistics the pair is
// a scaled permutation of the axes, in the order keybasis_quant_scores gives them.
TEST(KeyBasis, QuantPairWhitensTheWithinGroupScatter) {
    std::mt19937 rng(5);
    const int n = 12;
    for (int trial = 0; trial < 3; trial++) {
        // (well conditioned: the whitening's ridge, 1e-6 of the mean eigenvalue,
        // moves the products by about ridge / smallest eigenvalue)
        mat Cq = random_spd(n, rng, 6.0), Cw = random_spd(n, rng, 6.0);
        for (int i = 0; i < n; i++) Cq[i * n + i] += 1.0, Cw[i * n + i] += 1.0;
        mat A, B, score;
        zk::keybasis_quant_pair(n, Cq.data(), Cw.data(), A, B, score);
        const mat ab = matmul(n, A, B, false, true);
        const mat bwb = matmul(n, B, matmul(n, Cw, B), true, false);
        mat lam, U, half((size_t)n * n, 0.0);
        zk::eigen_sym_desc(n, Cq.data(), lam, U);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                for (int k = 0; k < n; k++) half[i * n + j] += U[i * n + k] * std::sqrt(lam[k]) * U[j * n + k];
        const mat aqa = matmul(n, A, matmul(n, half, A), true, false);
        const mat aca = matmul(n, A, matmul(n, Cq, A), true, false);
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) {
                EXPECT_NEAR(ab[i * n + j], i == j ? 1.0 : 0.0, 1e-6) << trial;
                EXPECT_NEAR(bwb[i * n + j], i == j ? 1.0 : 0.0, 1e-5) << trial;
                if (i != j) EXPECT_NEAR(aqa[i * n + j], 0.0, 1e-5 * std::sqrt(aqa[i * n + i] * aqa[j * n + j]));
            }
        for (int j = 0; j < n; j++) EXPECT_NEAR(score[j], std::sqrt(aca[j * n + j]) * bwb[j * n + j], 1e-9 * score[j]);
        for (int j = 1; j < n; j++) EXPECT_GE(score[j - 1], score[j]) << trial;
    }
    // diagonal statistics: the axes, scaled, in the proxy's order
    // along axis i at unit within-group scale the proxy is sqrt(q_i w_i) x 1: q w = 4 8 9 12 2 5
    const double q[6] = {4, 1, 9, 16, 1, 25}, w[6] = {1, 8, 1, 0.75, 2, 0.2};
    mat Cq(36, 0.0), Cw(36, 0.0);
    for (int i = 0; i < 6; i++) Cq[i * 6 + i] = q[i], Cw[i * 6 + i] = w[i];
    mat A, B, score;
    zk::keybasis_quant_pair(6, Cq.data(), Cw.data(), A, B, score);
    const int axis[6] = {3, 2, 1, 5, 0, 4};
    for (int j = 0; j < 6; j++) {
        const int a = axis[j];
        EXPECT_NEAR(score[j], std::sqrt(q[a] * w[a]), 1e-9) << j;
        for (int i = 0; i < 6; i++) {
            EXPECT_NEAR(std::fabs(B[i * 6 + j]), i == a ? 1 / std::sqrt(w[a]) : 0.0, 1e-9) << i << " " << j;
            EXPECT_NEAR(std::fabs(A[i * 6 + j]), i == a ? std::sqrt(w[a]) : 0.0, 1e-9) << i << " " << j;
        }
    }
}

}  // namespace

namespace {

// Per-head widths by hand (calib/keybasis.h keybasis_key_widths): costs 0.25,
// 1.5, 2.5 and 4.5 bits a channel at 0, 1, 2 and 4 bits; a step's gain is the
// score times f(w) - f(w') (f = 1, 0.30, 0.08, 0.005) per bit it costs, so a
// 0 -> 1 step gains 0.56 s, a 1 -> 2 step 0.22 s and a 2 -> 4 step 0.0375 s.
// Counts {n4, n2, n1, n0}.
TEST(KeyBasis, WidthsWaterFillByHand) {
    auto widths = [](std::vector<float> s, double bits, int max_tail, bool two_bit = true) {
        const zk::key_widths w = zk::keybasis_key_widths((int)s.size(), s.data(), bits, max_tail, two_bit);
        return std::vector<int>{w.n4, w.n2, w.n1, w.n0};
    };
    // 6 bits (1.0 at 0 bits): ch0 to 1 bit (4.48, 2.25), ch1 to 1 (2.24, 3.5),
    // ch0 to 2 (1.76, 4.5), ch2 to 1 (1.12, 5.75); nothing else fits
    EXPECT_EQ(widths({8, 4, 2, 1}, 6.0, 128), (std::vector<int>{0, 1, 2, 1}));
    // 7 bits: then ch1 to 2 (0.88, 6.75); ch3's 1-bit step (8.0) does not fit
    EXPECT_EQ(widths({8, 4, 2, 1}, 7.0, 128), (std::vector<int>{0, 2, 1, 1}));
    // 10 bits: then ch3 to 1 (0.56, 8.0), ch2 to 2 (0.44, 9.0), ch3 to 2 (0.22,
    // 10.0) before ch0's 4-bit step (0.30 but 2 bits: 11.0)
    EXPECT_EQ(widths({8, 4, 2, 1}, 10.0, 128), (std::vector<int>{0, 4, 0, 0}));
    // 12 bits: then ch0 to 4 (12.0)
    EXPECT_EQ(widths({8, 4, 2, 1}, 12.0, 128), (std::vector<int>{1, 3, 0, 0}));
    // two strong channels: both to 2 bits (5.5), then both to 4 (0.30 and 0.15 x
    // 2 bits: 9.5) before the weak ones' first bit (0.0056): they stay at 0
    EXPECT_EQ(widths({8, 4, 0.01f, 0.001f}, 10.0, 128), (std::vector<int>{2, 0, 0, 2}));
    // at most 1 tail channel at 6 bits: ch0 goes on to 2 bits before ch1 takes
    // the tail (4.5), ch1 to 2 (5.5), and ch2's 1-bit step no longer fits
    EXPECT_EQ(widths({8, 4, 2, 1}, 6.0, 1), (std::vector<int>{0, 2, 0, 2}));
    // without the 2-bit width (older files' rows): 1 -> 4 bits in one step of 3
    // bits gaining 0.0983 s. 7 bits: every channel to 1 bit (6.0)
    EXPECT_EQ(widths({8, 4, 2, 1}, 7.0, 128, false), (std::vector<int>{0, 0, 4, 0}));
    // 10 bits: three to 1 bit (4.75), the first to 4 (its 0.787 beats the last's 0.56: 7.75), the last to 1 (9.0)
    EXPECT_EQ(widths({8, 4, 2, 1}, 10.0, 128, false), (std::vector<int>{1, 0, 3, 0}));
    EXPECT_EQ(widths({8, 4, 0.01f, 0.001f}, 7.0, 128, false), (std::vector<int>{1, 0, 1, 2}));
    EXPECT_EQ(widths({8, 4, 2, 1}, 7.0, 2, false), (std::vector<int>{1, 0, 1, 2}));
    // KIVI groups of 64: grids cost half as much a channel (0.125, 1.25, 2.25, 4.25 bits) and code
    // worse (f = 1, 0.31, 0.09, 0.006). 7 bits (0.5 at 0 bits): ch0 to 1 bit (4.91 a bit, 1.625),
    // ch1 to 1 (2.45, 2.75), ch0 to 2 (1.76, 3.75), ch2 to 1 (1.23, 4.875), ch1 to 2 (0.88, 5.875),
    // ch3 to 1 (0.61, 7.0), where groups of 32 left ch3 at 0 bits
    auto widths64 = [](std::vector<float> s, double bits) {
        const zk::key_widths w = zk::keybasis_key_widths((int)s.size(), s.data(), bits, 128, true, 64);
        return std::vector<int>{w.n4, w.n2, w.n1, w.n0};
    };
    EXPECT_EQ(widths64({8, 4, 2, 1}, 7.0), (std::vector<int>{0, 2, 2, 0}));
    EXPECT_EQ(widths64({8, 4, 2, 1}, 6.0), (std::vector<int>{0, 2, 1, 1}));
    {
        const std::vector<float> s = {8, 4, 2, 1};
        EXPECT_THROW(zk::keybasis_key_widths(4, s.data(), 7.0, 128, true, 48), zk::error);
    }
    // per head in any order: the same counts as the sorted scores give
    const std::vector<float> two = {1, 8, 2, 4, /* head 2: */ 0.001f, 4, 8, 0.01f};
    const zk::key_wide_rows rows = zk::keybasis_wide_rows(4, 2, two.data());
    ASSERT_EQ(zk::k_key_n_wide, 4);
    ASSERT_EQ(zk::k_key_wide_bits[2], 1.75);  // 7 bits a row of 4
    ASSERT_EQ(zk::k_key_wide_bits[3], 2.5);   // 10 bits
    ASSERT_TRUE(zk::k_key_wide_two_bit[2] && zk::k_key_wide_two_bit[3]);
    ASSERT_FALSE(zk::k_key_wide_two_bit[0] || zk::k_key_wide_two_bit[1]);
    auto counts = [](const zk::key_widths& w) { return std::vector<int>{w.n4, w.n2, w.n1, w.n0}; };
    EXPECT_EQ(counts(rows[2][0]), (std::vector<int>{0, 2, 1, 1}));
    EXPECT_EQ(counts(rows[3][0]), (std::vector<int>{0, 4, 0, 0}));
    EXPECT_EQ(counts(rows[3][1]), (std::vector<int>{2, 0, 0, 2}));
    EXPECT_EQ(counts(rows[0][0]), (std::vector<int>{0, 0, 4, 0}));
    EXPECT_EQ(counts(rows[0][1]), (std::vector<int>{1, 0, 1, 2}));
    // the double form rounds to f32 first: the same counts
    const zk::key_wide_rows again = zk::keybasis_wide_rows(4, std::vector<double>(two.begin(), two.end()));
    for (int w = 0; w < zk::k_key_n_wide; w++)
        for (int h = 0; h < 2; h++) EXPECT_EQ(counts(again[w][h]), counts(rows[w][h]));
    // and for groups of 64, each head's counts are keybasis_key_widths's at 64
    const zk::key_wide_rows rows64 = zk::keybasis_wide_rows(4, 2, two.data(), 64);
    EXPECT_EQ(counts(rows64[2][0]), (std::vector<int>{0, 2, 2, 0}));
    EXPECT_EQ(counts(rows64[2][0]), widths64({8, 4, 2, 1}, 7.0));
}

}  // namespace
