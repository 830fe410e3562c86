// Rank selection for ZACK compression: from the singular values of every
// (layer, KV head) to the K and V ranks the engine runs with.
//
// Removal rate eps (paper, section 5.2): for each head the smallest r with
//     sum_{j >= r} sigma_j <= eps * sum_j sigma_j       (sigma descending, 0-based)
// then rounded UP to a multiple of `align` (kernel-friendly sizes), at least
// `align`, at most d. One eps serves every head and layer, K and V alike.
// Overall compression rate:  rho = 1 - sum(r_k + r_v) / (n_layer * n_kv * 2 d).
// rho(eps) is monotone non-decreasing, so a requested rate maps to eps by
// bisection: the SMALLEST eps whose ranks reach rho >= the requested rate (the
// least information removed that gives at least that much compression). The
// achieved rate exceeds the request by at most the step one head's rank change
// makes (align / (n_layer * n_kv * 2 d)) unless several heads tie.
// Uniform mode (the paper's ZACK/AC ablation): one rank for every head, K and V,
// the largest multiple of align with 1 - r/d >= the requested rate.
#pragma once
#include <string>
#include <vector>

namespace zk {

struct model;

// Singular values of every (layer, KV head); arrays are [n_layer x n_kv x d],
// each head's d values descending.
struct zack_spectra {
    int n_layer = 0;
    int n_kv = 0;
    int d = 0;
    std::vector<double> sigma_k;
    std::vector<double> sigma_v;

    // From a loaded .zack model (m.zack.present); throws otherwise.
    static zack_spectra from_model(const model& m);
    // From raw float arrays as stored in a .zack file ([n_layer x n_kv x d] each).
    static zack_spectra from_arrays(int n_layer, int n_kv, int d, const float* sigma_k, const float* sigma_v);
    // Checks sizes, finiteness, non-negativity; throws zk::error naming the head.
    void validate() const;
};

struct zack_ranks {
    std::vector<int> k, v;  // [n_layer x n_kv] row-major
    std::vector<int> kb;    // key basis per head (calib/keybasis.h); empty = pca everywhere
    double rate = 0;        // achieved overall rate rho
    double eps = 0;         // removal rate used (-1 for uniform ranks, -2 for an allocation by loss)
    double loss = -1;       // predicted (summed measured) loss, when allocated by loss
};

// Smallest r (0..d) with tail sum from r <= eps * total, before alignment.
int rank_for_eps(const double* sigma, int d, double eps);
// Rounds r up to a multiple of align, clamped to [align, d] (d if align > d).
int rank_align_up(int r, int align, int d);

// Throws zk::error unless 0 <= eps < 1 and 1 <= align <= d.
zack_ranks ranks_from_eps(const zack_spectra& s, double eps, int align);
// Throws zk::error unless 0 <= rate < 1 and the rate is reachable
// (rate <= 1 - align/d, the rate with every rank at align).
zack_ranks ranks_for_rate(const zack_spectra& s, double rate, int align, bool uniform = false);
// rho for given ranks ([n_layer x n_kv] each, head dim d).
double ranks_rate(const std::vector<int>& k, const std::vector<int>& v, int d);
// The highest rate reachable with this alignment: 1 - min(align, d) / d.
double ranks_max_rate(int d, int align);

// Throw zk::error with a clear message for out-of-range user input.
void ranks_validate_rate(double rate);
void ranks_validate_eps(double eps);

}  // namespace zk
