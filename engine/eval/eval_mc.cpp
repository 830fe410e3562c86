// Multiple choice by log-likelihood, lm-eval-harness style. One JSON object per
// line (blank lines ignored); accepted fields, the first present wins:
//   context:  "context" | "query" | "question" | "ctx"           string
//   choices:  "choices" | "endings" | "options"                  array of >= 2 strings
//   gold:     "gold" | "label" | "answer"                         index (number or digit
//             string), a letter "A".."Z", or the text of one of the choices
// A choice is scored as the continuation context + " " + choice (no space added
// when the context ends in whitespace or the choice starts with it); its tokens are
// those of the whole text after the context's own tokens. acc takes the choice
// with the largest summed log-likelihood, acc_norm the largest log-likelihood per
// byte of the choice text (lm-eval-harness's acc_norm). The context is fed first,
// then the choice's tokens, so a compressed cache sees them as it would in use.
#include <cctype>
#include <cstdio>
#include <fstream>

#include "engine/eval/eval_task.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

struct mc_item {
    std::string where;
    std::vector<int32_t> ctx;
    std::vector<std::vector<int32_t>> cont;
    std::vector<size_t> bytes;
    int gold = 0;
};

const nlohmann::json* first_field(const nlohmann::json& j, std::initializer_list<const char*> names) {
    for (const char* n : names) {
        auto it = j.find(n);
        if (it != j.end()) return &*it;
    }
    return nullptr;
}

class mc_task final : public eval_task {
public:
    mc_task(const model& m, const std::vector<std::string>& files, const eval_mc_opts& o, eval_on_error policy)
        : eval_task(policy) {
        if (files.empty()) ZK_THROW_PARAM("eval.data", "mc: no JSONL files given (eval.data FILE ...)");
        for (const std::string& f : files) load(m, f);
        if (o.limit > 0 && (int64_t)items_.size() > o.limit) items_.resize(o.limit);
        if (items_.empty()) ZK_THROW("mc: no usable questions in the data files");
        for (const mc_item& it : items_) {
            int64_t longest = 0;
            for (const auto& c : it.cont) longest = std::max<int64_t>(longest, (int64_t)c.size());
            max_len_ = std::max<int64_t>(max_len_, (int64_t)it.ctx.size() + longest);
            sum_len_ += (int64_t)it.ctx.size() + longest;
            chance_ += 1.0 / (double)it.cont.size() / (double)items_.size();
        }
    }

    const char* name() const override { return "mc"; }
    int64_t n_items() const override { return (int64_t)items_.size(); }
    int64_t n_ctx_needed() const override { return max_len_; }
    int64_t n_tokens_typical() const override { return sum_len_ / (int64_t)items_.size(); }

    eval_score run(session& s, bool is_baseline, eval_progress& prog) override {
        const int n_vocab = s.mdl().hp.n_vocab;
        eval_cache_meter meter;
        int64_t acc = 0, acc_norm = 0, agree = 0, agree_norm = 0;
        std::vector<std::pair<int, int>> picks(items_.size());
        for (size_t i = 0; i < items_.size(); i++) {
            const mc_item& it = items_[i];
            int best = 0, best_norm = 0;
            double best_ll = 0, best_norm_ll = 0;
            for (size_t c = 0; c < it.cont.size(); c++) {
                const std::vector<int32_t>& ct = it.cont[c];
                s.reset();
                const float* logits = s.decode(it.ctx.data(), (int64_t)it.ctx.size());
                double ll = eval_log_prob(logits, n_vocab, ct[0]);
                if (ct.size() > 1) {
                    logits = s.decode(ct.data(), (int64_t)ct.size() - 1, true);
                    for (size_t k = 1; k < ct.size(); k++)
                        ll += eval_log_prob(logits + (k - 1) * (size_t)n_vocab, n_vocab, ct[k]);
                }
                meter.note(s);
                const double norm = ll / (double)it.bytes[c];
                if (c == 0 || ll > best_ll) best_ll = ll, best = (int)c;
                if (c == 0 || norm > best_norm_ll) best_norm_ll = norm, best_norm = (int)c;
            }
            picks[i] = {best, best_norm};
            acc += best == it.gold;
            acc_norm += best_norm == it.gold;
            if (!is_baseline) {
                agree += best == base_picks_[i].first;
                agree_norm += best_norm == base_picks_[i].second;
            }
            char run[64];
            std::snprintf(run, sizeof run, "acc %.2f%%, acc_norm %.2f%%", 100.0 * acc / (double)(i + 1),
                          100.0 * acc_norm / (double)(i + 1));
            prog.update((int64_t)i + 1, run);
        }
        const double n = (double)items_.size();
        eval_score r;
        r.metric = "acc_norm";
        r.higher_is_better = true;
        r.n_items = (int64_t)items_.size();
        r.value = acc_norm / n;
        r.tokens_kept = meter.mean();
        r.detail["acc"] = acc / n;
        r.detail["acc_norm"] = acc_norm / n;
        r.detail["n_items"] = r.n_items;
        r.detail["random_chance"] = chance_;
        if (!is_baseline) {
            r.detail["same_choice_as_baseline"] = agree / n;
            r.detail["same_choice_as_baseline_norm"] = agree_norm / n;
        } else {
            base_picks_ = picks;
        }
        return r;
    }

private:
    void load(const model& m, const std::string& file) {
        std::ifstream in(file, std::ios::binary);
        if (!in) {
            issues_.report(file, 0, "cannot open the file");
            return;
        }
        std::string line;
        int64_t ln = 0, n_here = 0;
        while (std::getline(in, line)) {
            ln++;
            bool blank = true;
            for (char c : line)
                if (!std::isspace((unsigned char)c)) blank = false;
            if (blank) continue;
            n_here++;
            std::string err;
            mc_item it;
            if (parse(m, line, it, err)) {
                it.where = file + ":" + std::to_string(ln);
                items_.push_back(std::move(it));
            } else {
                issues_.report(file, ln, err);
            }
        }
        if (n_here == 0) issues_.report(file, 0, "the file is empty (no JSON lines)");
    }

    bool parse(const model& m, const std::string& line, mc_item& it, std::string& err) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
            err = std::string("not valid JSON: ") + e.what();
            return false;
        }
        if (!j.is_object()) return err = "not a JSON object", false;
        const nlohmann::json* ctx = first_field(j, {"context", "query", "question", "ctx"});
        if (!ctx || !ctx->is_string())
            return err = "no context string (fields context, query, question or ctx)", false;
        const nlohmann::json* ch = first_field(j, {"choices", "endings", "options"});
        if (!ch || !ch->is_array() || ch->size() < 2)
            return err = "no array of at least 2 choices (fields choices, endings or options)", false;
        std::vector<std::string> choices;
        for (const auto& c : *ch) {
            if (!c.is_string() || c.get<std::string>().empty())
                return err = "every choice must be a non-empty string", false;
            choices.push_back(c.get<std::string>());
        }
        const nlohmann::json* g = first_field(j, {"gold", "label", "answer"});
        if (!g) return err = "no gold answer (fields gold, label or answer)", false;
        long long gold = -1;
        if (g->is_number_integer()) {
            gold = g->get<long long>();
        } else if (g->is_string()) {
            const std::string s = g->get<std::string>();
            bool digits = !s.empty();
            for (char c : s) digits &= std::isdigit((unsigned char)c) != 0;
            if (digits && s.size() < 10) gold = std::stoll(s);
            else if (s.size() == 1 && s[0] >= 'A' && s[0] <= 'Z') gold = s[0] - 'A';
            else
                for (size_t k = 0; k < choices.size(); k++)
                    if (choices[k] == s) gold = (long long)k;
            if (gold < 0) return err = "gold answer '" + s + "' is not an index, a letter or one of the choices", false;
        } else {
            return err = "gold answer must be an integer index, a letter or a choice's text", false;
        }
        if (gold < 0 || gold >= (long long)choices.size())
            return err = "gold index " + std::to_string(gold) + " is out of range (" + std::to_string(choices.size()) +
                         " choices)", false;
        it.gold = (int)gold;
        const std::string context = ctx->get<std::string>();
        const vocab& voc = *m.voc;
        it.ctx = voc.encode(context, true, false);
        if (it.ctx.empty()) return err = "the context is empty", false;
        for (const std::string& c : choices) {
            const bool space = !context.empty() && !std::isspace((unsigned char)context.back()) &&
                               !std::isspace((unsigned char)c[0]);
            const std::string cont = (space ? " " : "") + c;
            std::vector<int32_t> whole = voc.encode(context + cont, true, false);
            std::vector<int32_t> tail;
            if (whole.size() > it.ctx.size() && std::equal(it.ctx.begin(), it.ctx.end(), whole.begin()))
                tail.assign(whole.begin() + it.ctx.size(), whole.end());
            else
                tail = voc.encode(cont, false, false);  // the boundary merged: tokenize the choice alone
            if (tail.empty()) return err = "a choice tokenizes to nothing", false;
            it.cont.push_back(std::move(tail));
            it.bytes.push_back(c.size());
        }
        return true;
    }

    std::vector<mc_item> items_;
    std::vector<std::pair<int, int>> base_picks_;
    int64_t max_len_ = 0, sum_len_ = 0;
    double chance_ = 0;  // expected accuracy of a random guess
};

}  // namespace

std::unique_ptr<eval_task> eval_task_mc(const model& m, const std::vector<std::string>& files, const eval_mc_opts& o,
                                        eval_on_error policy) {
    return std::make_unique<mc_task>(m, files, o, policy);
}

}  // namespace zk
