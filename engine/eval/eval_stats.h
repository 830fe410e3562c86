// Statistics of one run's next-token distributions against the baseline's, as
// llama.cpp's perplexity tool (--kl-divergence) defines them, so the figures
// compare one to one:
//   KLD(t)   = sum_i p_base,i (ln p_base,i - ln p_i), summed over the tokens with
//              ln p_base,i > -16 (llama.cpp's cut-off; the rest weigh < 1e-7 each)
//   dp(t)    = p(x_t+1) - p_base(x_t+1), the change of the correct token's probability
//   RMS dp   = sqrt(mean dp^2);  "Same top p" = share of tokens whose argmax agrees
//   mean +- uncertainty: m = sum/n, sqrt((sum2/n - m^2) / (n - 1)) (0 when n <= 10)
//   percentiles: linear interpolation at fraction * (n - 1) in the sorted values,
//   the median the mean of the two middle values for even n.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace zk {

// Fills lp[n_vocab] with log-softmax(logits) (double accumulation).
void eval_log_softmax(const float* logits, int n_vocab, float* lp);

class eval_kl_stats {
public:
    // base_lp: baseline log-probabilities [n_vocab]; logits: this run's [n_vocab];
    // tok: the token that actually follows.
    void add(const float* base_lp, const float* logits, int n_vocab, int32_t tok);
    int64_t count() const { return n_; }
    double kld_mean() const { return n_ ? sum_kld_ / n_ : 0; }
    const std::vector<double>& kld() const { return kld_; }  // every position's, in order
    double same_top() const { return n_ ? (double)n_same_ / n_ : 0; }
    double rms_dp() const;
    // Every figure (means with uncertainties, percentiles, PPL(Q) and PPL(base)).
    nlohmann::json summary() const;

private:
    int64_t n_ = 0, n_same_ = 0;
    double sum_nll_ = 0, sum_nll2_ = 0, sum_nll_base_ = 0, sum_nll_base2_ = 0, sum_nll_nll_base_ = 0;
    double sum_kld_ = 0, sum_kld2_ = 0, sum_dp_ = 0, sum_dp2_ = 0, sum_dp4_ = 0;
    std::vector<double> kld_, dp_;
};

// mean and its uncertainty from running sums (see above).
std::pair<double, double> eval_mean_unc(double sum, double sum2, int64_t n);
// values must be sorted ascending and non-empty.
double eval_percentile(const std::vector<double>& sorted, double fraction);
double eval_median(const std::vector<double>& sorted);

}  // namespace zk
