#include "calib/rank_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "calib/alloc.h"
#include "engine/eval/eval_stats.h"
#include "engine/model.h"
#include "engine/session.h"
#include "engine/vocab.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

// Windows of up to n_ctx tokens (BOS first where the vocabulary adds one) from
// the end of the documents taken as one text, n_tokens in all at most.
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
const float* window_logits(session& s, const std::vector<int32_t>& w, int64_t n_score, int64_t* first) {
    const int64_t n = (int64_t)w.size(), k = std::min(n_score, n);
    s.reset();
    if (n > k) s.decode(w.data(), n - k);
    *first = n - k;
    return s.decode(w.data() + (n - k), k, true);
}

}  // namespace

rank_fit calib_fit_rank_weight(const model& zm, const plan_inputs& in, const std::vector<std::vector<int32_t>>& docs,
                               const rank_fit_params& p) {
    if (!zm.zack.present) ZK_THROW("the rank-weight fit needs a .zack model");
    if (std::find(in.qbits.begin(), in.qbits.end(), 2) == in.qbits.end() || !in.per_head())
        ZK_THROW("the rank-weight fit needs the measured loss of every precision pair, 2-bit among them");
    if (p.weights.empty()) ZK_THROW("the rank-weight fit needs candidate weights");
    if (p.at.empty()) ZK_THROW("the rank-weight fit needs a target to measure plans at");
    for (double a : p.at)
        if (!(a >= 0 && a <= 1)) ZK_THROW("the rank-weight fit: target point %g is outside [0, 1]", a);
    const std::vector<std::vector<int32_t>> wins = tail_windows(zm, docs, p.n_tokens, p.n_ctx);
    if (wins.empty()) ZK_THROW("the rank-weight fit: the corpus has no window of 2 tokens");
    size_t longest = 2;
    rank_fit f;
    for (const auto& w : wins) longest = std::max(longest, w.size()), f.window_tokens += (int64_t)w.size();
    session_params base;
    base.n_ctx = (int64_t)longest;
    base.n_threads = p.n_threads;

    // the targets: fractions `at` of the way from the 2-bit cache to the 4-bit one
    const rank_curves& c = in.curves;
    const double f16 = plan_f16_bytes(c.n_layer, c.n_kv, c.d);
    const double f2 = plan_bytes(c.n_layer, c.n_kv, c.d, 2, {}, {}) / f16;
    const double f4 = plan_bytes(c.n_layer, c.n_kv, c.d, 4, {}, {}) / f16;
    for (double a : p.at) f.targets.push_back(f2 + a * (f4 - f2));

    // the full cache's log-probabilities at the scored positions, window by window
    const int nv = zm.hp.n_vocab;
    std::vector<std::vector<float>> base_lp;
    {
        session s(zm, base);
        for (const auto& w : wins) {
            int64_t first = 0;
            const float* lg = window_logits(s, w, p.n_score, &first);
            const int64_t k = (int64_t)w.size() - first - 1;  // transitions scored
            std::vector<float> lp((size_t)std::max<int64_t>(k, 0) * nv);
            for (int64_t t = 0; t < k; t++) eval_log_softmax(lg + t * nv, nv, &lp[(size_t)t * nv]);
            base_lp.push_back(std::move(lp));
            f.tokens += std::max<int64_t>(k, 0);
        }
    }
    // one plan's mean KL (plans already measured are not run again)
    std::vector<std::pair<nlohmann::json, double>> seen;
    auto plan_kl = [&](const kv_plan& pl) {
        nlohmann::json key = pl.to_json();
        key.erase("loss"), key.erase("target"), key.erase("source");
        for (const auto& [k, v] : seen)
            if (k == key) return v;
        session_params sp = base;
        plan_apply(pl, zm, sp);
        session s(zm, sp);
        eval_kl_stats st;
        for (size_t i = 0; i < wins.size(); i++) {
            const auto& w = wins[i];
            int64_t first = 0;
            const float* lg = window_logits(s, w, p.n_score, &first);
            const int64_t k = (int64_t)w.size() - first - 1;
            for (int64_t t = 0; t < k; t++) st.add(&base_lp[i][(size_t)t * nv], lg + t * nv, nv, w[first + t + 1]);
        }
        seen.emplace_back(key, st.kld_mean());
        return st.kld_mean();
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
