#include "calib/compare.h"

#include <algorithm>
#include <cmath>

#include "calib/ranks.h"
#include "ggml-like/error.h"

namespace zk {

double compare_projector_distance(const double* ra, const double* rb, int d, int r) {
    ZK_ASSERT(r >= 1 && r <= d);
    double sum = 0;
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double pa = 0, pb = 0;
            for (int c = 0; c < r; c++) {
                pa += ra[(size_t)i * d + c] * ra[(size_t)j * d + c];
                pb += rb[(size_t)i * d + c] * rb[(size_t)j * d + c];
            }
            sum += (pa - pb) * (pa - pb);
        }
    return std::sqrt(sum / (2.0 * r));
}

static double shape_distance(const double* a, const double* b, int d) {
    double sa = 0, sb = 0;
    for (int j = 0; j < d; j++) {
        sa += a[j];
        sb += b[j];
    }
    if (sa <= 0 || sb <= 0) return sa == sb ? 0 : 1;
    double s = 0;
    for (int j = 0; j < d; j++) s += std::fabs(a[j] / sa - b[j] / sb);
    return s;
}

compare_result compare_calibrations(const zack_calibration& a, const zack_calibration& b, double rate, int align) {
    if (a.n_layer != b.n_layer || a.n_kv != b.n_kv || a.d != b.d)
        ZK_THROW("cannot compare calibrations of different shapes: %d layers x %d KV heads x dim %d vs %d x %d x %d",
                 a.n_layer, a.n_kv, a.d, b.n_layer, b.n_kv, b.d);
    const int L = a.n_layer, KV = a.n_kv, D = a.d;
    zack_spectra spec;
    spec.n_layer = L;
    spec.n_kv = KV;
    spec.d = D;
    spec.sigma_k = a.sigma_k;
    spec.sigma_v = a.sigma_v;
    spec.validate();
    const zack_ranks rk = ranks_for_rate(spec, rate, align);
    compare_result res;
    res.rate = rate;
    res.rank_align = align;
    res.has_v = !a.rv.empty() && !b.rv.empty();
    for (int il = 0; il < L; il++) {
        compare_layer cl;
        for (int g = 0; g < KV; g++) {
            const size_t h = (size_t)il * KV + g;
            cl.dk += compare_projector_distance(a.rqk.data() + h * D * D, b.rqk.data() + h * D * D, D, rk.k[h]);
            if (res.has_v)
                cl.dv += compare_projector_distance(a.rv.data() + h * D * D, b.rv.data() + h * D * D, D, rk.v[h]);
            cl.sk += shape_distance(a.sigma_k.data() + h * D, b.sigma_k.data() + h * D, D);
            cl.sv += shape_distance(a.sigma_v.data() + h * D, b.sigma_v.data() + h * D, D);
        }
        cl.dk /= KV;
        cl.dv = res.has_v ? cl.dv / KV : -1;
        cl.sk /= KV;
        cl.sv /= KV;
        res.layers.push_back(cl);
        res.mean_dk += cl.dk / L;
        res.max_dk = std::max(res.max_dk, cl.dk);
        if (res.has_v) {
            res.mean_dv += cl.dv / L;
            res.max_dv = std::max(res.max_dv, cl.dv);
        }
    }
    return res;
}

void compare_print(FILE* out, const compare_result& r, const char* name_a, const char* name_b) {
    std::fprintf(out, "Rotation stability: %s vs %s\n", name_a, name_b);
    std::fprintf(out, "subspace distance ||P_a - P_b||_F / sqrt(2r) at the ranks of rate %.2f (align %d), "
                 "mean over KV heads; 0 = same subspace, 1 = orthogonal\n", r.rate, r.rank_align);
    std::fprintf(out, "%5s %10s %10s %12s %12s\n", "layer", "dist K", "dist V", "sigma K L1", "sigma V L1");
    for (size_t il = 0; il < r.layers.size(); il++) {
        const compare_layer& c = r.layers[il];
        if (r.has_v)
            std::fprintf(out, "%5zu %10.5f %10.5f %12.5f %12.5f\n", il, c.dk, c.dv, c.sk, c.sv);
        else
            std::fprintf(out, "%5zu %10.5f %10s %12.5f %12.5f\n", il, c.dk, "n/a", c.sk, c.sv);
    }
    std::fprintf(out, "summary: K distance mean %.5f max %.5f", r.mean_dk, r.max_dk);
    if (r.has_v) std::fprintf(out, "; V distance mean %.5f max %.5f", r.mean_dv, r.max_dv);
    std::fprintf(out, "\n");
}

}  // namespace zk
