#include "calib/plan_kl.h"

#include <algorithm>

#include "calib/plan.h"
#include "engine/model.h"
#include "engine/vocab.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

std::vector<std::vector<int32_t>> tail_windows(const model& m, const std::vector<std::vector<int32_t>>& docs,
                                               int64_t n_tokens, int64_t n_ctx) {
    const vocab& voc = *m.voc;
    const bool bos = voc.add_bos() && voc.bos() >= 0;
    const int64_t body = n_ctx - (bos ? 1 : 0);
    std::vector<int32_t> text;
    for (const auto& d : docs) text.insert(text.end(), d.begin(), d.end());
    std::vector<std::vector<int32_t>> out;
    int64_t got = 0;
    for (int64_t end = (int64_t)text.size(); end > 0 && got < n_tokens;) {
        const int64_t take = std::min<int64_t>({body, end, n_tokens - got - (bos ? 1 : 0)});
        if (take < 2) break;
        std::vector<int32_t> w;
        if (bos) w.push_back(voc.bos());
        w.insert(w.end(), text.begin() + (end - take), text.begin() + end);
        got += (int64_t)w.size();
        end -= take;
        out.push_back(std::move(w));
    }
    return out;
}

// The logits of the last n_score positions of window w (the rest is prefilled
// without logits): [min(n_score, size) x n_vocab]; *first gets their first position.
const float* window_logits(session& s, const std::vector<int32_t>& w, int64_t n_score, int64_t* first,
                           int first_layer, const float* x, int64_t n_embd) {
    const int64_t n = (int64_t)w.size(), k = std::min(n_score, n);
    s.reset();
    *first = n - k;
    if (first_layer == 0) {
        if (n > k) s.decode(w.data(), n - k);
        return s.decode(w.data() + (n - k), k, true);
    }
    if (n > k) s.decode_from(first_layer, x, w.data(), n - k);
    return s.decode_from(first_layer, x + (n - k) * n_embd, w.data() + (n - k), k, true);
}

}  // namespace

kl_windows::kl_windows(const model& zm, const std::vector<std::vector<int32_t>>& docs, int64_t n_tokens,
                       int64_t n_ctx, int64_t n_score, int n_threads)
    : n_score_(n_score), n_vocab_(zm.hp.n_vocab) {
    wins_ = tail_windows(zm, docs, n_tokens, n_ctx);
    if (wins_.empty()) ZK_THROW("the corpus has no window of 2 tokens to measure plans on");
    size_t longest = 2;
    for (const auto& w : wins_) longest = std::max(longest, w.size()), window_tokens_ += (int64_t)w.size();
    base_.n_ctx = (int64_t)longest;
    base_.n_threads = n_threads;
    // the scored positions arrive in prefill chunks of up to 256 tokens; with
    // hold their queries would read the whole chunk at full precision, more
    // than the 96-127 rows a decode step does, so the plans' measured error
    // would miss what decoding loses. Quantized as appended, they read fewer.
    base_.prefill_hold = false;
    session s(zm, base_);
    for (const auto& w : wins_) {
        int64_t first = 0;
        const float* lg = window_logits(s, w, n_score_, &first, 0, nullptr, 0);
        const int64_t k = std::max<int64_t>((int64_t)w.size() - first - 1, 0);  // transitions scored
        std::vector<float> lp((size_t)k * n_vocab_);
        for (int64_t t = 0; t < k; t++) eval_log_softmax(lg + t * n_vocab_, n_vocab_, &lp[(size_t)t * n_vocab_]);
        base_lp_.push_back(std::move(lp));
        tokens_ += k;
    }
}

void kl_windows::add(session& s, size_t i, eval_kl_stats& st, int first_layer, const float* x) const {
    const auto& w = wins_[i];
    int64_t first = 0;
    const float* lg = window_logits(s, w, n_score_, &first, first_layer, x, s.mdl().hp.n_embd);
    const int64_t k = (int64_t)w.size() - first - 1;
    for (int64_t t = 0; t < k; t++)
        st.add(&base_lp_[i][(size_t)t * n_vocab_], lg + t * n_vocab_, n_vocab_, w[first + t + 1]);
}

double kl_windows::plan_kl(const model& zm, const kv_plan& pl) const {
    session_params sp = base_;
    plan_apply(pl, zm, sp);
    session s(zm, sp);
    eval_kl_stats st;
    for (size_t i = 0; i < wins_.size(); i++) add(s, i, st);
    return st.kld_mean();
}

}  // namespace zk
