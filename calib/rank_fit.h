// The exchange rate between the two kinds of loss a KV plan adds up
// (calib/plan.h, plan_inputs::rank_weight), chosen end to end at calibration.
//
// The sensitivity pass measures rank cuts and quantized caches in one unit,
// the relative error of each layer's attention output, but they need not cost
// the same at the model's output: a rank cut removes the same directions from
// every token, quantization adds noise. On Qwen2.5-Coder-1.5B plans that summed
// them 1:1 cut ranks where 2-bit codes were cheaper (plan 0.2 at 4K context: KLD
// 0.054; with rank losses weighted 30x, 0.029 for the same bytes); on
// SmolLM2-135M 1:1 is about right. It depends on the context too: on the same
// Qwen text at 1K context, weight 1 did better than 30 (KLD 0.029 vs 0.038 at
// plan 0.2): a rank cut's error grows with the keys a query attends over. A
// ratio of two probes (2-bit everywhere vs a rank cut) predicted 0.17 on
// SmolLM2 and made plans worse: the KL is not linear in the predicted loss.
// So the weight is chosen the way it is used, at a long context: for each
// candidate weight, the plan at a target in the range where plans trade rank
// cuts for bits (5% of the way from the 2-bit cache's bytes to the 4-bit
// one's) is run over windows of corpus text the statistics never saw (n_ctx
// tokens, the last n_score of them scored), and the weight whose plans lose
// the least KL to the full cache wins, provided it
// beats 1:1 by a clear margin: on SmolLM2 the candidates' KL differ by noise
// (0.255-0.281 on 384 positions; weight 3, 7.6% below 1 there, was 5.7% above
// it on held-out text), on the 1.5B by half (0.102 vs 0.051). The targets sit
// low because that is where the smallest plans at 99% of baseline live and
// where the weight decides: on the 1.5B (q19.zack, held-out Node.js docs at 4K)
// weights 10 and 30 tied at a third and half of the way (KL 0.059 both), while
// at 15.5% of the f16 bytes weight 30 cut ten key heads' ranks to pay for 8-bit
// values in one head (KLD 0.0335) where 100 kept every rank (0.0239). A second
// target a quarter of the way up was measured too until it showed it decides
// nothing: on the 1.5B (16K tokens of licences and Python, weights 1 / 3 / 10
// / 30 / 100 / 300) its KL was 0.070 / 0.060 / 0.052 / 0.051 / 0.051 / 0.051
// against 0.142 / 0.129 / 0.084 / 0.084 / 0.086 / 0.071 at 5%, which chose
// 300 alone as the sum did, and its plans were 4 of the fit's 10 runs.
#pragma once
#include <cstdint>
#include <vector>

#include "calib/plan.h"

namespace zk {

struct model;

struct rank_fit_params {
    int64_t n_tokens = 3072;  // tokens, in windows of n_ctx (BOS added where the vocabulary has one)
    int64_t n_ctx = 3072;
    int64_t n_score = 768;    // positions scored at the end of each window (the rest is context)
    std::vector<double> weights = {1, 3, 10, 30, 100, 300};  // candidates
    // where the plans are measured: fractions of the way from the 2-bit cache's
    // bytes to the 4-bit one's (each in [0, 1]; the KLs of a weight's plans are summed)
    std::vector<double> at = {0.05};
    double margin = 0.1;   // a weight other than 1 must lose this fraction less KL than 1 does
    int n_threads = 2;
    bool progress = true;  // a line per candidate on stderr
};

struct rank_fit {
    double weight = 1;
    std::vector<double> targets;  // the plans' targets (fractions of the f16 cache), one per `at`
    std::vector<double> kl;       // per candidate: the summed mean KL of its plans
    int runs = 0;                 // passes over the windows: the full cache's and each distinct plan's
    int64_t tokens = 0;           // positions scored per plan
    int64_t window_tokens = 0;    // tokens a pass runs (the windows' sum)
};

// zm: a .zack model (its folded weights serve the ranks); in: its plan inputs
// (curves and the loss of every precision pair, 2-bit among them); docs: token
// documents (no BOS), the windows taken from their end. Throws zk::error when
// the inputs lack the 2-bit losses or the documents have no window.
// The fraction of the f16 cache `at` of the way from the 2-bit cache's bytes to the 4-bit one's.
double calib_fit_target(const plan_inputs& in, double at);

rank_fit calib_fit_rank_weight(const model& zm, const plan_inputs& in, const std::vector<std::vector<int32_t>>& docs,
                               const rank_fit_params& p);

}  // namespace zk
