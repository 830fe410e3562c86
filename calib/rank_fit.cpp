#include "calib/rank_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "calib/alloc.h"
#include "calib/plan_kl.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

double calib_fit_target(const plan_inputs& in, double at) {
    const rank_curves& c = in.curves;
    const double f16 = plan_f16_bytes(c.n_layer, c.n_kv, c.d);
    const double f2 = plan_bytes(c.n_layer, c.n_kv, c.d, 2, {}, {}) / f16;
    const double f4 = plan_bytes(c.n_layer, c.n_kv, c.d, 4, {}, {}) / f16;
    return f2 + at * (f4 - f2);
}

rank_fit calib_fit_rank_weight(const model& zm, const plan_inputs& in, const std::vector<std::vector<int32_t>>& docs,
                               const rank_fit_params& p) {
    if (!zm.zack.present) ZK_THROW("the rank-weight fit needs a .zack model");
    if (std::find(in.qbits.begin(), in.qbits.end(), 2) == in.qbits.end() || !in.per_head())
        ZK_THROW("the rank-weight fit needs the measured loss of every precision pair, 2-bit among them");
    if (p.weights.empty()) ZK_THROW("the rank-weight fit needs candidate weights");
    if (p.at.empty()) ZK_THROW("the rank-weight fit needs a target to measure plans at");
    for (double a : p.at)
        if (!(a >= 0 && a <= 1)) ZK_THROW("the rank-weight fit: target point %g is outside [0, 1]", a);
    const kl_windows kw(zm, docs, p.n_tokens, p.n_ctx, p.n_score, p.n_threads);
    rank_fit f;
    f.window_tokens = kw.window_tokens();
    f.tokens = kw.tokens();

    // the targets: fractions `at` of the way from the 2-bit cache to the 4-bit one
    for (double a : p.at) f.targets.push_back(calib_fit_target(in, a));

    // one plan's mean KL (plans already measured are not run again)
    std::vector<std::pair<nlohmann::json, double>> seen;
    auto plan_kl = [&](const kv_plan& pl) {
        nlohmann::json key = pl.to_json();
        key.erase("loss"), key.erase("target"), key.erase("source");
        for (const auto& [k, v] : seen)
            if (k == key) return v;
        const double kl = kw.plan_kl(zm, pl);
        seen.emplace_back(key, kl);
        return kl;
    };
    plan_inputs pin = in;
    double best = INFINITY;
    for (double w : p.weights) {
        pin.rank_weight = w;
        double kl = 0;
        std::string each;  // "plan at 0.156: KLD 0.08393", per target
        for (double t : f.targets) {
            const double k = plan_kl(plan_for_target(pin, t));
            kl += k;
            char buf[64];
            std::snprintf(buf, sizeof buf, "%splan at %.3f: KLD %.5f", each.empty() ? "" : ", ", t, k);
            each += buf;
        }
        f.kl.push_back(kl);
        if (p.progress) {
            std::fprintf(stderr, "zack calibrate: rank weight %g: %s", w, each.c_str());
            if (f.targets.size() > 1) std::fprintf(stderr, " (sum %.5f)", kl);
            std::fprintf(stderr, " on %lld positions\n", (long long)f.tokens);
        }
        // strictly better wins; at equal KL, the weight nearer 1
        if (kl < best || (kl == best && std::fabs(std::log(w)) < std::fabs(std::log(f.weight)))) best = kl, f.weight = w;
    }
    f.runs = 1 + (int)seen.size();  // the full cache's pass and each distinct plan's
    // 1:1 stays unless the winner beats it clearly (noise on short text moves nearby weights)
    for (size_t i = 0; i < p.weights.size(); i++)
        if (p.weights[i] == 1 && f.weight != 1 && best > f.kl[i] * (1 - p.margin)) f.weight = 1;
    return f;
}

}  // namespace zk
