#include "calib/alloc.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>

#include "calib/keybasis.h"
#include "engine/model.h"
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
    if (loss_k[0].empty() && loss_k[1].empty() && loss_k[2].empty())
        ZK_THROW("rank curves: no key curves");
    for (int b = 0; b < 3; b++)
        if (!loss_k[b].empty() && loss_k[b].size() != n)
            ZK_THROW("rank curves: %zu key losses (basis %s), expected %zu (layers x KV heads x ranks)",
                     loss_k[b].size(), key_basis_name((key_basis)b), n);
    if (loss_v.size() != n)
        ZK_THROW("rank curves: %zu value losses, expected %zu (layers x KV heads x ranks)", loss_v.size(), n);
    for (const auto* l : {&loss_k[0], &loss_k[1], &loss_k[2], &loss_v})
        for (size_t i = 0; i < l->size(); i++)
            if (!std::isfinite((*l)[i]) || (*l)[i] < 0)
                ZK_THROW("rank curves: loss of (layer %zu, head %zu, rank %d) is %g", i / grid.size() / n_kv,
                         i / grid.size() % n_kv, grid[i % grid.size()], (*l)[i]);
}

rank_curves rank_curves::from_model(const model& m) {
    const zack_info& z = m.zack;
    if (!z.present) ZK_THROW("%s is not a .zack file (run zack calibrate first)", m.file->path().c_str());
    if (z.sens_grid.empty())
        ZK_THROW("%s has no sensitivity curves (made by an older zack calibrate): recalibrate, or use "
                 "kv.alloc sigma|uniform", m.file->path().c_str());
    rank_curves c;
    c.n_layer = m.hp.n_layer, c.n_kv = m.hp.n_head_kv, c.d = m.hp.head_dim;
    c.grid.assign(z.sens_grid.begin(), z.sens_grid.end());
    for (int b = 0; b < 3; b++) c.loss_k[b].assign(z.sens_k[b].begin(), z.sens_k[b].end());
    c.loss_v.assign(z.sens_v.begin(), z.sens_v.end());
    c.validate();
    return c;
}

double rank_curve_at(const rank_curves& c, const std::vector<double>& loss, int layer, int g, int r) {
    const size_t nr = c.grid.size();
    const double* l = loss.data() + ((size_t)layer * c.n_kv + g) * nr;
    if (r >= c.d) return 0.0;
    if (r <= c.grid[0]) return l[0];
    for (size_t i = 1; i < nr; i++)
        if (r <= c.grid[i]) {
            const double t = double(r - c.grid[i - 1]) / (c.grid[i] - c.grid[i - 1]);
            return l[i - 1] + t * (l[i] - l[i - 1]);
        }
    return 0.0;
}

double ranks_loss(const rank_curves& c, const std::vector<int>& k, const std::vector<int>& v,
                  const std::vector<int>& kb) {
    double s = 0;
    for (int il = 0; il < c.n_layer; il++)
        for (int g = 0; g < c.n_kv; g++) {
            const size_t h = (size_t)il * c.n_kv + g;
            const int b = kb.empty() ? 0 : kb[h];
            if (c.loss_k[b].empty()) ZK_THROW("ranks_loss: no curves for key basis %s", key_basis_name((key_basis)b));
            s += rank_curve_at(c, c.loss_k[b], il, g, k[h]) + rank_curve_at(c, c.loss_v, il, g, v[h]);
        }
    return s;
}

std::vector<int> alloc_knapsack(const std::vector<std::vector<knap_option>>& items, int64_t budget) {
    const size_t ni = items.size();
    // Each item's undominated options, by ascending cost (their original index kept).
    std::vector<std::vector<int>> keep(ni);
    int64_t least = 0;
    for (size_t i = 0; i < ni; i++) {
        const std::vector<knap_option>& o = items[i];
        if (o.empty()) ZK_THROW("knapsack: item %zu has no options", i);
        std::vector<int> idx(o.size());
        std::iota(idx.begin(), idx.end(), 0);
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
            return o[a].cost != o[b].cost ? o[a].cost < o[b].cost : o[a].loss < o[b].loss;
        });
        double best_loss = std::numeric_limits<double>::infinity();
        for (int k : idx) {
            ZK_ASSERT(o[k].cost >= 0 && std::isfinite(o[k].loss));
            if (o[k].loss < best_loss) keep[i].push_back(k), best_loss = o[k].loss;
        }
        least += o[keep[i][0]].cost;
    }
    if (least > budget) ZK_THROW("knapsack: the cheapest choices cost %lld, above the budget %lld", (long long)least,
                                 (long long)budget);
    ZK_ASSERT(budget < ((int64_t)1 << 31));
    // best[b]: least summed loss of the items so far at exactly b; choice[i][b]:
    // the option (index into keep[i]) item i took to reach b.
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> best(budget + 1, inf), next(budget + 1);
    std::vector<uint16_t> choice(ni * (size_t)(budget + 1), 0xffff);
    best[0] = 0.0;
    for (size_t i = 0; i < ni; i++) {
        ZK_ASSERT(keep[i].size() < 0xffff);
        std::fill(next.begin(), next.end(), inf);
        uint16_t* ch = choice.data() + i * (size_t)(budget + 1);
        for (size_t k = 0; k < keep[i].size(); k++) {
            const knap_option& op = items[i][keep[i][k]];
            for (int64_t b = 0; b + op.cost <= budget; b++) {
                if (best[b] == inf) continue;
                const double v = best[b] + op.loss;
                if (v < next[b + op.cost]) next[b + op.cost] = v, ch[b + op.cost] = (uint16_t)k;
            }
        }
        best.swap(next);
    }
    int64_t b_end = -1;  // the least loss; at equal loss the least cost
    for (int64_t b = 0; b <= budget; b++)
        if (best[b] < inf && (b_end < 0 || best[b] < best[b_end])) b_end = b;
    ZK_ASSERT(b_end >= 0);
    std::vector<int> out(ni);
    int64_t b = b_end;
    for (size_t i = ni; i-- > 0;) {
        const uint16_t k = choice[i * (size_t)(budget + 1) + b];
        ZK_ASSERT(k != 0xffff);
        out[i] = keep[i][k];
        b -= items[i][out[i]].cost;
    }
    ZK_ASSERT(b == 0);
    return out;
}

zack_ranks ranks_by_loss(const rank_curves& c, double rate, unsigned key_bases) {
    c.validate();
    ranks_validate_rate(rate);
    std::vector<int> bases;
    for (int b = 0; b < 3; b++)
        if ((key_bases >> b & 1u) && !c.loss_k[b].empty()) bases.push_back(b);
    if (bases.empty()) ZK_THROW("none of the requested key bases has sensitivity curves");
    const int nh = c.n_layer * c.n_kv, ni = 2 * nh, nr = (int)c.grid.size();
    int unit = 0;
    for (int r : c.grid) unit = std::gcd(unit, r);
    const int64_t total = (int64_t)ni * c.d;
    // The largest dimension budget (in units) whose rate is still >= the request.
    const int64_t budget = (int64_t)std::floor((1.0 - rate) * total / unit + 1e-9);
    if (budget < (int64_t)ni * (c.grid[0] / unit))
        ZK_THROW("rate %.3f is not reachable with ranks of at least %d (the most is %.3f)", rate, c.grid[0],
                 1.0 - double(c.grid[0]) / c.d);
    // Items: the keys of every head (options: key basis x grid rank), then the
    // values (grid rank); costs in dimensions / unit.
    std::vector<std::vector<knap_option>> items(ni);
    for (int i = 0; i < ni; i++) {
        const int h = i % nh;
        for (int b : (i < nh ? bases : std::vector<int>{0}))
            for (int r = 0; r < nr; r++) {
                const std::vector<double>& loss = i < nh ? c.loss_k[b] : c.loss_v;
                items[i].push_back({c.grid[r] / unit, loss[(size_t)h * nr + r]});
            }
    }
    const std::vector<int> pick = alloc_knapsack(items, budget);
    zack_ranks out;
    out.k.assign(nh, c.d);
    out.v.assign(nh, c.d);
    out.kb.assign(nh, 0);
    out.loss = 0;
    for (int i = 0; i < ni; i++) {
        const int r = c.grid[pick[i] % nr];
        if (i < nh) out.k[i] = r, out.kb[i] = bases[pick[i] / nr];
        else out.v[i - nh] = r;
        out.loss += items[i][pick[i]].loss;
    }
    out.rate = ranks_rate(out.k, out.v, c.d);
    out.eps = -2;
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

zack_ranks ranks_resolve(const model& m, const rank_request& r) {
    if (!m.zack.present)
        ZK_THROW("%s: ZACK ranks need a .zack model (run zack calibrate first)", m.file->path().c_str());
    if (r.rate >= 0 && r.eps >= 0) ZK_THROW("give either a compression rate or a removal rate eps, not both");
    if (r.rate < 0 && r.eps < 0) ZK_THROW("no compression rate given");
    if (r.key_basis < -1 || r.key_basis > 2) ZK_THROW("key basis %d is not one of pca, score, pairs", r.key_basis);
    if (r.key_basis > 0 && !m.zack.has_key_bases())
        ZK_THROW("%s has no score/pairs key bases (made by an older zack calibrate): recalibrate, or use pca",
                 m.file->path().c_str());
    rank_alloc alloc = r.alloc;
    if (!r.alloc_set) alloc = m.zack.sens_grid.empty() ? rank_alloc::SIGMA : rank_alloc::SENSITIVITY;
    if (r.eps >= 0) {
        if (r.alloc_set && alloc != rank_alloc::SIGMA)
            ZK_THROW("a removal rate eps allocates by singular values: it goes with the sigma allocation only");
        alloc = rank_alloc::SIGMA;
    }
    zack_ranks out;
    if (alloc == rank_alloc::SENSITIVITY) {
        const rank_curves c = rank_curves::from_model(m);
        const unsigned mask = r.key_basis < 0 ? 7u : 1u << r.key_basis;
        if (r.key_basis >= 0 && c.loss_k[r.key_basis].empty())
            ZK_THROW("%s has no sensitivity curves for the %s key basis", m.file->path().c_str(),
                     key_basis_name((key_basis)r.key_basis));
        out = ranks_by_loss(c, r.rate, mask);
    } else {
        const zack_spectra spec = zack_spectra::from_model(m);
        if (r.eps >= 0) {
            ranks_validate_eps(r.eps);
            out = ranks_from_eps(spec, r.eps, m.zack.rank_align);
        } else {
            ranks_validate_rate(r.rate);
            out = ranks_for_rate(spec, r.rate, m.zack.rank_align, alloc == rank_alloc::UNIFORM);
        }
        // The sigma ranks come from the pca spectra; another basis at the same ranks is an ablation.
        out.kb.assign(out.k.size(), std::max(0, r.key_basis));
    }
    return out;
}

}  // namespace zk
