// Rank allocation by measured loss (calib/alloc.h): the dynamic programme
// against brute force over every combination on small random instances, its
// rate and loss bookkeeping, and the bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "calib/alloc.h"
#include "ggml-like/error.h"

namespace {

// Random curves: losses decreasing in rank (not necessarily convex), 0 at d.
zk::rank_curves random_curves(int n_layer, int n_kv, int d, std::vector<int> grid, int n_bases, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<double> u(0.0, 1.0);
    zk::rank_curves c;
    c.n_layer = n_layer, c.n_kv = n_kv, c.d = d;
    c.grid = grid;
    const size_t nr = grid.size();
    auto fill = [&](std::vector<double>& l) {
        l.assign((size_t)n_layer * n_kv * nr, 0.0);
        for (int h = 0; h < n_layer * n_kv; h++) {
            double x = 0;
            for (int r = (int)nr - 2; r >= 0; r--) l[h * nr + r] = x += u(rng) * u(rng) * 3;
        }
    };
    for (int b = 0; b < n_bases; b++) fill(c.loss_k[b]);
    fill(c.loss_v);
    return c;
}

// The least summed loss over every combination of options within the budget of dims.
double brute_force(const zk::rank_curves& c, int n_bases, int64_t max_dims, int64_t* used) {
    const int nh = c.n_layer * c.n_kv, nr = (int)c.grid.size();
    double best = std::numeric_limits<double>::infinity();
    std::function<void(int, int64_t, double)> rec = [&](int item, int64_t dims, double loss) {
        if (dims > max_dims) return;
        if (item == 2 * nh) {
            if (loss < best - 1e-12 || (std::fabs(loss - best) <= 1e-12 && dims < *used)) best = loss, *used = dims;
            return;
        }
        const bool k = item < nh;
        for (int b = 0; b < (k ? n_bases : 1); b++)
            for (int r = 0; r < nr; r++) {
                const double l = (k ? c.loss_k[b] : c.loss_v)[(size_t)(item % nh) * nr + r];
                rec(item + 1, dims + c.grid[r], loss + l);
            }
    };
    rec(0, 0, 0.0);
    return best;
}

TEST(Alloc, MatchesBruteForce) {
    for (uint32_t seed = 1; seed <= 12; seed++) {
        const int n_bases = 1 + seed % 3;
        const zk::rank_curves c = random_curves(2, 1, 8, {2, 4, 6, 8}, n_bases, seed);
        for (double rate : {0.0, 0.2, 0.4, 0.5, 0.7}) {
            const zk::zack_ranks r = zk::ranks_by_loss(c, rate, 7u);
            const int64_t max_dims = (int64_t)std::floor((1.0 - rate) * 4 * 8 + 1e-9);
            int64_t used = std::numeric_limits<int64_t>::max();
            const double bf = brute_force(c, n_bases, max_dims, &used);
            EXPECT_NEAR(r.loss, bf, 1e-9) << "seed " << seed << " rate " << rate;
            EXPECT_NEAR(zk::ranks_loss(c, r.k, r.v, r.kb), r.loss, 1e-9);
            EXPECT_GE(r.rate, rate - 1e-12);
            for (int b : r.kb) EXPECT_LT(b, n_bases);
        }
    }
}

TEST(Alloc, RateZeroIsLossless) {
    const zk::rank_curves c = random_curves(3, 2, 16, {4, 8, 12, 16}, 1, 7);
    const zk::zack_ranks r = zk::ranks_by_loss(c, 0.0);
    EXPECT_EQ(r.loss, 0.0);
    for (size_t i = 0; i < r.k.size(); i++) EXPECT_EQ(r.k[i] + r.v[i], 32);
    EXPECT_EQ(r.rate, 0.0);
}

TEST(Alloc, SpendsWhereLossIsHigh) {
    // One head whose keys lose a lot below full rank, the rest cheap: at rate 0.25
    // the sensitive head keeps full rank.
    zk::rank_curves c;
    c.n_layer = 4, c.n_kv = 1, c.d = 8;
    c.grid = {4, 8};
    c.loss_k[0] = {1.0, 0, 100.0, 0, 1.0, 0, 1.0, 0};  // layer 1 is sensitive
    c.loss_v = {1.0, 0, 1.0, 0, 1.0, 0, 1.0, 0};
    const zk::zack_ranks r = zk::ranks_by_loss(c, 0.25);
    EXPECT_EQ(r.k[1], 8);
    EXPECT_NEAR(r.rate, 0.25, 1e-12);
    EXPECT_NEAR(r.loss, 4.0, 1e-12);  // four of the seven cheap items halve
}

TEST(Alloc, Interpolates) {
    zk::rank_curves c;
    c.n_layer = 1, c.n_kv = 1, c.d = 8;
    c.grid = {2, 6, 8};
    c.loss_k[0] = {4.0, 2.0, 0.0};
    c.loss_v = {4.0, 2.0, 0.0};
    EXPECT_DOUBLE_EQ(zk::rank_curve_at(c, c.loss_k[0], 0, 0, 4), 3.0);
    EXPECT_DOUBLE_EQ(zk::rank_curve_at(c, c.loss_k[0], 0, 0, 7), 1.0);
    EXPECT_DOUBLE_EQ(zk::rank_curve_at(c, c.loss_k[0], 0, 0, 1), 4.0);
    EXPECT_DOUBLE_EQ(zk::rank_curve_at(c, c.loss_k[0], 0, 0, 8), 0.0);
}

TEST(Alloc, BadInput) {
    zk::rank_curves c = random_curves(2, 1, 8, {2, 4, 6, 8}, 1, 3);
    EXPECT_THROW(zk::ranks_by_loss(c, 1.0), zk::error);
    EXPECT_THROW(zk::ranks_by_loss(c, -0.1), zk::error);
    EXPECT_THROW(zk::ranks_by_loss(c, 0.8), zk::error);  // above 1 - 2/8
    EXPECT_THROW(zk::ranks_by_loss(c, 0.3, 2u), zk::error);  // no score curves
    zk::rank_curves bad = c;
    bad.loss_v[1] = -1;
    EXPECT_THROW(bad.validate(), zk::error);
    bad = c;
    bad.loss_k[0][0] = std::nan("");
    EXPECT_THROW(bad.validate(), zk::error);
    bad = c;
    bad.grid = {2, 4, 8, 6};
    EXPECT_THROW(bad.validate(), zk::error);
    bad = c;
    bad.grid = {2, 4, 6, 7};
    EXPECT_THROW(bad.validate(), zk::error);
    bad = c;
    bad.loss_v.pop_back();
    EXPECT_THROW(bad.validate(), zk::error);
    EXPECT_THROW(zk::rank_alloc_from_name("eps"), zk::error);
    EXPECT_EQ(zk::rank_alloc_from_name("uniform"), zk::rank_alloc::UNIFORM);
}

}  // namespace
