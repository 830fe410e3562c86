// Last-word prediction (LAMBADA-style) on real passages: each paragraph of the
// text files (blank-line separated, whitespace collapsed, cut at the last
// sentence end within max_words) is one item; the model is given the passage up
// to its final word and must produce that word greedily. The word is compared
// exactly (case-sensitive) after stripping punctuation around it.
#include <cctype>
#include <cstdio>
#include <sstream>

#include "engine/eval/eval_task.h"
#include "engine/model.h"
#include "ggml-like/error.h"

namespace zk {

namespace {

bool is_word_char(char c) { return std::isalnum((unsigned char)c) || c == '\'' || c == '-' || (c & 0x80); }

// The first word of a generated continuation ("" if it has none yet).
std::string first_word(const std::string& text, bool* complete) {
    size_t i = 0;
    while (i < text.size() && std::isspace((unsigned char)text[i])) i++;
    size_t j = i;
    while (j < text.size() && is_word_char(text[j])) j++;
    if (complete) *complete = j > i && j < text.size();
    std::string w = text.substr(i, j - i);
    while (!w.empty() && (w.back() == '\'' || w.back() == '-')) w.pop_back();
    return w;
}

bool word_done(const std::string& text) {
    bool complete = false;
    first_word(text, &complete);
    return complete;
}

struct passage {
    std::string file;
    int64_t line = 0;
    std::string context;  // the passage up to (not including) the final word
    std::string target;   // the final word
    std::vector<int32_t> tokens;
};

class lastword_task final : public eval_task {
public:
    lastword_task(const model& m, const std::vector<std::string>& files, const eval_lastword_opts& o,
                  eval_on_error policy)
        : eval_task(policy) {
        if (files.empty()) ZK_THROW_PARAM("eval.data", "lastword: no text files given (eval.data FILE ...)");
        if (o.min_words < 2 || o.max_words < o.min_words)
            ZK_THROW("lastword: need 2 <= min words <= max words, got %d and %d", o.min_words, o.max_words);
        for (const std::string& f : files) {
            const std::string text = eval_read_text(f, issues_);
            if (text.empty()) continue;
            const size_t before = items_.size();
            split(f, text, o);
            if (items_.size() == before)
                issues_.report(f, 0, "no paragraph of at least " + std::to_string(o.min_words) + " words");
        }
        if (o.limit > 0 && (int64_t)items_.size() > o.limit) items_.resize(o.limit);
        if (items_.empty()) ZK_THROW("lastword: no passages in the data files");
        for (passage& p : items_) {
            p.tokens = m.voc->encode(p.context, true, false);
            max_len_ = std::max<int64_t>(max_len_, (int64_t)p.tokens.size() + 8);
            sum_len_ += (int64_t)p.tokens.size();
        }
    }

    const char* name() const override { return "lastword"; }
    int64_t n_items() const override { return (int64_t)items_.size(); }
    int64_t n_ctx_needed() const override { return max_len_; }
    int64_t n_tokens_typical() const override { return sum_len_ / (int64_t)items_.size(); }

    eval_score run(session& s, bool is_baseline, eval_progress& prog) override {
        std::vector<std::string> preds(items_.size());
        eval_cache_meter meter;
        int64_t correct = 0, agree = 0;
        for (size_t i = 0; i < items_.size(); i++) {
            const passage& p = items_[i];
            s.reset();
            const float* logits = s.decode(p.tokens.data(), (int64_t)p.tokens.size());
            meter.note(s);
            preds[i] = first_word(eval_greedy(s, logits, 8, word_done), nullptr);
            correct += preds[i] == p.target;
            if (!is_baseline) agree += preds[i] == base_preds_[i];
            char run[64];
            std::snprintf(run, sizeof run, "acc %.2f%%", 100.0 * correct / (double)(i + 1));
            prog.update((int64_t)i + 1, run);
        }
        eval_score r = eval_accuracy_score(correct, (int64_t)items_.size(), meter.mean());
        r.detail["n_correct"] = correct;
        r.detail["n_items"] = r.n_items;
        if (!is_baseline) r.detail["same_answer_as_baseline"] = (double)agree / (double)items_.size();
        nlohmann::json ex = nlohmann::json::array();
        for (size_t i = 0; i < items_.size() && i < 5; i++)
            ex.push_back({{"where", items_[i].file + ":" + std::to_string(items_[i].line)},
                          {"target", items_[i].target}, {"predicted", preds[i]}});
        r.detail["examples"] = ex;
        if (is_baseline) base_preds_ = preds;
        return r;
    }

private:
    void split(const std::string& file, const std::string& text, const eval_lastword_opts& o) {
        std::istringstream in(text);
        std::string line, para;
        int64_t ln = 0, start = 0;
        auto flush = [&]() {
            if (!para.empty()) add(file, start, para, o);
            para.clear();
        };
        while (std::getline(in, line)) {
            ln++;
            bool blank = true;
            for (char c : line)
                if (!std::isspace((unsigned char)c)) blank = false;
            if (blank) {
                flush();
                continue;
            }
            if (para.empty()) start = ln;
            para += line;
            para += ' ';
        }
        flush();
    }

    void add(const std::string& file, int64_t line, const std::string& para, const eval_lastword_opts& o) {
        std::istringstream in(para);
        std::vector<std::string> words;
        std::string w;
        while (in >> w) words.push_back(w);
        if ((int)words.size() > o.max_words) {
            size_t cut = 0;  // the last sentence end within max_words
            for (size_t i = o.min_words - 1; i < (size_t)o.max_words; i++) {
                const char c = words[i].back();
                if (c == '.' || c == '!' || c == '?') cut = i + 1;
            }
            words.resize(cut ? cut : o.max_words);
        }
        if ((int)words.size() < o.min_words) return;
        const std::string& last = words.back();
        size_t a = 0, b = last.size();
        while (a < b && !std::isalnum((unsigned char)last[a]) && !(last[a] & 0x80)) a++;
        while (b > a && !std::isalnum((unsigned char)last[b - 1]) && !(last[b - 1] & 0x80)) b--;
        const std::string target = last.substr(a, b - a);
        bool alpha = false;
        for (char c : target) alpha |= std::isalpha((unsigned char)c) != 0;
        if (!alpha || target.size() < 2) return;
        std::string ctx;
        for (size_t i = 0; i + 1 < words.size(); i++) ctx += (i ? " " : "") + words[i];
        if (a > 0) ctx += " " + last.substr(0, a);  // an opening quote or bracket stays in the context
        items_.push_back({file, line, ctx, target, {}});
    }

    std::vector<passage> items_;
    std::vector<std::string> base_preds_;
    int64_t max_len_ = 0, sum_len_ = 0;
};

}  // namespace

std::unique_ptr<eval_task> eval_task_lastword(const model& m, const std::vector<std::string>& files,
                                              const eval_lastword_opts& o, eval_on_error policy) {
    return std::make_unique<lastword_task>(m, files, o, policy);
}

}  // namespace zk
