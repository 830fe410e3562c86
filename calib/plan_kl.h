// End-to-end KL of KV plans on windows of held-out text: what the rank-weight
// fit (calib/rank_fit.h) and the layer gains (calib/layer_gain.h) measure.
//
// Windows of up to n_ctx tokens (BOS first where the vocabulary adds one) are
// taken from the end of the documents read as one text, n_tokens in all at
// most; in each, the last n_score positions are scored (the rest is context,
// prefilled without logits) against the full cache's log-probabilities, which
// the constructor computes once. The windows are decoded without
// session_params::prefill_hold: their chunks are quantized as they are
// appended, as before it existed.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/eval/eval_stats.h"
#include "engine/session.h"

namespace zk {

struct kv_plan;

class kl_windows {
public:
    // zm: the model (a .zack for plans with ranks); throws when the documents hold no window of 2 tokens.
    kl_windows(const model& zm, const std::vector<std::vector<int32_t>>& docs, int64_t n_tokens, int64_t n_ctx,
               int64_t n_score, int n_threads);

    size_t size() const { return wins_.size(); }
    const std::vector<int32_t>& window(size_t i) const { return wins_[i]; }
    // Session parameters that fit every window (n_ctx: the longest), full cache.
    const session_params& base() const { return base_; }
    int64_t tokens() const { return tokens_; }                // positions scored, all windows
    int64_t window_tokens() const { return window_tokens_; }  // tokens a pass runs

    // Runs window i on s (reset first) and adds the KL of its scored positions
    // to st. first_layer > 0: s decodes from that layer's inputs x [window
    // size x n_embd] (session::decode_from).
    void add(session& s, size_t i, eval_kl_stats& st, int first_layer = 0, const float* x = nullptr) const;
    // A plan's mean KL over every window (a session of base() with the plan applied).
    double plan_kl(const model& zm, const kv_plan& pl) const;

private:
    std::vector<std::vector<int32_t>> wins_;
    std::vector<std::vector<float>> base_lp_;  // per window [scored transitions x n_vocab]
    session_params base_;
    int64_t n_score_ = 0, tokens_ = 0, window_tokens_ = 0;
    int n_vocab_ = 0;
};

}  // namespace zk
