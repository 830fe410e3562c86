// Rank allocation by measured loss: given, for every (layer, KV head), loss
// curves over a grid of candidate ranks for its keys (in each key basis that
// was measured, calib/keybasis.h) and its values (calib/sensitivity.h), choose
// every head's key basis and ranks to minimise the summed loss under a budget
// of dimensions (the overall rate rho = 1 - sum(r_k + r_v) / (n_layer n_kv 2 d)).
//
// Exact: a knapsack over the 2 n_layer n_kv (head, K|V) items, each taking one
// option (key basis, rank) of its curves, solved by dynamic programming on the
// budget counted in units of the grid's greatest common divisor. The summed
// loss assumes heads contribute independently; what that predicts is checked
// against end-to-end KL in tests/test_alloc_model.cpp and bench/RESULTS.md.
#pragma once
#include <string>
#include <vector>

#include "calib/ranks.h"

namespace zk {

struct model;

struct rank_curves {
    int n_layer = 0, n_kv = 0, d = 0;
    std::vector<int> grid;             // candidate ranks, ascending, last = d
    std::vector<double> loss_k[3];     // per key basis [n_layer x n_kv x n_grid]; empty = not measured
    std::vector<double> loss_v;        // [n_layer x n_kv x n_grid]; loss 0 at rank d
    // Throws zk::error naming the problem (sizes, non-finite or negative losses, grid).
    void validate() const;
    // The curves a .zack file carries; throws when it has none.
    static rank_curves from_model(const model& m);
};

// The multiple-choice knapsack: one option per item, each with an integer cost
// and a loss, least summed loss with summed cost <= budget (at equal loss, the
// least cost). Exact, by dynamic programming over the budget after dropping
// each item's dominated options (another costs no more and loses no more).
// Returns the chosen option of every item; throws when even the cheapest
// choices exceed the budget. O(items x options x budget) time,
// O(items x budget) memory.
struct knap_option {
    int64_t cost;
    double loss;
};
std::vector<int> alloc_knapsack(const std::vector<std::vector<knap_option>>& items, int64_t budget);

// Ranks for the requested overall rate (0 <= rate < 1), minimising the summed
// loss over the key bases in `key_bases` (bit b = basis b; bases without curves
// are skipped; at least one must remain). The achieved rate is the smallest the
// grid allows at >= rate. Throws when the rate is above what the grid reaches.
zack_ranks ranks_by_loss(const rank_curves& c, double rate, unsigned key_bases = 1u);
// The summed loss of given ranks (linear between grid points); kb empty = pca.
double ranks_loss(const rank_curves& c, const std::vector<int>& k, const std::vector<int>& v,
                  const std::vector<int>& kb = {});
// Loss of one curve at rank r (linear between grid points, 0 at d; below the
// grid: the smallest rank's loss).
double rank_curve_at(const rank_curves& c, const std::vector<double>& loss, int layer, int g, int r);

// The allocations `--kv-alloc` names: sensitivity (by measured loss; needs
// curves), sigma (the paper's removal rate eps), uniform (one rank everywhere).
enum class rank_alloc { SENSITIVITY, SIGMA, UNIFORM };
rank_alloc rank_alloc_from_name(const std::string& s);  // throws on an unknown name
const char* rank_alloc_name(rank_alloc a);

// What a user asks for: a rate (or eps) and how to allocate it. key_basis: -1 =
// choose per head (sensitivity; pca for the others), else one basis for every head.
struct rank_request {
    double rate = -1;  // overall rate in [0, 1); < 0 = not set
    double eps = -1;   // sigma allocation by removal rate eps; < 0 = not set
    rank_alloc alloc = rank_alloc::SENSITIVITY;
    bool alloc_set = false;  // false: sensitivity when the file has curves, else sigma
    int key_basis = -1;
};
// Resolves a request on a .zack model (m.zack.present). Throws with a one-line
// reason for a plain GGUF, missing curves or bases, out-of-range values.
zack_ranks ranks_resolve(const model& m, const rank_request& r);

}  // namespace zk
