// Rank allocation by measured loss: given, for every (layer, KV head) and each
// of K and V, a loss curve over a grid of candidate ranks (calib/sensitivity.h),
// choose every head's ranks to minimise the summed loss under a budget of
// dimensions (the overall rate rho = 1 - sum(r_k + r_v) / (n_layer n_kv 2 d)).
//
// Exact: a knapsack over the 2 n_layer n_kv (head, K|V) items, each taking one
// rank of the grid, solved by dynamic programming on the budget counted in
// units of the grid's greatest common divisor. The summed loss assumes heads
// contribute independently (measured: tests/test_alloc*, the allocation note in
// bench/RESULTS.md).
#pragma once
#include <string>
#include <vector>

#include "calib/ranks.h"

namespace zk {

struct rank_curves {
    int n_layer = 0, n_kv = 0, d = 0;
    std::vector<int> grid;             // candidate ranks, ascending, last = d
    std::vector<double> loss_k;        // [n_layer x n_kv x n_grid], loss 0 at rank d
    std::vector<double> loss_v;
    // Throws zk::error naming the problem (sizes, non-finite or negative losses, grid).
    void validate() const;
};

// Ranks for the requested overall rate (0 <= rate < 1), minimising the summed
// loss. The achieved rate is the smallest the grid allows at >= rate. Throws
// when the rate is above what the grid's smallest rank reaches.
zack_ranks ranks_by_loss(const rank_curves& c, double rate);
// The summed loss of given ranks (interpolated linearly between grid points).
double ranks_loss(const rank_curves& c, const std::vector<int>& k, const std::vector<int>& v);
// Loss of one curve at rank r (linear between grid points, 0 at d).
double rank_curve_at(const rank_curves& c, const std::vector<double>& loss, int layer, int g, int r);

// The allocations `--kv-alloc` names: sensitivity (by measured loss; needs
// curves), sigma (the paper's removal rate eps), uniform (one rank everywhere).
enum class rank_alloc { SENSITIVITY, SIGMA, UNIFORM };
rank_alloc rank_alloc_from_name(const std::string& s);  // throws on an unknown name
const char* rank_alloc_name(rank_alloc a);

}  // namespace zk
