// Key bases (calib/keybasis.h) and the square SVD (calib/eigen.h): A B^T = I,
// the score basis is at least as good as PCA for the score error it targets
// at every rank, the pairs basis keeps whole RoPE pairs, ordered by energy.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "calib/eigen.h"
#include "calib/keybasis.h"
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

}  // namespace
