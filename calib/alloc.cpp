#include "calib/alloc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>

#include "ggml-like/error.h"

namespace zk {

void rank_curves::validate() const {
    if (n_layer <= 0 || n_kv <= 0 || d <= 0) ZK_THROW("rank curves: empty shapes");
    if (grid.empty() || grid.back() != d)
        ZK_THROW("rank curves: the rank grid must end at the head dim %d", d);
    for (size_t i = 0; i < grid.size(); i++)
        if (grid[i] < 1 || grid[i] > d || (i && grid[i] <= grid[i - 1]))
            ZK_THROW("rank curves: the rank grid must be ascending within 1..%d", d);
    const size_t n = (size_t)n_layer * n_kv * grid.size();
    if (loss_k.size() != n || loss_v.size() != n)
        ZK_THROW("rank curves: %zu and %zu losses, expected %zu (layers x KV heads x ranks)", loss_k.size(),
                 loss_v.size(), n);
    for (const auto* l : {&loss_k, &loss_v})
        for (size_t i = 0; i < n; i++)
            if (!std::isfinite((*l)[i]) || (*l)[i] < 0)
                ZK_THROW("rank curves: loss of (layer %zu, head %zu, rank %d) is %g", i / grid.size() / n_kv,
                         i / grid.size() % n_kv, grid[i % grid.size()], (*l)[i]);
}

double rank_curve_at(const rank_curves& c, const std::vector<double>& loss, int layer, int g, int r) {
    const size_t nr = c.grid.size();
    const double* l = loss.data() + ((size_t)layer * c.n_kv + g) * nr;
    if (r >= c.d) return 0.0;
    if (r <= c.grid[0]) return l[0];  // below the grid: the smallest measured rank's loss (optimistic)
    for (size_t i = 1; i < nr; i++)
        if (r <= c.grid[i]) {
            const double t = double(r - c.grid[i - 1]) / (c.grid[i] - c.grid[i - 1]);
            return l[i - 1] + t * (l[i] - l[i - 1]);
        }
    return 0.0;
}

double ranks_loss(const rank_curves& c, const std::vector<int>& k, const std::vector<int>& v) {
    double s = 0;
    for (int il = 0; il < c.n_layer; il++)
        for (int g = 0; g < c.n_kv; g++) {
            const size_t h = (size_t)il * c.n_kv + g;
            s += rank_curve_at(c, c.loss_k, il, g, k[h]) + rank_curve_at(c, c.loss_v, il, g, v[h]);
        }
    return s;
}

zack_ranks ranks_by_loss(const rank_curves& c, double rate) {
    c.validate();
    ranks_validate_rate(rate);
    const int nh = c.n_layer * c.n_kv, ni = 2 * nh, nr = (int)c.grid.size();
    int unit = 0;
    for (int r : c.grid) unit = std::gcd(unit, r);
    const int64_t total = (int64_t)ni * c.d;
    // The largest dimension budget (in units) whose rate is still >= the request.
    const int64_t budget = (int64_t)std::floor((1.0 - rate) * total / unit + 1e-9);
    if (budget < (int64_t)ni * (c.grid[0] / unit))
        ZK_THROW("rate %.3f is not reachable with ranks of at least %d (the most is %.3f)", rate, c.grid[0],
                 1.0 - double(c.grid[0]) / c.d);
    // best[b]: least summed loss of the items so far using b units; choice[i][b]: the rank index item i took.
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> best(budget + 1, inf), next(budget + 1);
    std::vector<uint8_t> choice((size_t)ni * (budget + 1), 0xff);
    best[0] = 0.0;
    for (int i = 0; i < ni; i++) {
        const std::vector<double>& loss = i < nh ? c.loss_k : c.loss_v;
        const double* l = loss.data() + (size_t)(i % nh) * nr;
        std::fill(next.begin(), next.end(), inf);
        uint8_t* ch = choice.data() + (size_t)i * (budget + 1);
        for (int64_t b = 0; b <= budget; b++) {
            if (best[b] == inf) continue;
            for (int r = 0; r < nr; r++) {
                const int64_t nb = b + c.grid[r] / unit;
                if (nb > budget) break;
                const double v = best[b] + l[r];
                // ties: the smaller budget (fewer bytes for the same loss)
                if (v < next[nb]) next[nb] = v, ch[nb] = (uint8_t)r;
            }
        }
        best.swap(next);
    }
    // The best end state; at equal loss the one using fewer dims.
    int64_t b_end = -1;
    for (int64_t b = 0; b <= budget; b++)
        if (best[b] < inf && (b_end < 0 || best[b] < best[b_end])) b_end = b;
    ZK_ASSERT(b_end >= 0);
    zack_ranks out;
    out.k.assign(nh, c.d);
    out.v.assign(nh, c.d);
    // Backtrack: item i took rank ch[b] at state b, coming from b - grid/unit.
    int64_t b = b_end;
    for (int i = ni - 1; i >= 0; i--) {
        const uint8_t r = choice[(size_t)i * (budget + 1) + b];
        ZK_ASSERT(r != 0xff);
        (i < nh ? out.k : out.v)[i % nh] = c.grid[r];
        b -= c.grid[r] / unit;
    }
    ZK_ASSERT(b == 0);
    out.rate = ranks_rate(out.k, out.v, c.d);
    out.eps = -2;  // not an eps allocation
    return out;
}

rank_alloc rank_alloc_from_name(const std::string& s) {
    if (s == "sensitivity") return rank_alloc::SENSITIVITY;
    if (s == "sigma") return rank_alloc::SIGMA;
    if (s == "uniform") return rank_alloc::UNIFORM;
    ZK_THROW("unknown rank allocation '%s' (sensitivity, sigma, uniform)", s.c_str());
}

const char* rank_alloc_name(rank_alloc a) {
    switch (a) {
        case rank_alloc::SENSITIVITY: return "sensitivity";
        case rank_alloc::SIGMA: return "sigma";
        case rank_alloc::UNIFORM: return "uniform";
    }
    return "?";
}

}  // namespace zk
