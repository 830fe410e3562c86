#include "calib/ranks.h"

#include <cmath>

#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

zack_spectra zack_spectra::from_arrays(int n_layer, int n_kv, int d, const float* sigma_k, const float* sigma_v) {
    zack_spectra s;
    s.n_layer = n_layer;
    s.n_kv = n_kv;
    s.d = d;
    const size_t n = (size_t)n_layer * n_kv * d;
    s.sigma_k.assign(sigma_k, sigma_k + n);
    s.sigma_v.assign(sigma_v, sigma_v + n);
    s.validate();
    return s;
}

zack_spectra zack_spectra::from_model(const model& m) {
    if (!m.zack.present)
        ZK_THROW("%s is not a .zack file: compression ranks need the singular values that `zack calibrate` writes",
                 m.file ? m.file->path().c_str() : "model");
    const int L = m.hp.n_layer, KV = m.hp.n_head_kv, D = m.hp.head_dim;
    ZK_ASSERT((int)m.zack.layers.size() == L);
    zack_spectra s;
    s.n_layer = L;
    s.n_kv = KV;
    s.d = D;
    for (int il = 0; il < L; il++) {
        const zack_layer& zl = m.zack.layers[il];
        s.sigma_k.insert(s.sigma_k.end(), zl.sigma_k, zl.sigma_k + (size_t)KV * D);
        s.sigma_v.insert(s.sigma_v.end(), zl.sigma_v, zl.sigma_v + (size_t)KV * D);
    }
    s.validate();
    return s;
}

void zack_spectra::validate() const {
    if (n_layer <= 0 || n_kv <= 0 || d <= 0)
        ZK_THROW("spectra: bad dimensions (%d layers, %d KV heads, head dim %d)", n_layer, n_kv, d);
    const size_t n = (size_t)n_layer * n_kv * d;
    if (sigma_k.size() != n || sigma_v.size() != n)
        ZK_THROW("spectra: expected %zu singular values for K and V, got %zu and %zu", n, sigma_k.size(),
                 sigma_v.size());
    for (int kv = 0; kv < 2; kv++) {
        const std::vector<double>& s = kv ? sigma_v : sigma_k;
        for (size_t i = 0; i < n; i++)
            if (!std::isfinite(s[i]) || s[i] < 0)
                ZK_THROW("spectra: sigma_%c of layer %zu, head %zu, dim %zu is %g (must be finite and >= 0)",
                         kv ? 'v' : 'k', i / d / n_kv, i / d % n_kv, i % d, s[i]);
    }
}

void ranks_validate_rate(double rate) {
    if (!(rate >= 0 && rate < 1))
        ZK_THROW("compression rate %g is out of range: it must be in [0, 1) (0 = no compression)", rate);
}

void ranks_validate_eps(double eps) {
    if (!(eps >= 0 && eps < 1))
        ZK_THROW("removal rate eps %g is out of range: it must be in [0, 1) (0 = no compression)", eps);
}

static void validate_align(const zack_spectra& s, int align) {
    if (align < 1 || align > s.d)
        ZK_THROW("rank alignment %d is out of range: it must be between 1 and the head dim %d", align, s.d);
}

int rank_for_eps(const double* sigma, int d, double eps) {
    double total = 0;
    for (int j = 0; j < d; j++) total += sigma[j];
    const double budget = eps * total;
    // Grow the removed tail from the smallest value while it stays within budget.
    double tail = 0;
    int r = d;
    while (r > 0 && tail + sigma[r - 1] <= budget) {
        tail += sigma[r - 1];
        r--;
    }
    return r;
}

int rank_align_up(int r, int align, int d) {
    int a = ((r + align - 1) / align) * align;
    if (a < align) a = align;
    return a > d ? d : a;
}

double ranks_rate(const std::vector<int>& k, const std::vector<int>& v, int d) {
    ZK_ASSERT(k.size() == v.size() && !k.empty());
    double kept = 0;
    for (size_t i = 0; i < k.size(); i++) kept += k[i] + v[i];
    return 1.0 - kept / (2.0 * d * k.size());
}

double ranks_max_rate(int d, int align) { return 1.0 - (double)std::min(align, d) / d; }

zack_ranks ranks_from_eps(const zack_spectra& s, double eps, int align) {
    ranks_validate_eps(eps);
    validate_align(s, align);
    const size_t nh = (size_t)s.n_layer * s.n_kv;
    zack_ranks r;
    r.eps = eps;
    r.k.resize(nh);
    r.v.resize(nh);
    for (size_t h = 0; h < nh; h++) {
        r.k[h] = rank_align_up(rank_for_eps(s.sigma_k.data() + h * s.d, s.d, eps), align, s.d);
        r.v[h] = rank_align_up(rank_for_eps(s.sigma_v.data() + h * s.d, s.d, eps), align, s.d);
    }
    r.rate = ranks_rate(r.k, r.v, s.d);
    return r;
}

zack_ranks ranks_for_rate(const zack_spectra& s, double rate, int align, bool uniform) {
    ranks_validate_rate(rate);
    validate_align(s, align);
    const double max_rate = ranks_max_rate(s.d, align);
    if (rate > max_rate + 1e-12)
        ZK_THROW("compression rate %g cannot be reached with head dim %d and rank alignment %d (at most %g)",
                 rate, s.d, align, max_rate);
    const size_t nh = (size_t)s.n_layer * s.n_kv;
    if (uniform) {
        // Largest multiple of align whose rate 1 - r/d still reaches the request.
        int r = (int)std::floor((1.0 - rate) * s.d / align + 1e-9) * align;
        r = std::max(std::min(r, s.d), std::min(align, s.d));
        zack_ranks out;
        out.k.assign(nh, r);
        out.v.assign(nh, r);
        out.eps = -1;
        out.rate = ranks_rate(out.k, out.v, s.d);
        return out;
    }
    zack_ranks lo = ranks_from_eps(s, 0.0, align);
    if (lo.rate >= rate) return lo;
    // Invariant: rho(lo) < rate <= rho(hi). eps -> 1 keeps only the largest
    // values; the closed interval's top end is reached just below 1.
    double elo = 0.0, ehi = std::nextafter(1.0, 0.0);
    zack_ranks hi = ranks_from_eps(s, ehi, align);
    if (hi.rate < rate) {
        // Only reachable by ranks below the eps-limit (heads whose largest value dominates
        // everything), which cannot happen when rate <= max_rate; guard anyway.
        ZK_THROW("compression rate %g is not reachable by any removal rate (at most %g)", rate, hi.rate);
    }
    for (int it = 0; it < 100 && ehi - elo > 1e-15; it++) {
        const double mid = 0.5 * (elo + ehi);
        zack_ranks m = ranks_from_eps(s, mid, align);
        if (m.rate >= rate) {
            ehi = mid;
            hi = std::move(m);
        } else {
            elo = mid;
        }
    }
    return hi;
}

}  // namespace zk
