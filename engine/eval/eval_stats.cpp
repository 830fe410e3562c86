#include "engine/eval/eval_stats.h"

#include <algorithm>
#include <cmath>

#include "ggml-like/error.h"

namespace zk {

void eval_log_softmax(const float* logits, int n_vocab, float* lp) {
    float mx = logits[0];
    for (int i = 1; i < n_vocab; i++) mx = std::max(mx, logits[i]);
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += std::exp((double)logits[i] - mx);
    const double lse = mx + std::log(sum);
    for (int i = 0; i < n_vocab; i++) lp[i] = (float)((double)logits[i] - lse);
}

void eval_kl_stats::add(const float* base_lp, const float* logits, int n_vocab, int32_t tok) {
    ZK_ASSERT(tok >= 0 && tok < n_vocab);
    float mx = logits[0];
    int32_t top = 0, top_base = 0;
    for (int i = 1; i < n_vocab; i++) {
        if (logits[i] > mx) {
            mx = logits[i];
            top = i;
        }
        if (base_lp[i] > base_lp[top_base]) top_base = i;
    }
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += std::exp((double)logits[i] - mx);
    // Rounded to float exactly as eval_log_softmax stores the baseline, so a run
    // identical to the baseline gives KLD = 0 and dp = 0 exactly.
    const double lse = mx + std::log(sum);
    auto lq = [&](int i) { return (double)(float)((double)logits[i] - lse); };
    double kld = 0;
    for (int i = 0; i < n_vocab; i++) {
        const double lb = base_lp[i];
        if (lb > -16.0) kld += std::exp(lb) * (lb - lq(i));
    }
    const double nll = -lq(tok);
    const double nll_base = -(double)base_lp[tok];
    const double dp = std::exp(-nll) - std::exp(-nll_base);
    n_++;
    n_same_ += top == top_base;
    sum_nll_ += nll;
    sum_nll2_ += nll * nll;
    sum_nll_base_ += nll_base;
    sum_nll_base2_ += nll_base * nll_base;
    sum_nll_nll_base_ += nll * nll_base;
    sum_kld_ += kld;
    sum_kld2_ += kld * kld;
    sum_dp_ += dp;
    sum_dp2_ += dp * dp;
    sum_dp4_ += dp * dp * dp * dp;
    kld_.push_back(kld);
    dp_.push_back(dp);
}

std::pair<double, double> eval_mean_unc(double sum, double sum2, int64_t n) {
    if (n < 1) return {0.0, 0.0};
    const double m = sum / n;
    const double var = sum2 / n - m * m;
    return {m, var > 0 && n > 10 ? std::sqrt(var / (n - 1)) : 0.0};
}

double eval_percentile(const std::vector<double>& v, double fraction) {
    ZK_ASSERT(!v.empty());
    if (fraction <= 0) return v.front();
    if (fraction >= 1) return v.back();
    double p = fraction * (double)(v.size() - 1);
    const size_t ip = (size_t)p;
    p -= (double)ip;
    return (1 - p) * v[ip] + p * v[std::min(ip + 1, v.size() - 1)];
}

double eval_median(const std::vector<double>& v) {
    ZK_ASSERT(!v.empty());
    const size_t n = v.size();
    return n % 2 == 0 ? 0.5 * (v[n / 2] + v[n / 2 - 1]) : v[n / 2];
}

double eval_kl_stats::rms_dp() const {
    return std::sqrt(eval_mean_unc(sum_dp2_, sum_dp4_, n_).first);
}

nlohmann::json eval_kl_stats::summary() const {
    nlohmann::json j = nlohmann::json::object();
    j["n_tokens"] = n_;
    if (n_ == 0) return j;
    const auto lp = eval_mean_unc(sum_nll_, sum_nll2_, n_);
    const auto lpb = eval_mean_unc(sum_nll_base_, sum_nll_base2_, n_);
    const double cov = n_ < 10 ? 0.0 : (sum_nll_nll_base_ / n_ - lp.first * lpb.first) / (n_ - 1);
    j["ppl"] = std::exp(lp.first);
    j["ppl_unc"] = std::exp(lp.first) * lp.second;
    j["ppl_base"] = std::exp(lpb.first);
    j["ppl_base_unc"] = std::exp(lpb.first) * lpb.second;
    const double ratio_unc2 = lp.second * lp.second + lpb.second * lpb.second - 2 * cov;
    j["ln_ppl_ratio"] = lp.first - lpb.first;
    j["ln_ppl_ratio_unc"] = std::sqrt(std::max(0.0, ratio_unc2));
    j["ppl_ratio"] = std::exp(lp.first - lpb.first);
    if (lp.second > 0 && lpb.second > 0) j["cor_ln_ppl"] = cov / (lp.second * lpb.second);
    const auto kl = eval_mean_unc(sum_kld_, sum_kld2_, n_);
    j["kld_mean"] = kl.first;
    j["kld_mean_unc"] = kl.second;
    const auto dp = eval_mean_unc(sum_dp_, sum_dp2_, n_);
    j["dp_mean"] = dp.first;
    j["dp_mean_unc"] = dp.second;
    const auto mse = eval_mean_unc(sum_dp2_, sum_dp4_, n_);
    const double rms = std::sqrt(mse.first);
    j["rms_dp"] = rms;
    j["rms_dp_unc"] = rms > 0 ? 0.5 / rms * mse.second : 0.0;
    const double st = (double)n_same_ / n_;
    j["same_top_p"] = st;
    j["same_top_p_unc"] = n_ > 1 ? std::sqrt(st * (1 - st) / (n_ - 1)) : 0.0;
    std::vector<double> k = kld_, d = dp_;
    std::sort(k.begin(), k.end());
    std::sort(d.begin(), d.end());
    static const struct { const char* name; double f; } pk[] = {
        {"max", 1.0}, {"p99.9", 0.999}, {"p99", 0.99}, {"p95", 0.95}, {"p90", 0.90},
        {"p10", 0.10}, {"p5", 0.05}, {"p1", 0.01}, {"p0.1", 0.001}, {"min", 0.0}};
    nlohmann::json kp, dpp;
    for (const auto& p : pk) kp[p.name] = eval_percentile(k, p.f);
    kp["median"] = eval_median(k);
    for (const auto& p : pk) dpp[p.name] = eval_percentile(d, p.f);
    dpp["p75"] = eval_percentile(d, 0.75);
    dpp["p25"] = eval_percentile(d, 0.25);
    dpp["median"] = eval_median(d);
    j["kld_percentiles"] = kp;
    j["dp_percentiles"] = dpp;
    return j;
}

}  // namespace zk
