#include "calib/layer_gain.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>

#include "calib/plan_kl.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

void check_inputs(const model& zm, const plan_inputs& in, const layer_gain_params& p) {
    if (!zm.zack.present) ZK_THROW("the layer gains need a .zack model");
    if (!in.layer_gain.empty()) ZK_THROW("the layer gains are measured on plan inputs without gains");
    if (!(p.lo > 0 && p.lo <= 1 && p.hi >= 1)) ZK_THROW("layer gains: the clip [%g, %g] must hold 1", p.lo, p.hi);
}

}  // namespace

layer_gains calib_measure_layer_gains(const model& zm, const plan_inputs& in,
                                      const std::vector<std::vector<int32_t>>& docs, const layer_gain_params& p) {
    check_inputs(zm, in, p);  // before the full cache's pass
    const kl_windows kw(zm, docs, p.n_tokens, p.n_ctx, p.n_score, p.n_threads);
    return calib_measure_layer_gains(zm, in, kw, p);
}

layer_gains calib_measure_layer_gains(const model& zm, const plan_inputs& in, const kl_windows& kw,
                                      const layer_gain_params& p) {
    check_inputs(zm, in, p);
    const int L = zm.hp.n_layer;
    const auto t0 = std::chrono::steady_clock::now();
    layer_gains r;
    r.plan = plan_for_target(in, p.target);
    r.tokens = kw.tokens();
    r.window_tokens = kw.window_tokens();

    std::vector<kv_plan> exact((size_t)L);
    const double all = plan_predicted_loss(in, r.plan);
    r.predicted.resize((size_t)L);
    for (int l = 0; l < L; l++) {
        exact[(size_t)l] = plan_with_layer_exact(r.plan, l);
        r.predicted[(size_t)l] = all - plan_predicted_loss(in, exact[(size_t)l]);
    }

    // window by window: the plan's pass keeps every layer's inputs, then each
    // layer exact in turn runs from its own
    eval_kl_stats st_plan;
    std::vector<eval_kl_stats> st((size_t)L);
    calib_layer_inputs keep(L, zm.hp.n_embd);
    session_params sp = kw.base();
    plan_apply(r.plan, zm, sp);
    for (size_t w = 0; w < kw.size(); w++) {
        {
            session s(zm, sp);
            keep.clear();
            s.set_observer(&keep);
            kw.add(s, w, st_plan);
            s.set_observer(nullptr);
        }
        for (int l = 0; l < L; l++) {
            if (r.predicted[(size_t)l] <= 0) continue;  // the plan keeps this layer exact already
            session_params sl = kw.base();
            plan_apply(exact[(size_t)l], zm, sl);
            session s(zm, sl);
            kw.add(s, w, st[(size_t)l], l, keep.x[(size_t)l].data());
            if (p.progress)
                std::fprintf(stderr, "\rzack calibrate: layer gains: window %zu/%zu, layer %d/%d   ", w + 1, kw.size(),
                             l + 1, L);
        }
    }
    if (p.progress) std::fprintf(stderr, "\n");
    r.kl = st_plan.kld_mean();
    r.removed.assign((size_t)L, 0.0);
    r.removed_se.assign((size_t)L, 0.0);
    r.gain.assign((size_t)L, 1.0);
    double sum_removed = 0, sum_predicted = 0;
    const std::vector<double>& kp = st_plan.kld();
    for (int l = 0; l < L; l++) {
        if (r.predicted[(size_t)l] <= 0) continue;
        // the paired differences, position by position: their mean and its standard error
        const std::vector<double>& kl = st[(size_t)l].kld();
        ZK_ASSERT(kl.size() == kp.size() && kp.size() > 1);
        double s1 = 0, s2 = 0;
        for (size_t t = 0; t < kp.size(); t++) s1 += kp[t] - kl[t], s2 += (kp[t] - kl[t]) * (kp[t] - kl[t]);
        const double n = (double)kp.size(), mean = s1 / n;
        r.removed[(size_t)l] = mean;
        r.removed_se[(size_t)l] = std::sqrt(std::max(s2 / n - mean * mean, 0.0) / (n - 1));
        sum_removed += mean;
        sum_predicted += r.predicted[(size_t)l];
    }
    // nats per unit of predicted loss over the whole plan: the gains are relative to it
    r.scale = sum_predicted > 0 ? sum_removed / sum_predicted : 0;
    for (int l = 0; l < L && r.scale > 0; l++) {
        const size_t i = (size_t)l;
        const double expect = r.predicted[i] * r.scale;  // what the layer removes if the proxy prices it right
        if (r.predicted[i] > 0 && std::fabs(r.removed[i] - expect) > p.z * r.removed_se[i])
            r.gain[i] = std::clamp(r.removed[i] / expect, p.lo, p.hi);
    }
    if (p.progress) {
        std::fprintf(stderr, "zack calibrate: layer gains at plan %.3f (KLD %.5f on %lld positions, %.1f s):",
                     p.target, r.kl, (long long)r.tokens,
                     std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        for (int l = 0; l < L; l++) std::fprintf(stderr, " %.2g", r.gain[(size_t)l]);
        std::fprintf(stderr, " (%d of %d layers measured off their price)\n", r.moved(), L);
    }
    return r;
}

}  // namespace zk
