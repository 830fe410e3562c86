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
                 "--kv-alloc sigma|uniform", m.file->path().c_str());
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
    // Options of an item: (key basis, grid index); values have one basis.
    struct option { int basis, ri; };
    std::vector<option> kopts, vopts;
    for (int b : bases)
        for (int r = 0; r < nr; r++) kopts.push_back({b, r});
    for (int r = 0; r < nr; r++) vopts.push_back({0, r});
    ZK_ASSERT(kopts.size() < 0xffff);
    // best[b]: least summed loss of the items so far using b units; choice[i][b]:
    // the option item i took to reach b.
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<double> best(budget + 1, inf), next(budget + 1);
    std::vector<uint16_t> choice((size_t)ni * (budget + 1), 0xffff);
    best[0] = 0.0;
    for (int i = 0; i < ni; i++) {
        const bool is_k = i < nh;
        const std::vector<option>& opts = is_k ? kopts : vopts;
        std::fill(next.begin(), next.end(), inf);
        uint16_t* ch = choice.data() + (size_t)i * (budget + 1);
        for (size_t o = 0; o < opts.size(); o++) {
            const std::vector<double>& loss = is_k ? c.loss_k[opts[o].basis] : c.loss_v;
            const double l = loss[(size_t)(i % nh) * nr + opts[o].ri];
            const int64_t u = c.grid[opts[o].ri] / unit;
            for (int64_t b = 0; b + u <= budget; b++) {
                if (best[b] == inf) continue;
                const double v = best[b] + l;
                if (v < next[b + u]) next[b + u] = v, ch[b + u] = (uint16_t)o;
            }
        }
        best.swap(next);
    }
    int64_t b_end = -1;  // the least loss; at equal loss the fewest dims
    for (int64_t b = 0; b <= budget; b++)
        if (best[b] < inf && (b_end < 0 || best[b] < best[b_end])) b_end = b;
    ZK_ASSERT(b_end >= 0);
    zack_ranks out;
    out.k.assign(nh, c.d);
    out.v.assign(nh, c.d);
    out.kb.assign(nh, 0);
    out.loss = best[b_end];
    int64_t b = b_end;
    for (int i = ni - 1; i >= 0; i--) {
        const uint16_t o = choice[(size_t)i * (budget + 1) + b];
        ZK_ASSERT(o != 0xffff);
        const option& op = (i < nh ? kopts : vopts)[o];
        if (i < nh) out.k[i] = c.grid[op.ri], out.kb[i] = op.basis;
        else out.v[i - nh] = c.grid[op.ri];
        b -= c.grid[op.ri] / unit;
    }
    ZK_ASSERT(b == 0);
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
